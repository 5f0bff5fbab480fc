//! `pods/{name}/binding`, as the API server's BindingREST: what kube-scheduler (and an extender
//! with a bind verb) posts to put a pod on a node. Messages and codes follow upstream.
#![allow(clippy::unwrap_used)]

mod common;

use common::{api_message, pod, within};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{Value, json};
use weft_fakeapi::{FakeApiServer, Verb};

fn binding(name: &str, node: &str, uid: Option<&str>) -> Vec<u8> {
    let mut b = json!({
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": name, "annotations": {"weft.io/gpu-ids": "0,1"}},
        "target": {"kind": "Node", "name": node},
    });
    if let Some(uid) = uid {
        b["metadata"]["uid"] = json!(uid);
    }
    serde_json::to_vec(&b).unwrap()
}

async fn bind(api: &Api<Pod>, name: &str, body: Vec<u8>) -> Result<Value, kube::Error> {
    let body: Value = serde_json::from_slice(&body).unwrap();
    api.create_subresource::<Value, Value>("binding", name, &PostParams::default(), &body).await
}

#[tokio::test]
async fn a_binding_sets_the_node_the_annotations_and_pod_scheduled() {
    let server = FakeApiServer::start().await;
    let api: Api<Pod> = Api::namespaced(server.client(), "default");
    let created = within(api.create(&PostParams::default(), &pod("p", None, &[]))).await.unwrap();
    let uid = created.metadata.uid.clone().unwrap();

    let status = within(bind(&api, "p", binding("p", "n1", Some(&uid)))).await.unwrap();
    assert_eq!((status["kind"].as_str(), status["status"].as_str()), (Some("Status"), Some("Success")));
    let got = within(api.get("p")).await.unwrap();
    assert_eq!(got.spec.as_ref().unwrap().node_name.as_deref(), Some("n1"));
    assert_eq!(got.metadata.annotations.as_ref().unwrap()["weft.io/gpu-ids"], "0,1");
    let conditions = got.status.as_ref().unwrap().conditions.as_ref().unwrap();
    assert!(conditions.iter().any(|c| c.type_ == "PodScheduled" && c.status == "True"), "{conditions:?}");
    assert!(
        server.requests().iter().any(|r| r.verb == Verb::Create && r.rbac_resource() == "pods/binding"),
        "RBAC sees create on pods/binding"
    );
}

#[tokio::test]
async fn a_bound_pod_cannot_be_bound_again() {
    let server = FakeApiServer::start().await;
    let api: Api<Pod> = Api::namespaced(server.client(), "default");
    within(api.create(&PostParams::default(), &pod("p", None, &[]))).await.unwrap();
    within(bind(&api, "p", binding("p", "n1", None))).await.unwrap();
    let (code, message) = api_message(within(bind(&api, "p", binding("p", "n2", None))).await);
    assert_eq!(code, 409);
    assert_eq!(
        message,
        "Operation cannot be fulfilled on pods/binding \"p\": pod p is already assigned to node \"n1\""
    );
    assert_eq!(within(api.get("p")).await.unwrap().spec.unwrap().node_name.as_deref(), Some("n1"));
}

#[tokio::test]
async fn a_binding_for_a_recreated_pod_fails_its_uid_precondition() {
    let server = FakeApiServer::start().await;
    let api: Api<Pod> = Api::namespaced(server.client(), "default");
    within(api.create(&PostParams::default(), &pod("p", None, &[]))).await.unwrap();
    let (code, message) = api_message(within(bind(&api, "p", binding("p", "n1", Some("old-uid")))).await);
    assert_eq!(code, 409);
    assert!(message.contains("Precondition failed: UID in precondition: old-uid"), "{message}");
    assert_eq!(within(api.get("p")).await.unwrap().spec.unwrap().node_name, None, "nothing was written");
}

#[tokio::test]
async fn bad_bindings_and_pods_that_cannot_be_bound_are_refused_with_upstreams_reasons() {
    let server = FakeApiServer::start().await;
    let api: Api<Pod> = Api::namespaced(server.client(), "default");
    let mut gated = pod("gated", None, &[]);
    gated.spec.as_mut().unwrap().scheduling_gates =
        Some(vec![k8s_openapi::api::core::v1::PodSchedulingGate { name: "example.com/wait".into() }]);
    within(api.create(&PostParams::default(), &gated)).await.unwrap();
    let (code, message) = api_message(within(bind(&api, "gated", binding("gated", "n1", None))).await);
    assert_eq!(
        (code, message.as_str()),
        (409, "Operation cannot be fulfilled on pods/binding \"gated\": pod gated has non-empty .spec.schedulingGates")
    );

    let (code, message) = api_message(within(bind(&api, "gated", binding("other", "n1", None))).await);
    assert_eq!((code, message.as_str()), (400, "name in URL does not match name in Binding object"));

    let mut wrong_kind: Value = serde_json::from_slice(&binding("gated", "n1", None)).unwrap();
    wrong_kind["target"]["kind"] = json!("Pod");
    let (code, message) = api_message(within(bind(&api, "gated", serde_json::to_vec(&wrong_kind).unwrap())).await);
    assert_eq!(code, 422);
    assert!(message.contains("target.kind: Unsupported value: \"Pod\""), "{message}");

    let (code, _) = api_message(within(bind(&api, "missing", binding("missing", "n1", None))).await);
    assert_eq!(code, 404);

    // A terminating pod (a finalizer holds it) cannot get a node.
    let mut held = pod("held", None, &[]);
    held.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    within(api.create(&PostParams::default(), &held)).await.unwrap();
    within(api.delete("held", &DeleteParams::default())).await.unwrap();
    let (code, message) = api_message(within(bind(&api, "held", binding("held", "n1", None))).await);
    assert_eq!(
        (code, message.as_str()),
        (
            409,
            "Operation cannot be fulfilled on pods/binding \"held\": pod held is being deleted, cannot be assigned to a host"
        )
    );
}
