//! kube-runtime machinery end to end against the fake: a Controller with the finalizer helper and
//! the events Recorder, and Lease-based leader election (kube-lease-manager).
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{cm, within};
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::finalizer::{self, finalizer};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use kube_lease_manager::{LeaseCreateMode, LeaseManager, LeaseParams};
use serde_json::{Value, json};
use weft_fakeapi::{FakeApiServer, RequestMatcher, Verb};

const FINALIZER: &str = "weft.io/test-cleanup";

struct Ctx {
    client: kube::Client,
    recorder: Recorder,
}

type ReconcileError = finalizer::Error<kube::Error>;

async fn reconcile(obj: Arc<ConfigMap>, ctx: Arc<Ctx>) -> Result<Action, ReconcileError> {
    let ns = obj.namespace().unwrap_or_default();
    let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &ns);
    finalizer(&api, FINALIZER, obj, |event| async {
        let (cm, reason) = match event {
            finalizer::Event::Apply(cm) => {
                let p = json!({ "metadata": { "annotations": { "weft.io/reconciled": "true" } } });
                let pp = PatchParams { field_manager: Some("weft-test-controller".into()), ..Default::default() };
                api.patch(&cm.name_any(), &pp, &Patch::Merge(&p)).await?;
                (cm, "Reconciled")
            }
            finalizer::Event::Cleanup(cm) => (cm, "CleanedUp"),
        };
        let ev = Event {
            type_: EventType::Normal,
            reason: reason.into(),
            note: None,
            action: "Test".into(),
            secondary: None,
        };
        ctx.recorder.publish(&ev, &cm.object_ref(&())).await?;
        Ok(Action::await_change())
    })
    .await
}

fn error_policy(_obj: Arc<ConfigMap>, _err: &ReconcileError, _ctx: Arc<Ctx>) -> Action {
    Action::requeue(Duration::from_millis(50))
}

fn event_reasons(server: &FakeApiServer) -> Vec<String> {
    server
        .list("events.events.k8s.io", Some("default"))
        .iter()
        .filter_map(|e| e["reason"].as_str().map(str::to_owned))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_with_finalizer_and_recorder_runs_end_to_end() {
    let server = FakeApiServer::start().await;
    let client = server.client();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let reporter = Reporter { controller: "weft-test".into(), instance: Some("pod-0".into()) };
    let ctx = Arc::new(Ctx { client: client.clone(), recorder: Recorder::new(client.clone(), reporter) });
    // The first finalizer patch hits a conflict; the controller must retry.
    server.fail_next(RequestMatcher::new(Verb::Patch, "configmaps"), 409, 1);
    let controller = tokio::spawn(
        Controller::new(api.clone(), watcher::Config::default())
            .run(reconcile, error_policy, ctx)
            .for_each(|_| async {}),
    );

    within(api.create(&PostParams::default(), &cm("x", &[]))).await.unwrap();
    let reconciled = within(server.wait_for_object("configmaps", Some("default"), "x", |v| {
        v["metadata"]["annotations"]["weft.io/reconciled"] == "true"
    }))
    .await;
    assert_eq!(reconciled["metadata"]["finalizers"], json!([FINALIZER]));
    within(server.wait_for(|s| event_reasons(s).contains(&"Reconciled".to_owned()))).await;

    within(api.delete("x", &DeleteParams::default())).await.unwrap();
    within(server.wait_for(|s| s.get("configmaps", Some("default"), "x").is_none())).await;
    within(server.wait_for(|s| event_reasons(s).contains(&"CleanedUp".to_owned()))).await;

    let requests = server.requests();
    assert!(requests.iter().any(|r| r.verb == Verb::Patch && r.resource == "configmaps" && r.code == 409));
    assert!(requests.iter().any(|r| r.verb == Verb::Create && r.group == "events.k8s.io" && r.resource == "events"));
    assert!(requests.iter().any(|r| r.verb == Verb::Watch && r.resource == "configmaps"));
    controller.abort();
}

fn holder(server: &FakeApiServer) -> Value {
    server
        .get("leases.coordination.k8s.io", Some("default"), "weft-leader")
        .map(|l| l["spec"]["holderIdentity"].clone())
        .unwrap_or(Value::Null)
}

#[tokio::test]
async fn lease_leader_election_elects_one_leader_and_hands_over() {
    let server = FakeApiServer::start().await;
    let manager = |id: &'static str| {
        LeaseManager::new(
            server.client(),
            "weft-leader",
            "default",
            LeaseParams::new(id, 2, 1),
            LeaseCreateMode::AutoCreate,
        )
    };
    let (a, b) = within(async { (manager("a").await.unwrap(), manager("b").await.unwrap()) }).await;
    let (mut rx_a, task_a) = a.watch().await;
    let (mut rx_b, task_b) = b.watch().await;

    within(async {
        while !*rx_a.borrow_and_update() && !*rx_b.borrow_and_update() {
            tokio::select! {
                r = rx_a.changed() => r.unwrap(),
                r = rx_b.changed() => r.unwrap(),
            }
        }
    })
    .await;
    let (a_leads, b_leads) = (*rx_a.borrow(), *rx_b.borrow());
    assert!(a_leads != b_leads, "exactly one leader (a: {a_leads}, b: {b_leads})");
    let (leader, follower) = if a_leads { ("a", "b") } else { ("b", "a") };
    assert_eq!(holder(&server), leader);

    // The leader steps down: dropping its receiver makes its task release the lease.
    let (leader_rx, mut follower_rx) = if a_leads { (rx_a, rx_b) } else { (rx_b, rx_a) };
    drop(leader_rx);
    within(async {
        while !*follower_rx.borrow_and_update() {
            follower_rx.changed().await.unwrap();
        }
    })
    .await;
    assert_eq!(holder(&server), follower);
    let lease = server.get("leases.coordination.k8s.io", Some("default"), "weft-leader").unwrap();
    assert!(lease["spec"]["leaseTransitions"].as_i64().unwrap() >= 2, "{lease}");
    task_a.abort();
    task_b.abort();
}
