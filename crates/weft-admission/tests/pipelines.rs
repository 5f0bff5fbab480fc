//! The Pipeline and NumaNetwork webhooks over real HTTPS on loopback: AdmissionReview documents
//! written as the API server sends them for a Numaflow Pipeline and a NumaNetwork, patches decoded
//! and applied with a JSON-patch library, denials and warnings read back, metrics checked. The
//! NumaNetwork rules are weft_crds' own, passed in as `weft webhook` does.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;

use serde_json::{Value, json};
use support::{Webhook, assert_unchanged, patched};
use weft_admission::webhook::pipelines::FULL_CRD_WARNING;
use weft_admission::webhook::{
    FixedPipelineCrd, InMemoryJobs, InMemoryNumaNetworks, NetworkOptions, NumaNetworkValidator, WebhookState,
    WiringOptions, typed_validator,
};
use weft_crds::NumaNetwork;
use weft_jobs::admission::AdmissionOptions;
use weft_pipeline::{EdgeField, MANAGED_ENV_ANNOTATION, VERTEX_DOMAINS_ANNOTATION};

const NN: &str = "pipeline1-multi-network";
const RCT: &str = "pipeline1-multi-network-rct";

/// weft_crds' NumaNetwork rules, as `weft webhook` passes them.
fn crd_rules() -> NumaNetworkValidator {
    typed_validator(|n: &NumaNetwork, old: Option<&NumaNetwork>| {
        let checked = match old {
            None => n.validate(),
            Some(old) => n.validate_update(old),
        };
        checked.err().map(|e| e.errors().iter().map(ToString::to_string).collect()).unwrap_or_default()
    })
}

async fn start(networks: Arc<InMemoryNumaNetworks>, max: u32) -> Webhook {
    let opts =
        NetworkOptions { wiring: WiringOptions::default(), max_numa_networks: max, validator: Some(crd_rules()) };
    let state = WebhookState::new(Arc::new(InMemoryJobs::new()), AdmissionOptions::default())
        .with_numa_networks(networks, opts);
    Webhook::start_with(state).await
}

/// The seed's video pipeline as `kubectl create -f` sends it.
fn video_pipeline() -> Value {
    json!({
        "apiVersion": "numaflow.numaproj.io/v1alpha1",
        "kind": "Pipeline",
        "metadata": {"name": "video", "namespace": "default", "creationTimestamp": null,
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}"}},
        "spec": {
            "vertices": [
                {"name": "in", "source": {"udsource": {"container": {"image": "video-source:1"}}}},
                {"name": "filter-resize",
                 "udf": {"container": {"image": "filter-resize:1", "resources": {"claims": [{"name": "gpu"}]}}},
                 "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "a100"}]},
                {"name": "inference",
                 "udf": {"container": {"image": "inference:1", "resources": {"claims": [{"name": "gpu"}]}}},
                 "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "a100"}]},
                {"name": "out", "sink": {"udsink": {"container": {"image": "video-sink:1"}}}}
            ],
            "edges": [
                {"from": "in", "to": "filter-resize"},
                {"from": "filter-resize", "to": "inference", "numaNetwork": {"name": NN, "connectionType": "direct"}},
                {"from": "inference", "to": "out", "numaNetwork": {"name": NN, "connectionType": "multi-isbsvc"}}
            ]
        }
    })
}

fn user() -> Value {
    json!({"username": "alice@example.com", "uid": "f3e1", "groups": ["media-team", "system:authenticated"]})
}

/// A Pipeline CREATE (`old` None) or UPDATE review.
fn pipeline_review(object: &Value, old: Option<&Value>) -> Value {
    let gvk = json!({"group": "numaflow.numaproj.io", "version": "v1alpha1", "kind": "Pipeline"});
    let gvr = json!({"group": "numaflow.numaproj.io", "version": "v1alpha1", "resource": "pipelines"});
    let (operation, options) = match old {
        None => (
            "CREATE",
            json!({"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1", "fieldManager": "kubectl-create"}),
        ),
        Some(_) => {
            ("UPDATE", json!({"kind": "UpdateOptions", "apiVersion": "meta.k8s.io/v1", "fieldManager": "kubectl-edit"}))
        }
    };
    json!({
        "kind": "AdmissionReview",
        "apiVersion": "admission.k8s.io/v1",
        "request": {
            "uid": "8e1f0c2a-3333-4000-8000-000000000003",
            "kind": gvk, "resource": gvr, "requestKind": gvk, "requestResource": gvr,
            "name": object["metadata"]["name"], "namespace": "default",
            "operation": operation, "userInfo": user(),
            "object": object, "oldObject": old.cloned().unwrap_or(Value::Null),
            "dryRun": false, "options": options
        }
    })
}

/// A NumaNetwork (cluster-scoped: no namespace in the request) CREATE or UPDATE review.
fn network_review(object: &Value, old: Option<&Value>) -> Value {
    let gvk = json!({"group": "numaflow.numaproj.io", "version": "v1alpha1", "kind": "NumaNetwork"});
    let gvr = json!({"group": "numaflow.numaproj.io", "version": "v1alpha1", "resource": "numanetworks"});
    json!({
        "kind": "AdmissionReview",
        "apiVersion": "admission.k8s.io/v1",
        "request": {
            "uid": "9f2e1d3b-4444-4000-8000-000000000004",
            "kind": gvk, "resource": gvr, "requestKind": gvk, "requestResource": gvr,
            "name": object["metadata"]["name"],
            "operation": if old.is_some() { "UPDATE" } else { "CREATE" }, "userInfo": user(),
            "object": object, "oldObject": old.cloned().unwrap_or(Value::Null), "dryRun": false
        }
    })
}

fn network(name: &str) -> Value {
    json!({"apiVersion": "numaflow.numaproj.io/v1alpha1", "kind": "NumaNetwork",
        "metadata": {"name": name},
        "spec": {"refDeviceClass": {"name": "vf.nvidia.dra.net"},
            "refResourceClaimDranet": {"ipRange": "192.168.10.0/24", "ethernetSpeed": 100, "vlanTag": 10}}})
}

fn denial(answer: &Value) -> (u64, String) {
    assert_eq!(answer["response"]["allowed"], false, "{answer}");
    assert!(answer["response"].get("patch").is_none(), "{answer}");
    let status = &answer["response"]["status"];
    (status["code"].as_u64().unwrap(), status["message"].as_str().unwrap().to_owned())
}

fn warnings(answer: &Value) -> Vec<String> {
    answer["response"]["warnings"]
        .as_array()
        .map(|w| w.iter().map(|x| x.as_str().unwrap().to_owned()).collect())
        .unwrap_or_default()
}

#[tokio::test]
async fn a_pipeline_is_wired_on_create_then_validated_and_wiring_it_again_changes_nothing() {
    let networks = Arc::new(InMemoryNumaNetworks::new());
    networks.insert(NN);
    let server = start(networks.clone(), 0).await;

    let review = pipeline_review(&video_pipeline(), None);
    let answer = server.review("/pipelines/mutate", &review).await;
    let pipeline = patched(&review["request"]["object"], &answer);
    let inference = &pipeline["spec"]["vertices"][2];
    assert_eq!(
        inference["resourceClaims"],
        json!([{"name": "gpu", "resourceClaimTemplateName": "a100"}, {"name": RCT, "resourceClaimTemplateName": RCT}])
    );
    assert_eq!(inference["udf"]["container"]["resources"]["claims"], json!([{"name": "gpu"}, {"name": RCT}]));
    assert_eq!(
        inference["udf"]["container"]["env"],
        json!([{"name": "VERTEX_DOMAIN", "value": "inference.pipeline1-multi-network.video.default.vertexdomain.local"}])
    );
    let filter_env = &pipeline["spec"]["vertices"][1]["udf"]["container"]["env"];
    assert_eq!(
        filter_env[1],
        json!({"name": "VERTEX_DOMAIN_TARGETS", "value": "inference.pipeline1-multi-network.video.default.vertexdomain.local"})
    );
    let annotation = inference["metadata"]["annotations"][VERTEX_DOMAINS_ANNOTATION].as_str().unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(annotation).unwrap(),
        json!([{"network": NN, "domain": "inference.pipeline1-multi-network.video.default.vertexdomain.local", "claim": RCT}])
    );
    assert_eq!(pipeline["spec"]["vertices"][0], video_pipeline()["spec"]["vertices"][0], "in is on no network");
    assert_eq!(pipeline["metadata"], video_pipeline()["metadata"], "the Pipeline's own metadata is not touched");

    // The validating webhook sees the mutated Pipeline: allowed, nothing to warn about.
    let answer = server.review("/pipelines/validate", &pipeline_review(&pipeline, None)).await;
    assert_unchanged(&answer);
    assert!(warnings(&answer).is_empty(), "{answer}");

    // An UPDATE of the wired Pipeline (Numaflow's controller adding a finalizer): no patch.
    let mut finalized = pipeline.clone();
    finalized["metadata"]["finalizers"] = json!(["numaflow.numaproj.io/pipeline-controller"]);
    assert_unchanged(&server.review("/pipelines/mutate", &pipeline_review(&finalized, Some(&pipeline))).await);
    assert_unchanged(&server.review("/pipelines/validate", &pipeline_review(&finalized, Some(&pipeline))).await);
    assert_eq!(networks.fetches(), 0, "{NN} was in the watch cache");

    // kubectl apply of the original manifest replaces spec.vertices (a JSON merge patch replaces
    // lists): the UPDATE is wired again.
    let answer = server.review("/pipelines/mutate", &pipeline_review(&video_pipeline(), Some(&pipeline))).await;
    assert_eq!(patched(&video_pipeline(), &answer)["spec"]["vertices"], pipeline["spec"]["vertices"]);

    let metrics = server.ops.encode_metrics();
    for line in [
        r#"weft_webhook_requests_total{path="/pipelines/mutate",outcome="patched"} 2"#,
        r#"weft_webhook_requests_total{path="/pipelines/mutate",outcome="allowed"} 1"#,
        r#"weft_webhook_requests_total{path="/pipelines/validate",outcome="allowed"} 2"#,
        r#"weft_webhook_numanetwork_lookups_total{source="cache",result="found"}"#,
    ] {
        assert!(metrics.contains(line), "missing {line}:\n{metrics}");
    }
    server.stop().await;
}

#[tokio::test]
async fn a_pipeline_with_problems_is_denied_with_each_one_named_and_not_patched() {
    let networks = Arc::new(InMemoryNumaNetworks::new());
    networks.insert(NN);
    let server = start(networks.clone(), 0).await;
    let mut p = video_pipeline();
    p["spec"]["edges"][1]["numaNetwork"]["connectionType"] = json!("fast");
    p["spec"]["edges"][2]["numaNetwork"]["name"] = json!("typo-network");
    p["metadata"]["annotations"]["weft.io/numa-network-edges"] = json!("[{\"from\": \"in\"");
    let review = pipeline_review(&p, None);

    // The mutating webhook leaves it to the validating one: one message, not two.
    assert_unchanged(&server.review("/pipelines/mutate", &review).await);
    let (code, message) = denial(&server.review("/pipelines/validate", &review).await);
    assert_eq!(code, 422);
    assert!(message.starts_with("Pipeline default/video cannot run on its NumaNetworks: "), "{message}");
    for part in [
        "spec.edges[1].numaNetwork.connectionType: 'fast' is not direct or multi-isbsvc",
        "spec.edges[2].numaNetwork.name: NumaNetwork 'typo-network' does not exist; create it first (kubectl get numanetworks)",
        "metadata.annotations[weft.io/numa-network-edges]: not valid JSON (EOF while parsing an object",
    ] {
        assert!(message.contains(part), "missing {part:?} in {message}");
    }
    assert_eq!(networks.fetches(), 2, "typo-network was looked up once per request");
    server.stop().await;
}

#[tokio::test]
async fn a_network_the_watch_has_not_delivered_yet_is_read_from_the_api_server() {
    let networks = Arc::new(InMemoryNumaNetworks::new());
    networks.insert_api_only(NN);
    let server = start(networks.clone(), 0).await;
    let review = pipeline_review(&video_pipeline(), None);
    let pipeline = patched(&review["request"]["object"], &server.review("/pipelines/mutate", &review).await);
    assert_eq!(pipeline["spec"]["vertices"][3]["resourceClaims"][0]["name"], RCT);
    assert_eq!(networks.fetches(), 1);

    // The API server cannot be read: denied (fail closed), naming the network.
    networks.remove(NN);
    networks.set_failing(true);
    let (code, message) = denial(&server.review("/pipelines/mutate", &review).await);
    assert_eq!(code, 500);
    assert!(message.contains(&format!("reading NumaNetwork '{NN}'")), "{message}");
    let metrics = server.ops.encode_metrics();
    assert!(metrics.contains(r#"weft_webhook_numanetwork_lookups_total{source="api",result="found"} 1"#), "{metrics}");
    assert!(metrics.contains(r#"weft_webhook_numanetwork_lookups_total{source="api",result="error"} 1"#), "{metrics}");
    server.stop().await;
}

#[tokio::test]
async fn updates_keep_problems_the_stored_pipeline_had_as_warnings_and_deletion_always_passes() {
    let networks = Arc::new(InMemoryNumaNetworks::new());
    networks.insert(NN);
    let server = start(networks.clone(), 0).await;
    let review = pipeline_review(&video_pipeline(), None);
    let stored = patched(&review["request"]["object"], &server.review("/pipelines/mutate", &review).await);

    // The NumaNetwork is deleted after the Pipeline was admitted; pausing the Pipeline must work.
    networks.remove(NN);
    let mut paused = stored.clone();
    paused["spec"]["lifecycle"] = json!({"desiredPhase": "Paused"});
    let answer = server.review("/pipelines/validate", &pipeline_review(&paused, Some(&stored))).await;
    assert_unchanged(&answer);
    assert_eq!(
        warnings(&answer),
        vec![format!(
            "spec.edges[1].numaNetwork.name: NumaNetwork '{NN}' does not exist; create it first (kubectl get numanetworks) \
             (the stored Pipeline has this problem too)"
        )]
    );
    // A new problem is still denied.
    let mut worse = paused.clone();
    worse["spec"]["edges"][2]["numaNetwork"]["connectionType"] = json!("carrier-pigeon");
    let (code, message) = denial(&server.review("/pipelines/validate", &pipeline_review(&worse, Some(&stored))).await);
    assert_eq!(code, 422);
    assert!(message.contains("'carrier-pigeon' is not direct or multi-isbsvc"), "{message}");
    assert!(!message.contains("does not exist"), "the known problem is not repeated as an error: {message}");

    // Being deleted: Numaflow's controller removes its finalizer.
    let mut deleting = worse.clone();
    deleting["metadata"]["deletionTimestamp"] = json!("2026-01-05T10:00:00Z");
    assert_unchanged(&server.review("/pipelines/validate", &pipeline_review(&deleting, Some(&worse))).await);
    assert_unchanged(&server.review("/pipelines/mutate", &pipeline_review(&deleting, Some(&worse))).await);
    server.stop().await;
}

#[tokio::test]
async fn an_unbound_pipeline_is_told_when_the_served_crd_drops_the_edge_field() {
    let networks = Arc::new(InMemoryNumaNetworks::new());
    networks.insert(NN);
    let mut unbound = video_pipeline();
    for e in unbound["spec"]["edges"].as_array_mut().unwrap() {
        e.as_object_mut().unwrap().remove("numaNetwork");
    }
    let mut annotated = unbound.clone();
    annotated["metadata"]["annotations"]["weft.io/numa-network-edges"] = json!(
        json!([{"from": "filter-resize", "to": "inference", "numaNetwork": NN, "connectionType": "direct"}])
            .to_string()
    );
    for (served, pipeline, told) in [
        (Some(EdgeField::Pruned), &unbound, true),
        (Some(EdgeField::Pruned), &annotated, false),
        (Some(EdgeField::Kept), &unbound, false),
        (None, &unbound, false),
    ] {
        let opts =
            NetworkOptions { wiring: WiringOptions::default(), max_numa_networks: 0, validator: Some(crd_rules()) };
        let state = WebhookState::new(Arc::new(InMemoryJobs::new()), AdmissionOptions::default())
            .with_numa_networks(networks.clone(), opts)
            .with_pipeline_crd(Arc::new(FixedPipelineCrd(served)));
        let server = Webhook::start_with(state).await;
        let answer = server.review("/pipelines/validate", &pipeline_review(pipeline, None)).await;
        assert_eq!(answer["response"]["allowed"], true, "{answer}");
        let expected = if told { vec![FULL_CRD_WARNING.to_owned()] } else { vec![] };
        assert_eq!(warnings(&answer), expected, "served {served:?}");
        server.stop().await;
    }
}

#[tokio::test]
async fn a_variable_the_user_set_comes_back_as_a_warning() {
    let networks = Arc::new(InMemoryNumaNetworks::new());
    networks.insert(NN);
    let server = start(networks, 0).await;
    let mut p = video_pipeline();
    p["spec"]["vertices"][1]["udf"]["container"]["env"] =
        json!([{"name": "VERTEX_DOMAIN_TARGETS", "value": "x.example"}]);
    let review = pipeline_review(&p, None);
    let mutated = patched(&p, &server.review("/pipelines/mutate", &review).await);
    let filter = &mutated["spec"]["vertices"][1];
    assert_eq!(filter["udf"]["container"]["env"][0], json!({"name": "VERTEX_DOMAIN_TARGETS", "value": "x.example"}));
    assert_eq!(filter["metadata"]["annotations"][MANAGED_ENV_ANNOTATION], "VERTEX_DOMAIN");
    let answer = server.review("/pipelines/validate", &pipeline_review(&mutated, None)).await;
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
    let w = warnings(&answer);
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(
        w[0].starts_with(
            "spec.vertices[1].udf.container.env[0]: VERTEX_DOMAIN_TARGETS is set by the user to 'x.example'"
        ),
        "{w:?}"
    );
    server.stop().await;
}

#[tokio::test]
async fn numanetworks_are_capped_at_admission_and_checked_as_the_api_server_would() {
    let networks = Arc::new(InMemoryNumaNetworks::new());
    networks.insert("a");
    networks.insert("b");
    let server = start(networks.clone(), 2).await;

    // Two exist, the cap is two: a third is refused, naming both numbers.
    let (code, message) = denial(&server.review("/numanetworks/validate", &network_review(&network("c"), None)).await);
    assert_eq!(code, 403);
    assert_eq!(
        message,
        "NumaNetwork 'c' cannot be created: 2 NumaNetworks exist and at most 2 may (weft webhook --max-numa-networks=2); \
         delete one that is no longer used, or raise the cap"
    );
    assert_eq!(networks.lists(), 1, "counted with a LIST, not the watch cache");
    // Updating one that exists is not a create.
    let mut faster = network("a");
    faster["spec"]["refResourceClaimDranet"]["ethernetSpeed"] = json!(200);
    assert_unchanged(&server.review("/numanetworks/validate", &network_review(&faster, Some(&network("a")))).await);
    // Once one is deleted, the next fits.
    networks.remove("b");
    assert_unchanged(&server.review("/numanetworks/validate", &network_review(&network("c"), None)).await);

    // What the CRD's schema and CEL rules reject is rejected here too, every field named.
    let mut bad = network("d");
    bad["spec"]["refResourceClaimDranet"]["vlanTag"] = json!(4095);
    bad["spec"]["refResourceClaimDranet"]["ipRange"] = json!("192.168.10.5/24");
    let (code, message) = denial(&server.review("/numanetworks/validate", &network_review(&bad, None)).await);
    assert_eq!(code, 422);
    assert!(message.starts_with("NumaNetwork 'd' is invalid: "), "{message}");
    assert!(message.contains("spec.refResourceClaimDranet.vlanTag: 4095 is outside 1–4094"), "{message}");
    assert!(message.contains("spec.refResourceClaimDranet.ipRange: '192.168.10.5/24' has host bits set"), "{message}");
    // The transition rules: the range cannot change.
    let mut moved = network("a");
    moved["spec"]["refResourceClaimDranet"]["ipRange"] = json!("10.0.0.0/8");
    let (code, message) =
        denial(&server.review("/numanetworks/validate", &network_review(&moved, Some(&network("a")))).await);
    assert_eq!(code, 422);
    assert!(message.contains("spec.refResourceClaimDranet.ipRange") && message.contains("immutable"), "{message}");
    // A misspelled field the seed uses: the required one is missing.
    let mut typo = network("e");
    let spec = typo["spec"].as_object_mut().unwrap();
    let dranet = spec.remove("refResourceClaimDranet").unwrap();
    spec.insert("refResouceClaimDranet".into(), dranet);
    let (code, message) = denial(&server.review("/numanetworks/validate", &network_review(&typo, None)).await);
    assert_eq!(code, 422);
    assert!(message.contains("not a readable NumaNetwork") && message.contains("refResourceClaimDranet"), "{message}");

    // The count cannot be read: refused rather than admitted past the cap.
    networks.set_failing(true);
    let (code, message) = denial(&server.review("/numanetworks/validate", &network_review(&network("f"), None)).await);
    assert_eq!(code, 500);
    assert!(message.contains("counting NumaNetworks for the cap of 2"), "{message}");
    server.stop().await;
}

#[tokio::test]
async fn with_no_cap_any_number_may_be_created_without_listing() {
    let networks = Arc::new(InMemoryNumaNetworks::new());
    for i in 0..50 {
        networks.insert(&format!("n{i}"));
    }
    let server = start(networks.clone(), 0).await;
    assert_unchanged(&server.review("/numanetworks/validate", &network_review(&network("one-more"), None)).await);
    assert_eq!(networks.lists(), 0);
    server.stop().await;
}

#[tokio::test]
async fn paths_admit_only_their_kind_and_need_a_numanetwork_source() {
    let networks = Arc::new(InMemoryNumaNetworks::new());
    let server = start(networks, 0).await;
    let mut review = pipeline_review(&video_pipeline(), None);
    let (code, message) = denial(&server.review("/numanetworks/validate", &review).await);
    assert_eq!(code, 400);
    assert!(message.contains("/numanetworks/validate admits numaflow.numaproj.io NumaNetwork objects"), "{message}");
    review["request"]["operation"] = json!("DELETE");
    assert_unchanged(&server.review("/pipelines/validate", &review).await);
    server.stop().await;

    // A webhook started without a NumaNetwork source refuses rather than admitting unchecked.
    let server = Webhook::start(Arc::new(InMemoryJobs::new())).await;
    let (code, message) = denial(&server.review("/pipelines/mutate", &pipeline_review(&video_pipeline(), None)).await);
    assert_eq!(code, 500);
    assert!(message.contains("without a NumaNetwork source"), "{message}");
    server.stop().await;
}

#[test]
fn the_claim_name_is_the_template_name_the_numanetwork_controller_uses() {
    for name in [NN, "a", "x-y-z"] {
        assert_eq!(weft_pipeline::claim_name(name), weft_crds::resource_claim_template_name(name));
    }
}

#[tokio::test]
async fn readiness_waits_for_the_numanetwork_cache() {
    let networks = Arc::new(InMemoryNumaNetworks::new());
    networks.set_synced(false);
    let server = start(networks.clone(), 0).await;
    assert!(!server.ops.is_ready());
    assert!(format!("{:?}", server.ops.readiness()).contains("numanetworks"), "{:?}", server.ops.readiness());
    networks.set_synced(true);
    assert!(server.ops.is_ready());
    server.stop().await;
}
