//! The fake server's REST semantics, exercised through a real kube `Client`.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use common::{api_error, cm, labels, node, pod, within};
use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, DeploymentStatus};
use k8s_openapi::api::core::v1::{ConfigMap, Node, NodeStatus, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, ObjectMeta, Patch, PatchParams,
    PostParams, Preconditions,
};
use serde_json::json;
use weft_fakeapi::{FakeApiServer, RequestMatcher, ResourceSpec, Verb};

#[tokio::test]
async fn crud_round_trip_namespaced() {
    let server = FakeApiServer::start().await;
    let api: Api<ConfigMap> = Api::namespaced(server.client(), "default");

    let created = within(api.create(&PostParams::default(), &cm("a", &[("k", "v")]))).await.unwrap();
    let meta = &created.metadata;
    assert!(meta.uid.as_deref().is_some_and(|u| u.len() == 36));
    assert_eq!(meta.generation, Some(1));
    assert_eq!(meta.namespace.as_deref(), Some("default"));
    assert!(meta.creation_timestamp.is_some());
    let rv1: u64 = meta.resource_version.as_deref().unwrap().parse().unwrap();
    assert_eq!(rv1, server.resource_version());

    let got = within(api.get("a")).await.unwrap();
    assert_eq!(got.data.as_ref().unwrap()["k"], "v");

    let mut changed = got.clone();
    changed.data = Some([("k".to_owned(), "w".to_owned())].into());
    let replaced = within(api.replace("a", &PostParams::default(), &changed)).await.unwrap();
    assert_eq!(replaced.data.as_ref().unwrap()["k"], "w");
    assert!(replaced.metadata.resource_version.as_deref().unwrap().parse::<u64>().unwrap() > rv1);
    assert_eq!(replaced.metadata.uid, created.metadata.uid);

    let list = within(api.list(&ListParams::default())).await.unwrap();
    assert_eq!(list.items.len(), 1);
    assert_eq!(list.metadata.resource_version, Some(server.resource_version().to_string()));

    let deleted = within(api.delete("a", &DeleteParams::default())).await.unwrap();
    assert!(deleted.is_left());
    assert_eq!(api_error(within(api.get("a")).await), (404, "NotFound".to_owned()));
    assert!(server.get("configmaps", Some("default"), "a").is_none());
}

#[tokio::test]
async fn crud_round_trip_cluster_scoped_and_generate_name() {
    let server = FakeApiServer::start().await;
    let nodes: Api<Node> = Api::all(server.client());
    within(nodes.create(&PostParams::default(), &node("n1", &[("gpu", "true")]))).await.unwrap();
    let mut generated = node("", &[]);
    generated.metadata.name = None;
    generated.metadata.generate_name = Some("gpu-".into());
    let g = within(nodes.create(&PostParams::default(), &generated)).await.unwrap();
    let name = g.metadata.name.unwrap();
    assert!(name.starts_with("gpu-") && name.len() == 9, "{name}");
    assert_eq!(server.list("nodes", None).len(), 2);
    let typed: Option<Node> = server.get_typed(None, "n1").unwrap();
    assert_eq!(typed.unwrap().metadata.labels, labels(&[("gpu", "true")]));
    within(nodes.delete("n1", &DeleteParams::default())).await.unwrap();
    assert_eq!(server.list_typed::<Node>(None).unwrap().len(), 1);
}

#[tokio::test]
async fn errors_are_status_bodies_with_code_and_reason() {
    let server = FakeApiServer::start().await;
    let api: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    match within(api.get("missing")).await {
        Err(kube::Error::Api(s)) => {
            assert_eq!((s.code, s.reason.as_str()), (404, "NotFound"));
            assert_eq!(s.message, "configmaps \"missing\" not found");
            let details = s.details.as_ref().unwrap();
            assert_eq!((details.name.as_str(), details.kind.as_str()), ("missing", "configmaps"));
        }
        other => panic!("{other:?}"),
    }
    within(api.create(&PostParams::default(), &cm("a", &[]))).await.unwrap();
    assert_eq!(
        api_error(within(api.create(&PostParams::default(), &cm("a", &[]))).await),
        (409, "AlreadyExists".into())
    );
    // A missing name is Invalid.
    let mut unnamed = cm("x", &[]);
    unnamed.metadata.name = None;
    assert_eq!(api_error(within(api.create(&PostParams::default(), &unnamed)).await), (422, "Invalid".into()));
    // Unknown resources are 404.
    let ar = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("nope.io", "v1", "Thing"), "things");
    let things: Api<DynamicObject> = Api::namespaced_with(server.client(), "default", &ar);
    assert_eq!(api_error(within(things.list(&ListParams::default())).await), (404, "NotFound".into()));
}

#[tokio::test]
async fn bad_bodies_are_400_not_panics() {
    let server = FakeApiServer::start().await;
    let http = raw_http(&server);
    let (code, body) =
        http.send("POST", "/api/v1/namespaces/default/configmaps", "application/json", "{not json").await;
    assert_eq!(code, 400);
    assert_eq!(body["reason"], "BadRequest");
    assert!(body["message"].as_str().unwrap().contains("invalid JSON"));
    let (code, _) = http.send("POST", "/api/v1/namespaces/default/configmaps", "application/json", "[1]").await;
    assert_eq!(code, 400);
    server.insert(json!({ "apiVersion": "v1", "kind": "ConfigMap", "metadata": { "name": "a" } })).unwrap();
    let (code, body) = http
        .send("PATCH", "/api/v1/namespaces/default/configmaps/a", "application/json-patch+json", "{\"op\":1}")
        .await;
    assert_eq!((code, body["reason"].as_str()), (400, Some("BadRequest")));
    let (code, body) = http.send("PATCH", "/api/v1/namespaces/default/configmaps/a", "text/plain", "{}").await;
    assert_eq!((code, body["reason"].as_str()), (415, Some("UnsupportedMediaType")));
    let (code, _) = http.send("GET", "/api/v1/namespaces/default/configmaps?labelSelector=a+in+(b", "", "").await;
    assert_eq!(code, 400);
    let (code, _) = http.send("GET", "/api/v1/namespaces/default/configmaps?limit=x", "", "").await;
    assert_eq!(code, 400);
    let (code, body) = http.send("GET", "/version", "", "").await;
    assert_eq!((code, body["major"].as_str()), (200, Some("1")));
    let (code, body) = http.send("GET", "/apis", "", "").await;
    assert_eq!(code, 200);
    assert!(body["groups"].as_array().unwrap().iter().any(|g| g["name"] == "coordination.k8s.io"));
    let (code, body) = http.send("GET", "/api/v1", "", "").await;
    assert_eq!(code, 200);
    assert!(body["resources"].as_array().unwrap().iter().any(|r| r["name"] == "nodes/status"));
}

/// Sends hand-made requests (bad bodies, odd content types) through kube's client transport.
struct RawHttp {
    client: kube::Client,
}

fn raw_http(server: &FakeApiServer) -> RawHttp {
    RawHttp { client: server.client() }
}

impl RawHttp {
    async fn send(&self, method: &str, path: &str, content_type: &str, body: &str) -> (u16, serde_json::Value) {
        let mut req = http::Request::builder().method(method).uri(path);
        if !content_type.is_empty() {
            req = req.header("content-type", content_type);
        }
        let req = req.body(kube::client::Body::from(body.as_bytes().to_vec())).unwrap();
        let resp = within(self.client.send(req)).await.unwrap();
        let code = resp.status().as_u16();
        let bytes = within(http_body_util::BodyExt::collect(resp.into_body())).await.unwrap().to_bytes();
        (code, serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null))
    }
}

#[tokio::test]
async fn label_and_field_selectors() {
    let server = FakeApiServer::start().await;
    let client = server.client();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let other: Api<Pod> = Api::namespaced(client.clone(), "other");
    for (api, name, node, app, tier) in [
        (&pods, "p1", Some("n1"), "web", "front"),
        (&pods, "p2", None, "web", "back"),
        (&pods, "p3", Some("n2"), "db", "back"),
        (&other, "p4", Some("n1"), "web", "front"),
    ] {
        within(api.create(&PostParams::default(), &pod(name, node, &[("app", app), ("tier", tier)]))).await.unwrap();
    }
    let names = |l: kube::core::ObjectList<Pod>| -> Vec<String> {
        l.items.into_iter().map(|p| p.metadata.name.unwrap()).collect()
    };
    let q = |lp: ListParams| {
        let pods = pods.clone();
        async move { names(within(pods.list(&lp)).await.unwrap()) }
    };
    assert_eq!(q(ListParams::default().labels("app=web")).await, ["p1", "p2"]);
    assert_eq!(q(ListParams::default().labels("app==web,tier!=front")).await, ["p2"]);
    assert_eq!(q(ListParams::default().labels("tier in (front,back),app notin (db)")).await, ["p1", "p2"]);
    assert_eq!(q(ListParams::default().labels("!tier")).await, Vec::<String>::new());
    assert_eq!(q(ListParams::default().labels("tier")).await, ["p1", "p2", "p3"]);
    assert_eq!(q(ListParams::default().fields("spec.nodeName!=")).await, ["p1", "p3"]);
    assert_eq!(q(ListParams::default().fields("spec.nodeName=")).await, ["p2"]);
    assert_eq!(q(ListParams::default().fields("spec.nodeName==n1")).await, ["p1"]);
    assert_eq!(q(ListParams::default().fields("metadata.name=p3")).await, ["p3"]);
    assert_eq!(q(ListParams::default().fields("status.phase=Pending,metadata.namespace=default")).await.len(), 3);
    // Cluster-wide list of a namespaced resource.
    let all: Api<Pod> = Api::all(client);
    let every = names(within(all.list(&ListParams::default().fields("spec.nodeName=n1"))).await.unwrap());
    assert_eq!(every, ["p1", "p4"]);
}

#[tokio::test]
async fn paging_with_limit_and_continue() {
    let server = FakeApiServer::start().await;
    let api: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    for i in 0..5 {
        within(api.create(&PostParams::default(), &cm(&format!("c{i}"), &[]))).await.unwrap();
    }
    let first = within(api.list(&ListParams::default().limit(2))).await.unwrap();
    assert_eq!(first.items.len(), 2);
    assert_eq!(first.metadata.remaining_item_count, Some(3));
    let token = first.metadata.continue_.clone().unwrap();
    let second = within(api.list(&ListParams::default().limit(2).continue_token(&token))).await.unwrap();
    assert_eq!(second.metadata.resource_version, first.metadata.resource_version);
    let third =
        within(api.list(&ListParams::default().limit(2).continue_token(second.metadata.continue_.as_ref().unwrap())))
            .await
            .unwrap();
    assert!(third.metadata.continue_.is_none());
    let all: Vec<String> =
        [first, second, third].into_iter().flat_map(|l| l.items).map(|c| c.metadata.name.unwrap()).collect();
    assert_eq!(all, ["c0", "c1", "c2", "c3", "c4"]);
}

#[tokio::test]
async fn stale_resource_version_conflicts_for_put_and_merge_patch() {
    let server = FakeApiServer::start().await;
    let api: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    let created = within(api.create(&PostParams::default(), &cm("a", &[("k", "1")]))).await.unwrap();
    let old_rv = created.metadata.resource_version.clone().unwrap();
    // A second writer bumps the object behind the client's back.
    server.touch("configmaps", Some("default"), "a").unwrap();

    let pp = PostParams::default();
    match within(api.replace("a", &pp, &created)).await {
        Err(kube::Error::Api(s)) => {
            assert_eq!((s.code, s.reason.as_str()), (409, "Conflict"));
            assert!(s.message.contains("the object has been modified"), "{}", s.message);
        }
        other => panic!("{other:?}"),
    }
    let patch = json!({ "metadata": { "resourceVersion": old_rv }, "data": { "k": "2" } });
    let r = within(api.patch("a", &PatchParams::default(), &Patch::Merge(&patch))).await;
    assert_eq!(api_error(r), (409, "Conflict".into()));
    // Without a resourceVersion both are unconditional.
    let mut unconditional = created.clone();
    unconditional.metadata.resource_version = None;
    unconditional.data = Some([("k".to_owned(), "3".to_owned())].into());
    within(api.replace("a", &PostParams::default(), &unconditional)).await.unwrap();
    let patch = json!({ "data": { "k": "4" } });
    let out = within(api.patch("a", &PatchParams::default(), &Patch::Merge(&patch))).await.unwrap();
    assert_eq!(out.data.unwrap()["k"], "4");
    // A current resourceVersion passes.
    let patch = json!({ "metadata": { "resourceVersion": out.metadata.resource_version }, "data": { "k": "5" } });
    within(api.patch("a", &PatchParams::default(), &Patch::Merge(&patch))).await.unwrap();
}

#[tokio::test]
async fn json_patch_and_failed_test_is_422() {
    let server = FakeApiServer::start().await;
    let api: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    within(api.create(&PostParams::default(), &cm("a", &[("k", "1")]))).await.unwrap();
    let ok: json_patch::Patch = serde_json::from_value(json!([
        { "op": "test", "path": "/metadata/finalizers", "value": null },
        { "op": "add", "path": "/metadata/finalizers", "value": ["x.io/f"] },
        { "op": "replace", "path": "/data/k", "value": "2" },
    ]))
    .unwrap();
    let out = within(api.patch("a", &PatchParams::default(), &Patch::Json::<()>(ok))).await.unwrap();
    assert_eq!(out.metadata.finalizers, Some(vec!["x.io/f".to_owned()]));
    assert_eq!(out.data.as_ref().unwrap()["k"], "2");
    let failing: json_patch::Patch = serde_json::from_value(json!([
        { "op": "replace", "path": "/data/k", "value": "3" },
        { "op": "test", "path": "/metadata/finalizers/0", "value": "other" },
    ]))
    .unwrap();
    let r = within(api.patch("a", &PatchParams::default(), &Patch::Json::<()>(failing))).await;
    assert_eq!(api_error(r), (422, "Invalid".into()));
    // Atomic: the replace before the failed test did not land.
    assert_eq!(server.get("configmaps", Some("default"), "a").unwrap()["data"]["k"], "2");
    let missing: json_patch::Patch =
        serde_json::from_value(json!([{ "op": "replace", "path": "/data/k", "value": "1" }])).unwrap();
    assert_eq!(api_error(within(api.patch("zz", &PatchParams::default(), &Patch::Json::<()>(missing))).await).0, 404);
}

#[tokio::test]
async fn strategic_merge_patch_is_merge() {
    let server = FakeApiServer::start().await;
    let api: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    within(api.create(&PostParams::default(), &cm("a", &[("k", "1"), ("j", "2")]))).await.unwrap();
    let p = json!({ "data": { "k": null, "n": "3" } });
    let out = within(api.patch("a", &PatchParams::default(), &Patch::Strategic(&p))).await.unwrap();
    assert_eq!(out.data.unwrap(), [("j".to_owned(), "2".to_owned()), ("n".to_owned(), "3".to_owned())].into());
}

#[tokio::test]
async fn server_side_apply_creates_updates_and_detects_conflicts() {
    let server = FakeApiServer::start().await;
    let api: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    let first =
        json!({ "apiVersion": "v1", "kind": "ConfigMap", "metadata": { "name": "a" }, "data": { "k": "1", "j": "1" } });
    let created = within(api.patch("a", &PatchParams::apply("mgr-a"), &Patch::Apply(&first))).await.unwrap();
    assert_eq!(created.metadata.generation, Some(1));
    let mf = created.metadata.managed_fields.as_ref().unwrap();
    assert_eq!((mf[0].manager.as_deref(), mf[0].operation.as_deref()), (Some("mgr-a"), Some("Apply")));
    assert_eq!(server.requests().last().unwrap().code, 201);

    // Re-applying without `j` removes it (mgr-a was its only owner).
    let second = json!({ "apiVersion": "v1", "kind": "ConfigMap", "metadata": { "name": "a" }, "data": { "k": "2" } });
    let updated = within(api.patch("a", &PatchParams::apply("mgr-a"), &Patch::Apply(&second))).await.unwrap();
    assert_eq!(updated.data.unwrap(), [("k".to_owned(), "2".to_owned())].into());

    // Another manager changing an owned field conflicts unless forced.
    let other = json!({ "apiVersion": "v1", "kind": "ConfigMap", "metadata": { "name": "a" }, "data": { "k": "3" } });
    match within(api.patch("a", &PatchParams::apply("mgr-b"), &Patch::Apply(&other))).await {
        Err(kube::Error::Api(s)) => {
            assert_eq!((s.code, s.reason.as_str()), (409, "Conflict"));
            assert!(s.message.contains("mgr-a") && s.message.contains(".data.k"), "{}", s.message);
        }
        other => panic!("{other:?}"),
    }
    let forced = within(api.patch("a", &PatchParams::apply("mgr-b").force(), &Patch::Apply(&other))).await.unwrap();
    assert_eq!(forced.data.unwrap()["k"], "3");

    // YAML bodies are accepted; missing fieldManager is rejected; missing kind is 400.
    let http = raw_http(&server);
    let yaml = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: y\ndata:\n  a: b\n";
    let (code, body) = http
        .send(
            "PATCH",
            "/api/v1/namespaces/default/configmaps/y?fieldManager=yaml",
            "application/apply-patch+yaml",
            yaml,
        )
        .await;
    assert_eq!((code, body["data"]["a"].as_str()), (201, Some("b")));
    let (code, _) =
        http.send("PATCH", "/api/v1/namespaces/default/configmaps/y", "application/apply-patch+yaml", yaml).await;
    assert_eq!(code, 422);
    let (code, _) = http
        .send(
            "PATCH",
            "/api/v1/namespaces/default/configmaps/y?fieldManager=x",
            "application/apply-patch+yaml",
            "data: {}",
        )
        .await;
    assert_eq!(code, 400);
}

fn deployment(name: &str, replicas: i32) -> Deployment {
    Deployment {
        metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
        spec: Some(DeploymentSpec { replicas: Some(replicas), ..Default::default() }),
        status: Some(DeploymentStatus { replicas: Some(99), ..Default::default() }),
    }
}

#[tokio::test]
async fn status_subresource_isolation_and_generation() {
    let server = FakeApiServer::start().await;
    let api: Api<Deployment> = Api::namespaced(server.client(), "default");
    let created = within(api.create(&PostParams::default(), &deployment("d", 1))).await.unwrap();
    assert!(created.status.is_none(), "create drops status for resources with a status subresource");
    assert_eq!(created.metadata.generation, Some(1));

    // Status writes change only status, and not the generation.
    let status =
        json!({ "status": { "replicas": 3 }, "spec": { "replicas": 7 }, "metadata": { "labels": { "x": "y" } } });
    let s = within(api.patch_status("d", &PatchParams::default(), &Patch::Merge(&status))).await.unwrap();
    assert_eq!(s.status.as_ref().unwrap().replicas, Some(3));
    assert_eq!(s.spec.as_ref().unwrap().replicas, Some(1));
    assert!(s.metadata.labels.is_none());
    assert_eq!(s.metadata.generation, Some(1));

    // Spec writes keep status and bump the generation.
    let mut spec_write = s.clone();
    spec_write.spec.as_mut().unwrap().replicas = Some(2);
    spec_write.status.as_mut().unwrap().replicas = Some(42);
    let w = within(api.replace("d", &PostParams::default(), &spec_write)).await.unwrap();
    assert_eq!(w.status.as_ref().unwrap().replicas, Some(3));
    assert_eq!(w.metadata.generation, Some(2));

    // Metadata-only changes do not bump the generation.
    let p = json!({ "metadata": { "labels": { "a": "b" } } });
    let m = within(api.patch("d", &PatchParams::default(), &Patch::Merge(&p))).await.unwrap();
    assert_eq!(m.metadata.generation, Some(2));

    // A no-op write keeps the resourceVersion (no event).
    let again = within(api.patch("d", &PatchParams::default(), &Patch::Merge(&p))).await.unwrap();
    assert_eq!(again.metadata.resource_version, m.metadata.resource_version);

    // PUT on /status.
    let mut st = again.clone();
    st.status.as_mut().unwrap().replicas = Some(5);
    st.spec.as_mut().unwrap().replicas = Some(9);
    let r = within(api.replace_status("d", &PostParams::default(), &st)).await.unwrap();
    assert_eq!((r.status.unwrap().replicas, r.spec.unwrap().replicas), (Some(5), Some(2)));

    // Nodes keep status on create; status apply works through the subresource.
    let nodes: Api<Node> = Api::all(server.client());
    let mut n = node("n1", &[]);
    n.status = Some(NodeStatus { phase: Some("Running".into()), ..Default::default() });
    let created = within(nodes.create(&PostParams::default(), &n)).await.unwrap();
    assert_eq!(created.status.unwrap().phase.as_deref(), Some("Running"));
    let apply = json!({ "apiVersion": "v1", "kind": "Node", "status": { "phase": "Terminated" } });
    // The creator owns status.phase (create is an update), so a non-forced apply conflicts, as on a real server.
    let r = within(nodes.patch_status("n1", &PatchParams::apply("st"), &Patch::Apply(&apply))).await;
    assert_eq!(api_error(r), (409, "Conflict".into()));
    let applied =
        within(nodes.patch_status("n1", &PatchParams::apply("st").force(), &Patch::Apply(&apply))).await.unwrap();
    assert_eq!(applied.status.unwrap().phase.as_deref(), Some("Terminated"));
    // ConfigMaps have no status subresource.
    let cms: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    within(cms.create(&PostParams::default(), &cm("c", &[]))).await.unwrap();
    let r = within(cms.patch_status("c", &PatchParams::default(), &Patch::Merge(json!({})))).await;
    assert_eq!(api_error(r).0, 404);
}

#[tokio::test]
async fn finalizers_delay_deletion_until_removed() {
    let server = FakeApiServer::start().await;
    let api: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    let mut c = cm("f", &[]);
    c.metadata.finalizers = Some(vec!["weft.io/a".into(), "weft.io/b".into()]);
    within(api.create(&PostParams::default(), &c)).await.unwrap();

    let r = within(api.delete("f", &DeleteParams::default())).await.unwrap();
    let marked = r.left().unwrap();
    assert!(marked.metadata.deletion_timestamp.is_some());
    assert_eq!(marked.metadata.deletion_grace_period_seconds, Some(0));
    assert_eq!(marked.metadata.generation, Some(2));
    // Deleting again changes nothing.
    let again = within(api.delete("f", &DeleteParams::default())).await.unwrap().left().unwrap();
    assert_eq!(again.metadata.resource_version, marked.metadata.resource_version);
    // New finalizers cannot be added while deleting.
    let add = json!({ "metadata": { "finalizers": ["weft.io/a", "weft.io/b", "weft.io/c"] } });
    assert_eq!(api_error(within(api.patch("f", &PatchParams::default(), &Patch::Merge(&add))).await).0, 422);

    let drop_one = json!({ "metadata": { "finalizers": ["weft.io/b"] } });
    within(api.patch("f", &PatchParams::default(), &Patch::Merge(&drop_one))).await.unwrap();
    assert!(server.get("configmaps", Some("default"), "f").is_some());
    let drop_all = json!({ "metadata": { "finalizers": null } });
    within(api.patch("f", &PatchParams::default(), &Patch::Merge(&drop_all))).await.unwrap();
    assert!(server.get("configmaps", Some("default"), "f").is_none());
}

#[tokio::test]
async fn delete_preconditions() {
    let server = FakeApiServer::start().await;
    let api: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    let created = within(api.create(&PostParams::default(), &cm("p", &[]))).await.unwrap();
    let wrong_uid = DeleteParams {
        preconditions: Some(Preconditions { uid: Some("nope".into()), resource_version: None }),
        ..Default::default()
    };
    assert_eq!(api_error(within(api.delete("p", &wrong_uid)).await), (409, "Conflict".into()));
    let wrong_rv = DeleteParams {
        preconditions: Some(Preconditions { uid: None, resource_version: Some("1".into()) }),
        ..Default::default()
    };
    assert_eq!(api_error(within(api.delete("p", &wrong_rv)).await), (409, "Conflict".into()));
    let right = DeleteParams {
        preconditions: Some(Preconditions {
            uid: created.metadata.uid.clone(),
            resource_version: created.metadata.resource_version.clone(),
        }),
        ..Default::default()
    };
    within(api.delete("p", &right)).await.unwrap();
    assert_eq!(api_error(within(api.delete("p", &right)).await).0, 404);
}

#[tokio::test]
async fn dry_run_and_delete_collection_and_metadata_api() {
    let server = FakeApiServer::start().await;
    let api: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    within(api.create(&PostParams { dry_run: true, ..Default::default() }, &cm("dry", &[]))).await.unwrap();
    assert!(server.get("configmaps", Some("default"), "dry").is_none());
    for (name, tier) in [("a", "x"), ("b", "x"), ("c", "y")] {
        let mut c = cm(name, &[]);
        c.metadata.labels = labels(&[("tier", tier)]);
        within(api.create(&PostParams::default(), &c)).await.unwrap();
    }
    let meta = within(api.get_metadata("a")).await.unwrap();
    assert_eq!(meta.metadata.name.as_deref(), Some("a"));
    let metas = within(api.list_metadata(&ListParams::default())).await.unwrap();
    assert_eq!(metas.items.len(), 3);
    within(api.delete_collection(&DeleteParams::default(), &ListParams::default().labels("tier=x"))).await.unwrap();
    let left: Vec<String> = server
        .list("configmaps", Some("default"))
        .iter()
        .map(|c| c["metadata"]["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(left, ["c"]);
    let last = server.requests().into_iter().rev().find(|r| r.verb == Verb::DeleteCollection);
    assert!(last.is_some());
}

#[tokio::test]
async fn crd_registration_serves_dynamic_objects() {
    let server = FakeApiServer::start().await;
    let crds: Api<CustomResourceDefinition> = Api::all(server.client());
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": { "name": "gpujobs.weft.io" },
        "spec": {
            "group": "weft.io",
            "names": { "plural": "gpujobs", "singular": "gpujob", "kind": "GpuJob" },
            "scope": "Namespaced",
            "versions": [{
                "name": "v1alpha1", "served": true, "storage": true,
                "schema": { "openAPIV3Schema": { "type": "object", "x-kubernetes-preserve-unknown-fields": true } },
                "subresources": { "status": {} }
            }]
        }
    }))
    .unwrap();
    let created = within(crds.create(&PostParams::default(), &crd)).await.unwrap();
    let conditions = created.status.unwrap().conditions.unwrap();
    assert!(conditions.iter().any(|c| c.type_ == "Established" && c.status == "True"));

    let ar = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("weft.io", "v1alpha1", "GpuJob"), "gpujobs");
    let jobs: Api<DynamicObject> = Api::namespaced_with(server.client(), "default", &ar);
    let mut job = DynamicObject::new("j1", &ar);
    job.data = json!({ "spec": { "gpus": 4 }, "status": { "phase": "ignored" } });
    let created = within(jobs.create(&PostParams::default(), &job)).await.unwrap();
    assert_eq!(created.data["spec"]["gpus"], 4);
    assert!(created.data.get("status").is_none());
    let st = json!({ "status": { "phase": "Running" } });
    let patched = within(jobs.patch_status("j1", &PatchParams::default(), &Patch::Merge(&st))).await.unwrap();
    assert_eq!(patched.data["status"]["phase"], "Running");
    assert_eq!(within(jobs.list(&ListParams::default())).await.unwrap().items.len(), 1);
    assert_eq!(server.get("gpujobs.weft.io", Some("default"), "j1").unwrap()["status"]["phase"], "Running");

    // Deleting the CRD stops serving it.
    within(crds.delete("gpujobs.weft.io", &DeleteParams::default())).await.unwrap();
    assert_eq!(api_error(within(jobs.list(&ListParams::default())).await).0, 404);

    // register() serves a resource without a CRD.
    server.register(ResourceSpec::cluster("weft.io", "v1", "topologies", "Topology").with_status());
    let ar = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("weft.io", "v1", "Topology"), "topologies");
    let topo: Api<DynamicObject> = Api::all_with(server.client(), &ar);
    within(topo.create(&PostParams::default(), &DynamicObject::new("t", &ar))).await.unwrap();
    assert!(server.get("topologies.weft.io", None, "t").is_some());
    // Invalid CRDs are rejected.
    let bad = json!({ "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": { "name": "wrong.weft.io" },
        "spec": { "group": "weft.io", "names": { "plural": "xs", "kind": "X" }, "scope": "Namespaced", "versions": [] } });
    let bad: CustomResourceDefinition = serde_json::from_value(bad).unwrap();
    assert_eq!(api_error(within(crds.create(&PostParams::default(), &bad)).await), (422, "Invalid".into()));
}

#[tokio::test]
async fn request_log_records_rbac_verbs() {
    let server = FakeApiServer::start().await;
    let mut config = server.kube_config().unwrap();
    config.headers.push((http::header::USER_AGENT, http::HeaderValue::from_static("weft-test/1.0 (linux)")));
    let client = kube::Client::try_from(config).unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client, "ns1");
    within(nodes.create(&PostParams::default(), &node("n1", &[]))).await.unwrap();
    within(nodes.get("n1")).await.unwrap();
    within(nodes.list(&ListParams::default())).await.unwrap();
    let p = json!({ "status": { "phase": "Ready" } });
    let pp = PatchParams { field_manager: Some("weft-test".into()), ..Default::default() };
    within(nodes.patch_status("n1", &pp, &Patch::Merge(&p))).await.unwrap();
    let n = within(nodes.get("n1")).await.unwrap();
    within(nodes.replace("n1", &PostParams::default(), &n)).await.unwrap();
    within(pods.create(&PostParams::default(), &pod("p", None, &[]))).await.unwrap();
    within(pods.delete("p", &DeleteParams::default())).await.unwrap();
    within(pods.delete_collection(&DeleteParams::default(), &ListParams::default())).await.unwrap();
    let stream = within(nodes.watch(&kube::api::WatchParams::default(), "0")).await.unwrap();
    drop(stream);

    let log: Vec<(String, String, Option<String>, Option<String>)> =
        server.requests().into_iter().map(|r| (r.verb.to_string(), r.rbac_resource(), r.namespace, r.name)).collect();
    let expect = |v: &str, r: &str, ns: Option<&str>, n: Option<&str>| {
        (v.to_owned(), r.to_owned(), ns.map(str::to_owned), n.map(str::to_owned))
    };
    assert_eq!(
        log,
        [
            expect("create", "nodes", None, None),
            expect("get", "nodes", None, Some("n1")),
            expect("list", "nodes", None, None),
            expect("patch", "nodes/status", None, Some("n1")),
            expect("get", "nodes", None, Some("n1")),
            expect("update", "nodes", None, Some("n1")),
            expect("create", "pods", Some("ns1"), None),
            expect("delete", "pods", Some("ns1"), Some("p")),
            expect("deletecollection", "pods", Some("ns1"), None),
            expect("watch", "nodes", None, None),
        ]
    );
    let patch = &server.requests()[3];
    assert_eq!(patch.field_manager.as_deref(), Some("weft-test"));
    assert_eq!(patch.user_agent.as_deref(), Some("weft-test/1.0 (linux)"));
    // Writes without fieldManager are owned by the user agent's first segment.
    let n = server.get("nodes", None, "n1").unwrap();
    let entries: Vec<(&str, &str, Option<&str>)> = n["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["manager"].as_str().unwrap(), e["operation"].as_str().unwrap(), e["subresource"].as_str()))
        .collect();
    assert_eq!(entries, [("weft-test", "Update", Some("status"))]);
    server.clear_requests();
    assert!(server.requests().is_empty());
}

#[tokio::test]
async fn fault_injection_and_second_writer() {
    let server = FakeApiServer::start().await;
    let nodes: Api<Node> = Api::all(server.client());
    within(nodes.create(&PostParams::default(), &node("n1", &[]))).await.unwrap();
    within(nodes.create(&PostParams::default(), &node("n2", &[]))).await.unwrap();
    server.fail_next(RequestMatcher::new(Verb::Patch, "nodes").name("n1"), 409, 2);
    server.fail_next(RequestMatcher::new(Verb::Get, "nodes"), 500, 1);
    let p = json!({ "metadata": { "labels": { "a": "b" } } });
    let (pp, merge) = (PatchParams::default(), Patch::Merge(&p));
    let patch = || nodes.patch("n1", &pp, &merge);
    assert_eq!(api_error(within(patch()).await), (409, "Conflict".into()));
    // Other names and verbs are not affected.
    within(nodes.patch("n2", &PatchParams::default(), &Patch::Merge(&p))).await.unwrap();
    assert_eq!(api_error(within(nodes.get("n2")).await), (500, "InternalError".into()));
    within(nodes.get("n2")).await.unwrap();
    assert_eq!(api_error(within(patch()).await).0, 409);
    within(patch()).await.unwrap();
    // Status patches only match "nodes/status".
    server.fail_next(RequestMatcher::new(Verb::Patch, "nodes/status"), 500, 1);
    within(patch()).await.unwrap();
    let codes: Vec<u16> = server.requests().iter().map(|r| r.code).collect();
    assert_eq!(codes, [201, 201, 409, 200, 500, 200, 409, 200, 200]);
    server.clear_faults();

    // modify() is a second writer: the client's copy is now stale.
    let n = within(nodes.get("n1")).await.unwrap();
    server.modify("nodes", None, "n1", |v| v["metadata"]["labels"]["by"] = json!("someone-else")).unwrap();
    assert_eq!(api_error(within(nodes.replace("n1", &PostParams::default(), &n)).await).0, 409);
    assert_eq!(server.get("nodes", None, "n1").unwrap()["metadata"]["labels"]["by"], "someone-else");
}

#[tokio::test]
async fn seeded_objects_and_kubeconfig() {
    let server = FakeApiServer::start().await;
    let mut p = pod("seeded", Some("n1"), &[]);
    p.status = Some(k8s_openapi::api::core::v1::PodStatus { phase: Some("Running".into()), ..Default::default() });
    let stored: Pod = server.insert_typed(&p).unwrap();
    assert_eq!(stored.metadata.namespace.as_deref(), Some("default"));
    assert!(stored.metadata.resource_version.is_some());
    assert_eq!(stored.status.unwrap().phase.as_deref(), Some("Running"));

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    server.write_kubeconfig(&path).unwrap();
    let kubeconfig = kube::config::Kubeconfig::read_from(&path).unwrap();
    assert_eq!(kubeconfig.current_context.as_deref(), Some("fake"));
    let config = within(kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())).await.unwrap();
    let client = kube::Client::try_from(config).unwrap();
    let pods: Api<Pod> = Api::default_namespaced(client);
    let got = within(pods.get("seeded")).await.unwrap();
    assert_eq!(got.status.unwrap().phase.as_deref(), Some("Running"));

    server.shutdown();
    assert!(within(pods.get("seeded")).await.is_err());
}

#[tokio::test]
async fn kube_discovery_works() {
    let server = FakeApiServer::start().await;
    let client = server.client();
    let version = within(client.apiserver_version()).await.unwrap();
    assert_eq!(version.major, "1");
    let discovery = within(kube::Discovery::new(client.clone()).run()).await.unwrap();
    assert!(discovery.has_group("coordination.k8s.io"));
    let gvk = GroupVersionKind::gvk("resource.k8s.io", "v1", "ResourceSlice");
    let (ar, caps) = within(kube::discovery::pinned_kind(&client, &gvk)).await.unwrap();
    assert_eq!(ar.plural, "resourceslices");
    assert_eq!(caps.scope, kube::discovery::Scope::Cluster);
}

/// The API server keeps an object's UID (an update without one gets the stored one, as
/// `rest.BeforeUpdate` does) and refuses to change it (`ValidateObjectMetaUpdate`: the field is
/// immutable), so a write carrying the UID of a deleted object never lands on its successor.
#[tokio::test]
async fn a_write_that_changes_the_uid_is_refused_as_invalid() {
    let server = FakeApiServer::start().await;
    let api: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    let created = within(api.create(&PostParams::default(), &cm("a", &[("k", "v")]))).await.unwrap();
    let uid = created.metadata.uid.clone().unwrap();

    let patch = json!({"metadata": {"uid": "not-the-uid", "annotations": {"x": "y"}}});
    match within(api.patch("a", &PatchParams::default(), &Patch::Merge(&patch))).await {
        Err(kube::Error::Api(s)) => {
            assert_eq!((s.code, s.reason.as_str()), (422, "Invalid"));
            assert!(s.message.contains("metadata.uid") && s.message.contains("field is immutable"), "{}", s.message);
        }
        other => panic!("expected 422, got {other:?}"),
    }
    let mut replaced = created.clone();
    replaced.metadata.uid = Some("not-the-uid".into());
    assert_eq!(api_error(within(api.replace("a", &PostParams::default(), &replaced)).await), (422, "Invalid".into()));
    let stored = within(api.get("a")).await.unwrap();
    assert_eq!(stored.metadata.uid.as_deref(), Some(uid.as_str()));
    assert!(stored.metadata.annotations.is_none(), "nothing of the refused writes landed");

    // The right UID, or none, is accepted.
    let patch = json!({"metadata": {"uid": uid, "annotations": {"x": "y"}}});
    within(api.patch("a", &PatchParams::default(), &Patch::Merge(&patch))).await.unwrap();
    let mut no_uid = within(api.get("a")).await.unwrap();
    no_uid.metadata.uid = None;
    let replaced = within(api.replace("a", &PostParams::default(), &no_uid)).await.unwrap();
    assert_eq!(replaced.metadata.uid.as_deref(), Some(uid.as_str()));
}

/// A waiter woken by an object must find, in the request log, the request that stored it: tests
/// wait for an effect and then count the requests that caused it (the NIC driver's status patch
/// was once counted 0 right after its status was seen).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_request_that_stored_an_object_is_logged_before_the_object_is_seen() {
    let server = FakeApiServer::start().await;
    let api: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    for i in 0..200 {
        let name = format!("c{i}");
        let create = {
            let (api, name) = (api.clone(), name.clone());
            tokio::spawn(async move { api.create(&PostParams::default(), &cm(&name, &[("k", "v")])).await })
        };
        let mut logged_when_seen = None;
        within(server.wait_for(|s| {
            if s.get("configmaps", Some("default"), &name).is_none() {
                return false;
            }
            logged_when_seen = Some(
                s.requests().iter().any(|r| r.verb == Verb::Create && r.name.is_none() && r.resource == "configmaps")
                    && s.requests().iter().filter(|r| r.verb == Verb::Create).count() == i + 1,
            );
            true
        }))
        .await;
        assert_eq!(logged_when_seen, Some(true), "configmap {name} was visible before its create was logged");
        within(create).await.unwrap().unwrap();
    }
    let codes: Vec<u16> = server.requests().iter().map(|r| r.code).collect();
    assert!(codes.iter().all(|&c| c == 201), "every create answered 201 once done: {codes:?}");
}
