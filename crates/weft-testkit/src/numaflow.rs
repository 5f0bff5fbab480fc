//! A test-only Numaflow: its pipeline and vertex controllers as upstream writes them (numaproj/numaflow
//! HEAD 63ba4e8, `pkg/reconciler/pipeline/controller.go` `buildVertices`, `pkg/reconciler/vertex/controller.go`
//! `orchestratePodsFromTo`, `pkg/apis/numaflow/v1alpha1/vertex_types.go` `GetPodSpec`), reduced to what
//! decides where weft's wiring ends up, over the fake API server:
//!
//! - **Pipeline → Vertex**: one Vertex `<pipeline>-<vertex>` per `spec.vertices[]`, labelled with the
//!   pipeline and vertex names, owned by the Pipeline, whose spec is the vertex *as Numaflow's Go types
//!   decode it* (only the fields `AbstractVertex`, `AbstractPodTemplate`, `UDF`/`UDSink`/`UDSource` and
//!   `Container` declare survive; anything else is dropped, as Go's JSON decoding drops it),
//!   `spec.templates.vertex` merged in as mergo does (empty fields filled, annotation and label maps
//!   merged), plus `pipelineName`, `fromEdges`/`toEdges` and `replicas` (1, clamped to `scale`).
//! - **Vertex → pods**: for each replica a pod `<vertex>-<replica>-<5 chars>` with the vertex's
//!   `metadata.annotations`/`labels` copied, Numaflow's labels (`numaflow.numaproj.io/pipeline-name`,
//!   `vertex-name`, …) and annotations (hash, replica, default container); `spec.resourceClaims` from the
//!   vertex (`ApplyToPodSpec`); the user container built from `udf.container` / `sink.udsink.container` /
//!   `source.udsource.container` (image, command, args, env, resources including claims, volume mounts),
//!   as a native sidecar (Kubernetes ≥ 1.29: an init container with `restartPolicy: Always`), with
//!   Numaflow's own environment appended in upstream's order; the `numa` main container and `init`.
//!
//! Left out (they do not touch weft's fields): the ISB service and buffers, daemon and side-input
//! deployments, services, probes, PVCs, scaling, lifecycle (pause), limits merging.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::pin::pin;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, PostParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde_json::{Map, Value, json};
use tokio::task::JoinHandle;

pub const GROUP: &str = "numaflow.numaproj.io";
pub const VERSION: &str = "v1alpha1";
/// The image of Numaflow's own containers (`numa`, `init`).
pub const IMAGE: &str = "quay.io/numaproj/numaflow:v1.6.0";

const KEY_HASH: &str = "numaflow.numaproj.io/hash";
const KEY_REPLICA: &str = "numaflow.numaproj.io/replica";
const KEY_PIPELINE_NAME: &str = "numaflow.numaproj.io/pipeline-name";
const KEY_VERTEX_NAME: &str = "numaflow.numaproj.io/vertex-name";
const KEY_DEFAULT_CONTAINER: &str = "kubectl.kubernetes.io/default-container";

pub fn pipelines() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, VERSION, "Pipeline"), "pipelines")
}

pub fn vertices() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, VERSION, "Vertex"), "vertices")
}

// ----- what Go's types keep -----

/// `AbstractVertex` with `AbstractPodTemplate` inlined.
const ABSTRACT_VERTEX: &[&str] = &[
    "name",
    "source",
    "sink",
    "udf",
    "containerTemplate",
    "initContainerTemplate",
    "volumes",
    "limits",
    "scale",
    "initContainers",
    "sidecars",
    "partitions",
    "sideInputs",
    "sideInputsContainerTemplate",
    "updateStrategy",
    "ordered",
    "metadata",
    "nodeSelector",
    "tolerations",
    "securityContext",
    "imagePullSecrets",
    "priorityClassName",
    "priority",
    "affinity",
    "serviceAccountName",
    "runtimeClassName",
    "automountServiceAccountToken",
    "dnsPolicy",
    "dnsConfig",
    "resourceClaims",
];
/// `AbstractPodTemplate`: what `spec.templates.vertex` contributes and `ApplyToPodSpec` copies.
const ABSTRACT_POD_TEMPLATE: &[&str] = &[
    "metadata",
    "nodeSelector",
    "tolerations",
    "securityContext",
    "imagePullSecrets",
    "priorityClassName",
    "priority",
    "affinity",
    "serviceAccountName",
    "runtimeClassName",
    "automountServiceAccountToken",
    "dnsPolicy",
    "dnsConfig",
    "resourceClaims",
];
/// Numaflow's `Container`.
const CONTAINER: &[&str] = &[
    "image",
    "command",
    "args",
    "env",
    "envFrom",
    "volumeMounts",
    "resources",
    "securityContext",
    "imagePullPolicy",
    "readinessProbe",
    "livenessProbe",
    "ports",
];

/// `PipelineSpec` (`pipeline_types.go`).
const PIPELINE_SPEC: &[&str] = &[
    "interStepBufferServiceName",
    "vertices",
    "edges",
    "lifecycle",
    "limits",
    "watermark",
    "templates",
    "sideInputs",
    "interStepBuffer",
    "ordered",
];
/// `Edge` (`edge_types.go`).
const EDGE: &[&str] = &["from", "to", "conditions", "onFull"];

/// A Pipeline CRD object as the API server serves it: Numaflow's full CRD (`config/base/crds/full`)
/// reduced to the part that decides `spec.edges[]` (the Go `Edge` type's fields, nothing preserved),
/// or its minimal CRD (`config/base/crds/minimal`: `spec` keeps unknown fields).
pub fn pipeline_crd(full: bool) -> Value {
    let spec = if full {
        let edge: Map<String, Value> = EDGE.iter().map(|f| (f.to_string(), json!({}))).collect();
        json!({"type": "object", "properties": {
            "edges": {"type": "array", "items": {"type": "object", "required": ["from", "to"], "properties": edge}},
            "vertices": {"type": "array", "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
        }})
    } else {
        json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true})
    };
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("pipelines.{GROUP}")},
        "spec": {
            "group": GROUP, "scope": "Namespaced",
            "names": {"kind": "Pipeline", "listKind": "PipelineList", "plural": "pipelines", "singular": "pipeline", "shortNames": ["pl"]},
            "versions": [{"name": VERSION, "served": true, "storage": true, "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "required": ["spec"], "properties": {
                    "apiVersion": {"type": "string"}, "kind": {"type": "string"}, "metadata": {"type": "object"},
                    "spec": spec,
                    "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}}}],
        },
    })
}

/// Drops the keys of the object at `v` that `fields` does not declare, noting each as `at.key`.
fn prune_at(v: &mut Value, fields: &[&str], at: &str, pruned: &mut Vec<String>) {
    if let Value::Object(m) = v {
        m.retain(|k, _| {
            let keep = fields.contains(&k.as_str());
            if !keep {
                pruned.push(format!("{at}.{k}"));
            }
            keep
        });
    }
}

/// A Pipeline as the API server stores it when the cluster serves Numaflow's full Pipeline CRD
/// (`config/base/crds/full`, the one `config/install.yaml` installs): a structural schema generated
/// by controller-gen from the Go types, with no `x-kubernetes-preserve-unknown-fields`, so every
/// field the Go types do not declare is pruned, from the request and again from a mutating
/// webhook's result. Pruned here, where weft reads or writes: `spec`, `spec.edges[]`,
/// `spec.vertices[]`, a vertex's `metadata` and its user container. Returns the object and the
/// paths pruned.
pub fn prune_as_full_crd(pipeline: &Value) -> (Value, Vec<String>) {
    let mut out = pipeline.clone();
    let mut pruned = Vec::new();
    let Some(spec) = out.get_mut("spec") else { return (out, pruned) };
    prune_at(spec, PIPELINE_SPEC, "spec", &mut pruned);
    if let Some(edges) = spec.get_mut("edges").and_then(Value::as_array_mut) {
        for (i, e) in edges.iter_mut().enumerate() {
            prune_at(e, EDGE, &format!("spec.edges[{i}]"), &mut pruned);
        }
    }
    if let Some(vertices) = spec.get_mut("vertices").and_then(Value::as_array_mut) {
        for (i, v) in vertices.iter_mut().enumerate() {
            let at = format!("spec.vertices[{i}]");
            prune_at(v, ABSTRACT_VERTEX, &at, &mut pruned);
            if let Some(m) = v.get_mut("metadata") {
                prune_at(m, &["annotations", "labels"], &format!("{at}.metadata"), &mut pruned);
            }
            for (kind, user) in [("udf", None), ("sink", Some("udsink")), ("source", Some("udsource"))] {
                let holder = match user {
                    None => v.get_mut(kind),
                    Some(u) => v.get_mut(kind).and_then(|k| k.get_mut(u)),
                };
                if let Some(c) = holder.and_then(|h| h.get_mut("container")) {
                    let path = format!("{at}.{kind}{}.container", user.map(|u| format!(".{u}")).unwrap_or_default());
                    prune_at(c, CONTAINER, &path, &mut pruned);
                }
            }
        }
    }
    (out, pruned)
}

fn keep(v: &Value, fields: &[&str]) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter().filter(|(k, _)| fields.contains(&k.as_str())).map(|(k, v)| (k.clone(), v.clone())).collect(),
        ),
        other => other.clone(),
    }
}

/// A vertex as `AbstractVertex` decodes it.
fn decode_vertex(v: &Value) -> Value {
    let mut out = keep(v, ABSTRACT_VERTEX);
    if let Some(m) = out.get_mut("metadata") {
        *m = keep(m, &["annotations", "labels"]);
    }
    if let Some(udf) = out.get_mut("udf") {
        *udf = keep(udf, &["container", "groupBy", "retryStrategy"]);
        if let Some(c) = udf.get_mut("container") {
            *c = keep(c, CONTAINER);
        }
    }
    for (kind, user) in [("sink", "udsink"), ("source", "udsource")] {
        if let Some(c) = out.get_mut(kind).and_then(|k| k.get_mut(user)).and_then(|u| u.get_mut("container")) {
            *c = keep(c, CONTAINER);
        }
    }
    out
}

fn is_empty(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null) => true,
        Some(Value::Array(a)) => a.is_empty(),
        Some(Value::Object(o)) => o.is_empty(),
        Some(Value::String(s)) => s.is_empty(),
        _ => false,
    }
}

/// `copyVertexTemplate`: mergo.Merge of `spec.templates.vertex`'s pod template into the vertex.
fn copy_vertex_template(pipeline: &Value, vertex: &mut Value) {
    let Some(Value::Object(template)) = pipeline.pointer("/spec/templates/vertex") else { return };
    let v = vertex.as_object_mut().unwrap();
    for key in ABSTRACT_POD_TEMPLATE {
        let Some(t) = template.get(*key) else { continue };
        if is_empty(v.get(*key)) {
            v.insert((*key).to_owned(), t.clone());
        } else if *key == "metadata" {
            for map in ["annotations", "labels"] {
                if let Some(Value::Object(tm)) = t.get(map) {
                    let dst = v["metadata"].as_object_mut().unwrap().entry(map).or_insert_with(|| json!({}));
                    for (k, val) in tm {
                        dst.as_object_mut().unwrap().entry(k.clone()).or_insert_with(|| val.clone());
                    }
                }
            }
        }
    }
}

fn hash(v: &Value) -> String {
    let mut h = DefaultHasher::new();
    v.to_string().hash(&mut h);
    format!("{:016x}", h.finish())
}

/// `buildVertices`.
pub fn build_vertices(pl: &Value) -> Vec<Value> {
    let name = pl["metadata"]["name"].as_str().unwrap();
    let namespace = pl["metadata"]["namespace"].as_str().unwrap();
    let edges = pl["spec"]["edges"].as_array().cloned().unwrap_or_default();
    let mut out = Vec::new();
    for v in pl["spec"]["vertices"].as_array().into_iter().flatten() {
        let vname = v["name"].as_str().unwrap();
        let mut spec = decode_vertex(v);
        copy_vertex_template(pl, &mut spec);
        // Edge has from, to, conditions, onFull: the proposal's numaNetwork is not a Go field.
        let edge = |e: &Value| keep(e, &["from", "to", "conditions", "onFull"]);
        let from: Vec<Value> = edges.iter().filter(|e| e["to"] == vname).map(edge).collect();
        let to: Vec<Value> = edges.iter().filter(|e| e["from"] == vname).map(edge).collect();
        let min = v.pointer("/scale/min").and_then(Value::as_i64).unwrap_or(0);
        let max = v.pointer("/scale/max").and_then(Value::as_i64).unwrap_or(50);
        let replicas = 1i64.max(min).min(max);
        let s = spec.as_object_mut().unwrap();
        s.insert("pipelineName".into(), json!(name));
        s.insert("interStepBufferServiceName".into(), pl["spec"]["interStepBufferServiceName"].clone());
        s.insert("fromEdges".into(), json!(from));
        s.insert("toEdges".into(), json!(to));
        let hashed = hash(&spec);
        spec["replicas"] = json!(replicas);
        out.push(json!({
            "apiVersion": format!("{GROUP}/{VERSION}"), "kind": "Vertex",
            "metadata": {
                "name": format!("{name}-{vname}"), "namespace": namespace,
                "labels": {"app.kubernetes.io/managed-by": "pipeline-controller", "app.kubernetes.io/component": "vertex",
                    "app.kubernetes.io/part-of": "numaflow", KEY_PIPELINE_NAME: name, KEY_VERTEX_NAME: vname},
                "annotations": {KEY_HASH: hashed},
                "ownerReferences": [{"apiVersion": format!("{GROUP}/{VERSION}"), "kind": "Pipeline", "name": name,
                    "uid": pl["metadata"]["uid"], "controller": true, "blockOwnerDeletion": true}]
            },
            "spec": spec
        }));
    }
    out
}

/// `Vertex.commonEnvs`.
fn common_envs(vertex: &Value) -> Vec<Value> {
    let field = |p: &str| json!({"fieldRef": {"fieldPath": p}});
    let resource = |r: &str| json!({"resourceFieldRef": {"resource": r}});
    vec![
        json!({"name": "NUMAFLOW_NAMESPACE", "valueFrom": field("metadata.namespace")}),
        json!({"name": "NUMAFLOW_POD", "valueFrom": field("metadata.name")}),
        json!({"name": "NUMAFLOW_REPLICA", "valueFrom": field(&format!("metadata.annotations['{KEY_REPLICA}']"))}),
        json!({"name": "NUMAFLOW_PIPELINE_NAME", "value": vertex["spec"]["pipelineName"]}),
        json!({"name": "NUMAFLOW_VERTEX_NAME", "value": vertex["spec"]["name"]}),
        json!({"name": "NUMAFLOW_CPU_LIMIT", "valueFrom": resource("limits.cpu")}),
        json!({"name": "NUMAFLOW_CPU_REQUEST", "valueFrom": resource("requests.cpu")}),
        json!({"name": "NUMAFLOW_MEMORY_LIMIT", "valueFrom": resource("limits.memory")}),
        json!({"name": "NUMAFLOW_MEMORY_REQUEST", "valueFrom": resource("requests.memory")}),
    ]
}

fn base_mounts() -> Vec<Value> {
    vec![
        json!({"name": "var-run-numaflow", "mountPath": "/var/run/numaflow"}),
        json!({"name": "runtime-vol", "mountPath": "/var/numaflow/runtime"}),
    ]
}

/// The user container (`getUDFContainer`, `getUDSinkContainer`, `getUDSourceContainer`), as a sidecar.
fn user_container(vertex: &Value) -> Option<(&'static str, Value)> {
    let spec = &vertex["spec"];
    let (name, x, type_first) = if let Some(c) = spec.pointer("/udf/container") {
        ("udf", c, false)
    } else if let Some(c) = spec.pointer("/sink/udsink/container") {
        ("udsink", c, true)
    } else if let Some(c) = spec.pointer("/source/udsource/container") {
        ("udsource", c, true)
    } else {
        return None;
    };
    let mut c = json!({"name": name, "image": x["image"], "restartPolicy": "Always"});
    for k in ["command", "args"] {
        if !is_empty(x.get(k)) {
            c[k] = x[k].clone();
        }
    }
    let type_env = json!({"name": "NUMAFLOW_UD_CONTAINER_TYPE", "value": name});
    let mut env: Vec<Value> = Vec::new();
    if type_first {
        env.push(type_env.clone());
    }
    env.extend(x["env"].as_array().cloned().unwrap_or_default());
    if !type_first {
        env.push(type_env);
    }
    env.extend(common_envs(vertex));
    if name == "udsource" {
        env.push(json!({"name": "NUMAFLOW_READ_BATCH_SIZE", "value": "500"}));
        env.push(json!({"name": "NUMAFLOW_READ_TIMEOUT_MS", "value": "1000"}));
    }
    c["env"] = json!(env);
    let mut mounts = base_mounts();
    mounts.extend(x["volumeMounts"].as_array().cloned().unwrap_or_default());
    c["volumeMounts"] = json!(mounts);
    if !is_empty(x.get("resources")) {
        c["resources"] = x["resources"].clone();
    }
    if !is_empty(x.get("envFrom")) {
        c["envFrom"] = x["envFrom"].clone();
    }
    Some((name, c))
}

/// The pod of `replica` (`orchestratePodsFromTo` with `GetPodSpec` and `ApplyToPodSpec`).
pub fn build_pod(vertex: &Value, replica: i64) -> Value {
    let spec = &vertex["spec"];
    let vname = vertex["metadata"]["name"].as_str().unwrap();
    let hashed = vertex["metadata"]["annotations"][KEY_HASH].as_str().unwrap_or_default();
    let mut labels = spec.pointer("/metadata/labels").and_then(Value::as_object).cloned().unwrap_or_default();
    let mut annotations = spec.pointer("/metadata/annotations").and_then(Value::as_object).cloned().unwrap_or_default();
    for (k, v) in [
        ("app.kubernetes.io/part-of", "numaflow"),
        ("app.kubernetes.io/managed-by", "vertex-controller"),
        ("app.kubernetes.io/component", "vertex"),
        ("app.kubernetes.io/name", vname),
        (KEY_PIPELINE_NAME, spec["pipelineName"].as_str().unwrap()),
        (KEY_VERTEX_NAME, spec["name"].as_str().unwrap()),
    ] {
        labels.insert(k.into(), json!(v));
    }
    annotations.insert(KEY_HASH.into(), json!(hashed));
    annotations.insert(KEY_REPLICA.into(), json!(replica.to_string()));
    let user = user_container(vertex);
    if let Some((name, _)) = &user {
        annotations.insert(KEY_DEFAULT_CONTAINER.into(), json!(name));
    }
    let mut main_env = vec![json!({"name": "NUMAFLOW_READ_AHEAD", "value": "true"})];
    main_env.extend(common_envs(vertex));
    let main = json!({"name": "numa", "image": IMAGE, "env": main_env, "volumeMounts": base_mounts(),
        "args": ["processor", "--isbsvc-type=jetstream"]});
    let init = json!({"name": "init", "image": IMAGE, "args": ["isbsvc-validate", "--isbsvc-type=jetstream"],
        "env": [{"name": "NUMAFLOW_PIPELINE_NAME", "value": spec["pipelineName"]}]});
    let mut init_containers = vec![init];
    init_containers.extend(user.map(|(_, c)| c));
    init_containers.extend(spec["initContainers"].as_array().cloned().unwrap_or_default());
    let mut containers = vec![main];
    containers.extend(spec["sidecars"].as_array().cloned().unwrap_or_default());
    let mut volumes = vec![
        json!({"name": "var-run-numaflow", "emptyDir": {"medium": "Memory"}}),
        json!({"name": "runtime-vol", "emptyDir": {"sizeLimit": "20Mi"}}),
    ];
    volumes.extend(spec["volumes"].as_array().cloned().unwrap_or_default());
    let mut pod_spec = Map::new();
    pod_spec.insert("subdomain".into(), json!(format!("{vname}-headless")));
    pod_spec.insert("hostname".into(), json!(format!("{vname}-{replica}")));
    pod_spec.insert("volumes".into(), json!(volumes));
    pod_spec.insert("initContainers".into(), json!(init_containers));
    pod_spec.insert("containers".into(), json!(containers));
    // ApplyToPodSpec: the pod-level fields of the vertex, resourceClaims among them.
    for key in ABSTRACT_POD_TEMPLATE.iter().filter(|k| **k != "metadata") {
        if !is_empty(spec.get(*key)) {
            pod_spec.insert((*key).to_owned(), spec[*key].clone());
        }
    }
    let suffix: String = hash(&json!([vname, replica, hashed]))
        .chars()
        .filter(char::is_ascii_lowercase)
        .chain("abcde".chars())
        .take(5)
        .collect();
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": format!("{vname}-{replica}-{suffix}"), "namespace": vertex["metadata"]["namespace"],
            "labels": labels, "annotations": annotations,
            "ownerReferences": [{"apiVersion": format!("{GROUP}/{VERSION}"), "kind": "Vertex", "name": vname,
                "uid": vertex["metadata"]["uid"], "controller": true, "blockOwnerDeletion": true}]
        },
        "spec": pod_spec
    })
}

fn dynamic(v: Value) -> DynamicObject {
    serde_json::from_value(v).unwrap()
}

async fn reconcile_pipeline(client: &Client, pl: DynamicObject) -> Result<(), kube::Error> {
    let pl = serde_json::to_value(&pl).unwrap();
    let namespace = pl["metadata"]["namespace"].as_str().unwrap().to_owned();
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &namespace, &vertices());
    for v in build_vertices(&pl) {
        let name = v["metadata"]["name"].as_str().unwrap().to_owned();
        match api.get_opt(&name).await? {
            None => {
                api.create(&PostParams::default(), &dynamic(v)).await?;
            }
            Some(existing)
                if existing.annotations().get(KEY_HASH).map(String::as_str)
                    != v["metadata"]["annotations"][KEY_HASH].as_str() =>
            {
                let mut updated = v.clone();
                updated["metadata"]["resourceVersion"] = json!(existing.resource_version());
                api.replace(&name, &PostParams::default(), &dynamic(updated)).await?;
            }
            Some(_) => {}
        }
    }
    Ok(())
}

async fn reconcile_vertex(client: &Client, vertex: DynamicObject) -> Result<(), kube::Error> {
    let vertex = serde_json::to_value(&vertex).unwrap();
    let namespace = vertex["metadata"]["namespace"].as_str().unwrap().to_owned();
    let name = vertex["metadata"]["name"].as_str().unwrap().to_owned();
    let hashed = vertex["metadata"]["annotations"][KEY_HASH].as_str().unwrap_or_default().to_owned();
    let pods: Api<DynamicObject> = Api::namespaced_with(client.clone(), &namespace, &ApiResource::erase::<Pod>(&()));
    let selector = format!(
        "{KEY_PIPELINE_NAME}={},{KEY_VERTEX_NAME}={}",
        vertex["spec"]["pipelineName"].as_str().unwrap(),
        vertex["spec"]["name"].as_str().unwrap()
    );
    let existing = pods.list(&ListParams::default().labels(&selector)).await?.items;
    let replicas = vertex["spec"]["replicas"].as_i64().unwrap_or(1);
    let mut keep: Vec<String> = Vec::new();
    for replica in 0..replicas {
        let prefix = format!("{name}-{replica}-");
        let current = existing.iter().find(|p| {
            p.name_any().starts_with(&prefix)
                && p.annotations().get(KEY_HASH).map(String::as_str) == Some(hashed.as_str())
        });
        match current {
            Some(p) => keep.push(p.name_any()),
            None => {
                let pod = build_pod(&vertex, replica);
                keep.push(pod["metadata"]["name"].as_str().unwrap().to_owned());
                pods.create(&PostParams::default(), &dynamic(pod)).await?;
            }
        }
    }
    for p in existing.iter().filter(|p| !keep.contains(&p.name_any())) {
        pods.delete(&p.name_any(), &Default::default()).await?;
    }
    Ok(())
}

/// The two controllers, running until dropped.
pub struct Numaflow {
    tasks: Vec<JoinHandle<()>>,
}

impl Numaflow {
    pub fn start(client: Client) -> Numaflow {
        let mut tasks = Vec::new();
        for (resource, is_pipeline) in [(pipelines(), true), (vertices(), false)] {
            let client = client.clone();
            tasks.push(tokio::spawn(async move {
                let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
                let stream = watcher::watcher(api, watcher::Config::default()).default_backoff().applied_objects();
                let mut stream = pin!(stream);
                while let Some(object) = stream.next().await {
                    let Ok(object) = object else { continue };
                    let done = if is_pipeline {
                        reconcile_pipeline(&client, object).await
                    } else {
                        reconcile_vertex(&client, object).await
                    };
                    if let Err(e) = done {
                        eprintln!("numaflow peer: {e}");
                    }
                }
            }));
        }
        Numaflow { tasks }
    }
}

impl Drop for Numaflow {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}
