//! End to end on the fake API server: the NumaNetwork of deploy/examples/numanetwork.yaml, the
//! video pipeline of deploy/examples/numaflow/video-pipeline.yaml admitted through `weft webhook`
//! (mutating, then validating, as the API server calls them) with the real watch-backed NumaNetwork
//! source, under Numaflow's full Pipeline CRD (what the API server prunes, pruned; the webhook reads
//! the served CRD and warns about an unbound Pipeline there), stored, and turned into Vertex objects and pods by a test-only Numaflow playing
//! upstream's pipeline and vertex controllers (`weft_testkit::numaflow`). The pods must end up with the
//! NumaNetwork's claim (pod and container), VERTEX_DOMAIN / VERTEX_DOMAIN_TARGETS and the
//! weft.io/vertex-domains annotation the DNS registrar reads; the NumaNetwork cap is enforced with
//! a LIST against the same server.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;

use kube::api::{Api, DynamicObject, PostParams};
use serde_json::{Value, json};
use support::{HANG_GUARD, Webhook, patched};
use weft_admission::webhook::pipelines::FULL_CRD_WARNING;
use weft_admission::webhook::{
    InMemoryJobs, KubeNumaNetworks, KubePipelineCrd, NetworkOptions, NumaNetworkSource, PipelineCrdSource,
    WebhookState, WiringOptions, typed_validator,
};
use weft_crds::NumaNetwork;
use weft_fakeapi::{FakeApiServer, ResourceSpec, Verb};
use weft_jobs::admission::AdmissionOptions;
use weft_pipeline::{
    EdgeField, NUMA_NETWORK_EDGES_ANNOTATION, PIPELINE_NAME_LABEL, VERTEX_DOMAINS_ANNOTATION, VERTEX_NAME_LABEL,
    VertexDomainEntry,
};
use weft_testkit::numaflow;

const NN: &str = "pipeline1-multi-network";
const RCT: &str = "pipeline1-multi-network-rct";
const NS: &str = "media";

fn example(name: &str) -> Value {
    let path = format!("{}/../../deploy/examples/{name}", env!("CARGO_MANIFEST_DIR"));
    serde_saphyr::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

fn review(operation: &str, resource: &str, kind: &str, namespace: Option<&str>, object: &Value) -> Value {
    let gvk = json!({"group": "numaflow.numaproj.io", "version": "v1alpha1", "kind": kind});
    let gvr = json!({"group": "numaflow.numaproj.io", "version": "v1alpha1", "resource": resource});
    let mut request = json!({
        "uid": format!("e2e-{resource}-{}", object["metadata"]["name"].as_str().unwrap_or("")),
        "kind": gvk, "resource": gvr, "requestKind": gvk, "requestResource": gvr,
        "name": object["metadata"]["name"], "operation": operation,
        "userInfo": {"username": "alice@example.com", "groups": ["system:authenticated"]},
        "object": object, "oldObject": null, "dryRun": false
    });
    if let Some(ns) = namespace {
        request["namespace"] = json!(ns);
    }
    json!({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": request})
}

/// What the API server does with a Pipeline CREATE when it serves Numaflow's full Pipeline CRD, as
/// Numaflow's default install does: the request pruned to the fields the CRD declares, the
/// mutating webhook's patch applied and the result pruned again, then the validating webhook asked;
/// the object stored only if both allow it. Nothing weft's patch adds may be pruned.
async fn admit_pipeline(webhook: &Webhook, pipeline: &Value) -> Result<Value, String> {
    let (pipeline, _) = numaflow::prune_as_full_crd(pipeline);
    let answer =
        webhook.review("/pipelines/mutate", &review("CREATE", "pipelines", "Pipeline", Some(NS), &pipeline)).await;
    let mutated = match answer["response"]["patch"].as_str() {
        Some(_) => patched(&pipeline, &answer),
        None if answer["response"]["allowed"] == true => pipeline.clone(),
        None => return Err(answer["response"]["status"]["message"].to_string()),
    };
    let (mutated, pruned) = numaflow::prune_as_full_crd(&mutated);
    assert!(pruned.is_empty(), "the full CRD prunes what weft added: {pruned:?}");
    let answer =
        webhook.review("/pipelines/validate", &review("CREATE", "pipelines", "Pipeline", Some(NS), &mutated)).await;
    if answer["response"]["allowed"] != true {
        return Err(answer["response"]["status"]["message"].as_str().unwrap_or_default().to_owned());
    }
    Ok(mutated)
}

fn env(container: &Value) -> Vec<(String, String)> {
    container["env"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| Some((e["name"].as_str()?.to_owned(), e["value"].as_str()?.to_owned())))
        .collect()
}

fn env_value(container: &Value, name: &str) -> Option<String> {
    env(container).into_iter().find(|(n, _)| n == name).map(|(_, v)| v)
}

fn domain(vertex: &str) -> String {
    format!("{vertex}.{NN}.video.{NS}.vertexdomain.local")
}

#[tokio::test]
async fn numaflow_turns_the_wired_pipeline_into_pods_with_the_claims_env_and_domains() {
    let api = FakeApiServer::start().await;
    // Numaflow's default install: the full Pipeline CRD, which the webhook reads.
    api.insert(numaflow::pipeline_crd(true)).unwrap();
    api.register(ResourceSpec::namespaced("numaflow.numaproj.io", "v1alpha1", "vertices", "Vertex").with_status());
    api.register(
        ResourceSpec::cluster("numaflow.numaproj.io", "v1alpha1", "numanetworks", "NumaNetwork").with_status(),
    );
    api.insert(example("numanetwork.yaml")).unwrap();

    let networks = Arc::new(KubeNumaNetworks::spawn(api.client()));
    let rules = typed_validator(|n: &NumaNetwork, old: Option<&NumaNetwork>| {
        let checked = match old {
            None => n.validate(),
            Some(old) => n.validate_update(old),
        };
        checked.err().map(|e| e.errors().iter().map(ToString::to_string).collect()).unwrap_or_default()
    });
    let opts = NetworkOptions { wiring: WiringOptions::default(), max_numa_networks: 2, validator: Some(rules) };
    let crd = Arc::new(KubePipelineCrd::spawn(api.client()));
    let state = WebhookState::new(Arc::new(InMemoryJobs::new()), AdmissionOptions::default())
        .with_numa_networks(networks.clone(), opts)
        .with_pipeline_crd(crd.clone());
    let webhook = Webhook::start_with(state).await;
    tokio::time::timeout(HANG_GUARD, networks.wait_until_synced()).await.expect("NumaNetwork cache synced");
    tokio::time::timeout(HANG_GUARD, crd.wait_until_known()).await.expect("Pipeline CRD read");
    assert_eq!(crd.edge_field(), Some(EdgeField::Pruned), "the full CRD drops spec.edges[].numaNetwork");
    // The webhook's reads so far (the CRD and NumaNetwork watches) are granted by its ClusterRole.
    let reads: Vec<_> = api
        .requests()
        .into_iter()
        .filter(|r| ["customresourcedefinitions", "numanetworks"].contains(&r.resource.as_str()))
        .collect();
    assert!(reads.iter().any(|r| r.resource == "customresourcedefinitions"), "{reads:?}");
    weft_testkit::rbac::assert_granted(&reads, &["components/webhook/rbac.yaml"]);
    assert!(webhook.ops.is_ready(), "{:?}", webhook.ops.readiness());
    assert_eq!(networks.len(), 1);

    // Without the NumaNetwork's name right, the API server would refuse the Pipeline.
    let mut typo = example("numaflow/video-pipeline.yaml");
    let edges = &mut typo["metadata"]["annotations"][NUMA_NETWORK_EDGES_ANNOTATION];
    *edges = json!(edges.as_str().unwrap().replacen(NN, "pipeline1-multi-netwrok", 1));
    let refused = admit_pipeline(&webhook, &typo).await.unwrap_err();
    assert!(refused.contains("NumaNetwork 'pipeline1-multi-netwrok' does not exist"), "{refused}");

    // The field form under the full CRD: the API server drops the field, the Pipeline arrives
    // unbound, and the webhook's answer says why and what to use.
    let (field_form, dropped) = numaflow::prune_as_full_crd(&example("numaflow/video-pipeline-field.yaml"));
    assert_eq!(dropped, ["spec.edges[1].numaNetwork", "spec.edges[2].numaNetwork"]);
    let answer =
        webhook.review("/pipelines/validate", &review("CREATE", "pipelines", "Pipeline", Some(NS), &field_form)).await;
    assert_eq!(answer["response"]["allowed"], true);
    assert_eq!(answer["response"]["warnings"], json!([FULL_CRD_WARNING]), "{answer}");

    // The example as the user applies it in namespace media.
    let mut pipeline = example("numaflow/video-pipeline.yaml");
    pipeline["metadata"]["namespace"] = json!(NS);
    let admitted = admit_pipeline(&webhook, &pipeline).await.expect("admitted");
    let pipelines: Api<DynamicObject> = Api::namespaced_with(api.client(), NS, &numaflow::pipelines());
    pipelines.create(&PostParams::default(), &serde_json::from_value(admitted).unwrap()).await.unwrap();

    let _numaflow = numaflow::Numaflow::start(api.client());
    tokio::time::timeout(HANG_GUARD, api.wait_for(|s| s.list("pods", Some(NS)).len() == 4))
        .await
        .expect("Numaflow created one pod per vertex");

    let pods = api.list("pods", Some(NS));
    let pod = |vertex: &str| -> Value {
        pods.iter()
            .find(|p| p["metadata"]["labels"][VERTEX_NAME_LABEL] == vertex)
            .unwrap_or_else(|| panic!("no pod of vertex {vertex}"))
            .clone()
    };
    let user = |pod: &Value, name: &str| -> Value {
        pod["spec"]["initContainers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("no {name} container in {pod}"))
            .clone()
    };
    let nic = json!({"name": RCT, "resourceClaimTemplateName": RCT});

    // filter-resize: the from-side of the direct edge.
    let filter = pod("filter-resize");
    assert_eq!(filter["metadata"]["labels"][PIPELINE_NAME_LABEL], "video");
    assert!(filter["metadata"]["name"].as_str().unwrap().starts_with("video-filter-resize-0-"));
    assert_eq!(filter["spec"]["resourceClaims"], json!([{"name": "gpu", "resourceClaimTemplateName": "a100"}, nic]));
    let udf = user(&filter, "udf");
    assert_eq!(udf["restartPolicy"], "Always", "the user container is a native sidecar");
    assert_eq!(udf["resources"]["claims"], json!([{"name": "gpu"}, {"name": RCT}]));
    assert_eq!(env_value(&udf, "VERTEX_DOMAIN"), Some(domain("filter-resize")));
    assert_eq!(env_value(&udf, "VERTEX_DOMAIN_TARGETS"), Some(domain("inference")));
    assert_eq!(env_value(&udf, "NUMAFLOW_VERTEX_NAME"), Some("filter-resize".to_owned()), "Numaflow's own env stays");
    let entries: Vec<VertexDomainEntry> =
        serde_json::from_str(filter["metadata"]["annotations"][VERTEX_DOMAINS_ANNOTATION].as_str().unwrap()).unwrap();
    assert_eq!(
        entries,
        vec![VertexDomainEntry { network: NN.into(), domain: domain("filter-resize"), claim: RCT.into() }]
    );
    assert_eq!(filter["metadata"]["annotations"]["numaflow.numaproj.io/replica"], "0");

    // inference: the to-side of the direct edge and the from-side of the multi-isbsvc one.
    let inference = pod("inference");
    assert_eq!(inference["spec"]["resourceClaims"][1], nic);
    let udf = user(&inference, "udf");
    assert_eq!(udf["resources"]["claims"], json!([{"name": "gpu"}, {"name": RCT}]));
    assert_eq!(env_value(&udf, "VERTEX_DOMAIN"), Some(domain("inference")));
    assert_eq!(env_value(&udf, "VERTEX_DOMAIN_TARGETS"), None, "inference → out goes through the ISB");

    // out: a udsink on the multi-isbsvc edge.
    let out = pod("out");
    assert_eq!(out["spec"]["resourceClaims"], json!([nic]));
    let udsink = user(&out, "udsink");
    assert_eq!(udsink["resources"]["claims"], json!([{"name": RCT}]));
    assert_eq!(env_value(&udsink, "VERTEX_DOMAIN"), Some(domain("out")));
    assert!(out["metadata"]["annotations"][VERTEX_DOMAINS_ANNOTATION].is_string());

    // in: on no network.
    let input = pod("in");
    assert!(input["spec"].get("resourceClaims").is_none(), "{input}");
    assert!(input["metadata"]["annotations"].get(VERTEX_DOMAINS_ANNOTATION).is_none());
    assert_eq!(env_value(&user(&input, "udsource"), "VERTEX_DOMAIN"), None);

    // The Vertex objects carry the same (Numaflow's Go types kept every field weft set).
    let vertex = api.get("vertices", Some(NS), "video-inference").expect("vertex");
    assert_eq!(vertex["spec"]["resourceClaims"][1], nic);
    assert_eq!(
        vertex["spec"]["metadata"]["annotations"][VERTEX_DOMAINS_ANNOTATION],
        inference["metadata"]["annotations"][VERTEX_DOMAINS_ANNOTATION]
    );

    // The cap of 2, counted with a LIST of the same server: one more fits, the next does not.
    let mut second = example("numanetwork.yaml");
    second["metadata"]["name"] = json!("second");
    let answer =
        webhook.review("/numanetworks/validate", &review("CREATE", "numanetworks", "NumaNetwork", None, &second)).await;
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
    api.insert(second).unwrap();
    let mut third = example("numanetwork.yaml");
    third["metadata"]["name"] = json!("third");
    let answer =
        webhook.review("/numanetworks/validate", &review("CREATE", "numanetworks", "NumaNetwork", None, &third)).await;
    assert_eq!(answer["response"]["allowed"], false, "{answer}");
    assert_eq!(answer["response"]["status"]["code"], 403);
    assert!(
        answer["response"]["status"]["message"].as_str().unwrap().contains("2 NumaNetworks exist and at most 2 may")
    );

    // The GET the pipeline webhook falls back to, against the server.
    assert!(networks.fetch("second").await.unwrap());
    assert!(!networks.fetch("no-such-network").await.unwrap());
    let mut listed = networks.list().await.unwrap();
    listed.sort();
    assert_eq!(listed, [NN, "second"]);

    // The webhook reads NumaNetworks with get, list and watch (its ClusterRole needs these three on
    // numaflow.numaproj.io numanetworks; besides, list and watch on the Pipeline CRD, checked above).
    let verbs: std::collections::BTreeSet<Verb> = api
        .requests()
        .iter()
        .filter(|r| r.resource == "numanetworks")
        .map(|r| {
            assert_eq!(r.group, "numaflow.numaproj.io");
            assert_eq!(r.namespace, None, "cluster-scoped");
            r.verb
        })
        .collect();
    assert_eq!(verbs, [Verb::Get, Verb::List, Verb::Watch].into_iter().collect());
    webhook.stop().await;
}
