//! The controller skeleton, the NumaNetwork controller and leader election, run for real (kube-runtime
//! `Controller`, finalizer helper, Event recorder, Lease manager) against the fake API server over
//! HTTP. No sleeps: waits are on the fake's change notifications or the controller's reconcile
//! counter, each under a hang guard.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use weft_testkit as common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::controller::{Running, fast_settings, guard};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use weft_crds::numanetwork_controller;
use weft_crds::{DeviceClassReference, DranetClaimParameters, NumaNetwork, NumaNetworkSpec};
use weft_fakeapi::{FakeApiServer, RequestMatcher, Verb};
use weft_kube::controller::{self, Context, ControllerMetrics, Reconciler, Scope};
use weft_kube::leader::{self, LeaderConfig, LeaderError};
use weft_kube::write::{Part, RetryPolicy, update_with_retry};

fn config_map(name: &str) -> ConfigMap {
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some(name.to_string());
    cm.metadata.namespace = Some("ns".to_string());
    cm.metadata.labels = Some([("managed".to_string(), "yes".to_string())].into_iter().collect());
    cm.data = Some([("k".to_string(), "v".to_string())].into_iter().collect());
    cm
}

fn start<R: Reconciler<ConfigMap>>(client: Client, reconciler: Arc<R>, name: &'static str) -> Running {
    let metrics = ControllerMetrics::default();
    let ctx = Context::new(client.clone(), "weft-test", Some("t-0".into()), "weft-test", metrics.clone());
    let stop = CancellationToken::new();
    let s = stop.clone();
    let api: Api<ConfigMap> = Api::namespaced(client, "ns");
    // Only the objects under test: the reconcilers' own side objects are not theirs to manage.
    let task = tokio::spawn(controller::run(
        api,
        watcher::Config::default().labels("managed=yes"),
        Scope::namespaced(),
        reconciler,
        ctx,
        fast_settings(name),
        async move { s.cancelled().await },
    ));
    Running { metrics, stop, task }
}

/// Counts applies and cleanups per object; cleanup "removes" external state (a ConfigMap
/// `<name>-external` created by apply), so a cleanup that runs twice would be visible.
#[derive(Default)]
struct Counting {
    applies: Mutex<HashMap<String, u32>>,
    cleanups: Mutex<HashMap<String, u32>>,
}

impl Reconciler<ConfigMap> for Counting {
    type Error = kube::Error;

    fn finalizer(&self) -> Option<&str> {
        Some("test.weft.io/cleanup")
    }

    async fn apply(&self, cm: Arc<ConfigMap>, ctx: &Context) -> Result<Action, kube::Error> {
        *self.applies.lock().unwrap().entry(cm.name_any()).or_default() += 1;
        let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), "ns");
        let external = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": format!("{}-external", cm.name_any())}});
        api.patch(
            &format!("{}-external", cm.name_any()),
            &PatchParams::apply(&ctx.field_manager),
            &Patch::Apply(external),
        )
        .await?;
        Ok(Action::await_change())
    }

    async fn cleanup(&self, cm: Arc<ConfigMap>, ctx: &Context) -> Result<Action, kube::Error> {
        *self.cleanups.lock().unwrap().entry(cm.name_any()).or_default() += 1;
        let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), "ns");
        api.delete(&format!("{}-external", cm.name_any()), &DeleteParams::default()).await?;
        Ok(Action::await_change())
    }
}

#[tokio::test]
async fn finalizer_is_added_first_and_cleanup_runs_once_on_delete() {
    let server = FakeApiServer::start().await;
    let client = server.client();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "ns");
    let r = Arc::new(Counting::default());
    let running = start(client, r.clone(), "counting");
    api.create(&PostParams::default(), &config_map("a")).await.unwrap();

    let with_finalizer = |v: &Value| v["metadata"]["finalizers"] == json!(["test.weft.io/cleanup"]);
    guard("the finalizer", server.wait_for_object("configmaps", Some("ns"), "a", with_finalizer)).await;
    guard("the external object", server.wait_for_object("configmaps", Some("ns"), "a-external", |_| true)).await;

    // A change while it lives: apply again, never cleanup.
    api.patch("a", &PatchParams::default(), &Patch::Merge(json!({"data": {"k": "w"}}))).await.unwrap();
    guard("a second apply", server.wait_for(|_| r.applies.lock().unwrap().get("a") == Some(&2))).await;

    api.delete("a", &DeleteParams::default()).await.unwrap();
    guard("the object to go", server.wait_for(|s| s.get("configmaps", Some("ns"), "a").is_none())).await;
    running.stop().await;
    assert_eq!(r.cleanups.lock().unwrap().get("a"), Some(&1), "cleanup ran exactly once");
    assert!(server.get("configmaps", Some("ns"), "a-external").is_none(), "cleanup removed the external state");
    // The finalizer was added by a JSON patch before the first apply wrote anything.
    let reqs = server.requests();
    let first_finalizer_patch =
        reqs.iter().position(|r| r.verb == Verb::Patch && r.name.as_deref() == Some("a")).expect("finalizer patch");
    let first_external_write = reqs.iter().position(|r| r.name.as_deref() == Some("a-external")).expect("external");
    assert!(first_finalizer_patch < first_external_write, "finalizer before external state");
}

#[tokio::test]
async fn failed_cleanup_keeps_the_finalizer_and_is_retried_until_it_succeeds() {
    let server = FakeApiServer::start().await;
    let client = server.client();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "ns");
    let r = Arc::new(Counting::default());
    let running = start(client, r.clone(), "counting");
    api.create(&PostParams::default(), &config_map("b")).await.unwrap();
    guard("the external object", server.wait_for_object("configmaps", Some("ns"), "b-external", |_| true)).await;

    // The first two deletes of the external object fail with 500: cleanup fails twice, the object
    // stays (finalizer kept), Events are recorded, then the third cleanup succeeds.
    server.fail_next(RequestMatcher::new(Verb::Delete, "configmaps").name("b-external"), 500, 2);
    api.delete("b", &DeleteParams::default()).await.unwrap();
    guard("the object to go", server.wait_for(|s| s.get("configmaps", Some("ns"), "b").is_none())).await;
    running.stop().await;
    assert_eq!(r.cleanups.lock().unwrap().get("b"), Some(&3), "two failures, one success");
    guard(
        "a ReconcileFailed Event",
        server.wait_for(|s| s.list("events.events.k8s.io", None).iter().any(|e| e["reason"] == "ReconcileFailed")),
    )
    .await;
}

/// Blocks in `apply` until released, then writes to the object.
struct Gated {
    entered: Notify,
    release: Notify,
}

impl Reconciler<ConfigMap> for Gated {
    type Error = kube::Error;

    async fn apply(&self, cm: Arc<ConfigMap>, ctx: &Context) -> Result<Action, kube::Error> {
        self.entered.notify_one();
        self.release.notified().await;
        let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), "ns");
        api.patch(&cm.name_any(), &PatchParams::default(), &Patch::Merge(json!({"data": {"seen": "yes"}}))).await?;
        Ok(Action::await_change())
    }
}

#[tokio::test]
async fn object_deleted_mid_reconcile_is_not_an_error() {
    let server = FakeApiServer::start().await;
    let client = server.client();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "ns");
    let r = Arc::new(Gated { entered: Notify::new(), release: Notify::new() });
    let running = start(client, r.clone(), "gated");
    api.create(&PostParams::default(), &config_map("c")).await.unwrap();
    guard("apply to start", r.entered.notified()).await;
    api.delete("c", &DeleteParams::default()).await.unwrap();
    r.release.notify_one();
    running.reconciled(1).await;
    let metrics = running.metrics.clone();
    running.stop().await;
    assert_eq!(metrics.reconciles("gated", "error"), 0, "a 404 on a deleted object is not a failure");
    assert_eq!(metrics.reconciles("gated", "success"), 1);
    assert!(server.list("events.events.k8s.io", None).is_empty(), "no Warning Event for a deleted object");
}

#[tokio::test]
async fn a_real_failure_is_retried_with_backoff_and_reported_as_an_event() {
    let server = FakeApiServer::start().await;
    let client = server.client();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "ns");
    let r = Arc::new(Gated { entered: Notify::new(), release: Notify::new() });
    // Three failing writes, then success.
    server.fail_next(RequestMatcher::new(Verb::Patch, "configmaps").name("d"), 500, 3);
    let running = start(client, r.clone(), "gated");
    api.create(&PostParams::default(), &config_map("d")).await.unwrap();
    for _ in 0..4 {
        guard("an apply", r.entered.notified()).await;
        r.release.notify_one();
    }
    guard("the write", server.wait_for_object("configmaps", Some("ns"), "d", |v| v["data"]["seen"] == "yes")).await;
    guard("the Warning Event", server.wait_for(|s| !s.list("events.events.k8s.io", None).is_empty())).await;
    let metrics = running.metrics.clone();
    running.stop().await;
    assert_eq!(metrics.reconciles("gated", "error"), 3);
    assert_eq!(metrics.reconciles("gated", "success"), 1);
    let events = server.list("events.events.k8s.io", None);
    assert!(events.iter().all(|e| e["type"] == "Warning" && e["reason"] == "ReconcileFailed"), "{events:#?}");
    assert_eq!(events[0]["regarding"]["name"], "d");
}

// ----- NumaNetwork controller -----

async fn install_crds(client: &Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in weft_crds::all() {
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
}

fn network(name: &str, ip_range: &str) -> NumaNetwork {
    NumaNetwork::new(
        name,
        NumaNetworkSpec {
            ref_device_class: DeviceClassReference { name: "vf.nvidia.dra.net".into() },
            ref_resource_claim_dranet: DranetClaimParameters {
                ip_range: ip_range.into(),
                ethernet_speed: Some(100),
                vlan_tag: Some(10),
            },
        },
    )
}

fn start_numanetwork(client: Client) -> Running {
    let metrics = ControllerMetrics::default();
    let ctx = Context::new(client, "weft-controller", Some("c-0".into()), "weft-controller", metrics.clone());
    let stop = CancellationToken::new();
    let s = stop.clone();
    let task =
        tokio::spawn(numanetwork_controller::run(ctx, fast_settings(numanetwork_controller::NAME), async move {
            s.cancelled().await
        }));
    Running { metrics, stop, task }
}

fn accepted(v: &Value) -> Option<(String, i64)> {
    let c = v["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == "Accepted")?;
    Some((c["status"].as_str()?.to_string(), v["status"]["observedGeneration"].as_i64()?))
}

fn status_writes(server: &FakeApiServer) -> Vec<String> {
    server
        .requests()
        .iter()
        .filter(|r| r.resource == "numanetworks" && r.subresource.as_deref() == Some("status"))
        .filter(|r| matches!(r.verb, Verb::Update | Verb::Patch))
        .filter_map(|r| r.name.clone())
        .collect()
}

#[tokio::test]
async fn numanetwork_controller_records_verdicts_and_resumes_from_api_state_after_restart() {
    let server = FakeApiServer::start().await;
    let client = server.client();
    install_crds(&client).await;
    let nets: Api<NumaNetwork> = Api::all(client.clone());
    nets.create(&PostParams::default(), &network("good", "192.168.10.0/24")).await.unwrap();
    // Bypass the CRD schema, as an object stored before a rule existed would: host bits set.
    server.insert(serde_json::to_value(network("bad", "192.168.10.7/24")).unwrap()).unwrap();

    let first = start_numanetwork(client.clone());
    let good =
        guard("good judged", server.wait_for_object("numanetworks", None, "good", |v| accepted(v).is_some())).await;
    let bad = guard("bad judged", server.wait_for_object("numanetworks", None, "bad", |v| accepted(v).is_some())).await;
    assert_eq!(accepted(&good), Some(("True".into(), 1)));
    assert_eq!(accepted(&bad).unwrap().0, "False");
    let bad_condition = &bad["status"]["conditions"][0];
    assert!(bad_condition["message"].as_str().unwrap().contains("spec.refResourceClaimDranet.ipRange"));
    guard(
        "the InvalidSpec Event",
        server.wait_for(|s| s.list("events.events.k8s.io", None).iter().any(|e| e["reason"] == "InvalidSpec")),
    )
    .await;
    first.stop().await;

    // While no controller runs: one spec changes, one network is added.
    nets.patch(
        "good",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"refResourceClaimDranet": {"ethernetSpeed": 200}}})),
    )
    .await
    .unwrap();
    nets.create(&PostParams::default(), &network("new", "fd00:10::/64")).await.unwrap();
    server.clear_requests();

    // A fresh controller, with no memory of the first, works from what the API server holds.
    let second = start_numanetwork(client.clone());
    second.reconciled(3).await;
    guard(
        "good re-judged",
        server.wait_for_object("numanetworks", None, "good", |v| accepted(v) == Some(("True".into(), 2))),
    )
    .await;
    guard("new judged", server.wait_for_object("numanetworks", None, "new", |v| accepted(v).is_some())).await;
    second.stop().await;
    let mut written = status_writes(&server);
    written.sort();
    assert_eq!(written, ["good", "new"], "the unchanged, already judged network is not written again");
    common::rbac::assert_granted(&server.requests(), &["base/controller/rbac.yaml"]);
}

#[tokio::test]
async fn conflict_storm_two_controllers_and_a_spec_writer_converge_without_lost_updates() {
    let server = FakeApiServer::start().await;
    let client = server.client();
    install_crds(&client).await;
    let nets: Api<NumaNetwork> = Api::all(client.clone());
    nets.create(&PostParams::default(), &network("storm", "10.0.0.0/8")).await.unwrap();
    // Split brain on purpose: two controllers write the same status at once.
    let a = start_numanetwork(client.clone());
    let b = start_numanetwork(client.clone());
    // A third writer changes the spec over and over, alternating valid and invalid ranges.
    for i in 0..20 {
        let range = if i % 2 == 0 { "10.0.0.1/8" } else { "10.0.0.0/8" };
        nets.patch(
            "storm",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"refResourceClaimDranet": {"ipRange": range, "ethernetSpeed": 100 + i}}})),
        )
        .await
        .unwrap();
    }
    let generation = server.get("numanetworks", None, "storm").unwrap()["metadata"]["generation"].as_i64().unwrap();
    assert_eq!(generation, 21);
    let done = guard(
        "the status to catch up with the last spec",
        server.wait_for_object("numanetworks", None, "storm", |v| accepted(v).is_some_and(|(_, g)| g == generation)),
    )
    .await;
    a.stop().await;
    b.stop().await;
    assert_eq!(accepted(&done), Some(("True".into(), 21)), "the last spec (valid) is what the status says");
}

#[tokio::test]
async fn update_with_retry_loses_no_update_between_two_writers() {
    let server = FakeApiServer::start().await;
    let api: Api<ConfigMap> = Api::namespaced(server.client(), "ns");
    let mut cm = config_map("counter");
    cm.data = Some([("n".to_string(), "0".to_string())].into_iter().collect());
    api.create(&PostParams::default(), &cm).await.unwrap();
    let increment = |api: Api<ConfigMap>| async move {
        for _ in 0..25 {
            update_with_retry(&api, "counter", Part::Object, &PostParams::default(), &RetryPolicy::conflicts(), |cm| {
                let data = cm.data.get_or_insert_default();
                let n: u32 = data.get("n").and_then(|v| v.parse().ok()).unwrap_or(0);
                data.insert("n".into(), (n + 1).to_string());
                true
            })
            .await
            .unwrap()
            .unwrap();
        }
    };
    let (x, y) = tokio::join!(tokio::spawn(increment(api.clone())), tokio::spawn(increment(api.clone())));
    x.unwrap();
    y.unwrap();
    let stored = server.get("configmaps", Some("ns"), "counter").unwrap();
    assert_eq!(stored["data"]["n"], "50", "every increment survived");

    // Deterministically: a write that meets three conflicts re-reads each time, then succeeds.
    server.fail_next(RequestMatcher::new(Verb::Update, "configmaps").name("counter"), 409, 3);
    server.clear_requests();
    update_with_retry(&api, "counter", Part::Object, &PostParams::default(), &RetryPolicy::conflicts(), |cm| {
        cm.data.get_or_insert_default().insert("n".into(), "done".into());
        true
    })
    .await
    .unwrap();
    let verbs: Vec<Verb> = server.requests().iter().map(|r| r.verb).collect();
    assert_eq!(verbs, [Verb::Get, Verb::Update].repeat(4));
}

#[tokio::test]
async fn controller_keeps_working_after_its_watch_is_dropped() {
    let server = FakeApiServer::start().await;
    let client = server.client();
    install_crds(&client).await;
    let nets: Api<NumaNetwork> = Api::all(client.clone());
    nets.create(&PostParams::default(), &network("w", "10.1.0.0/16")).await.unwrap();
    let running = start_numanetwork(client.clone());
    guard("judged", server.wait_for_object("numanetworks", None, "w", |v| accepted(v).is_some())).await;
    server.drop_watches();
    nets.patch(
        "w",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"refResourceClaimDranet": {"ipRange": "10.1.0.1/16"}}})),
    )
    .await
    .unwrap();
    let v = guard(
        "re-judged after reconnect",
        server.wait_for_object("numanetworks", None, "w", |v| accepted(v).is_some_and(|(_, g)| g == 2)),
    )
    .await;
    running.stop().await;
    assert_eq!(accepted(&v).unwrap().0, "False");
}

// ----- leader election -----

fn candidate(
    server: &FakeApiServer,
    identity: &str,
) -> (CancellationToken, Arc<Notify>, tokio::task::JoinHandle<Result<(), LeaderError>>) {
    let mut cfg = LeaderConfig::new("weft-controller", "weft-system", identity);
    cfg.lease_duration = Duration::from_secs(3);
    cfg.renew_grace = Duration::from_secs(1);
    let shutdown = CancellationToken::new();
    let started = Arc::new(Notify::new());
    let (client, s, st) = (server.client(), shutdown.clone(), started.clone());
    let gauge = prometheus_client::metrics::gauge::Gauge::default();
    let task = tokio::spawn(async move {
        leader::run_as_leader(client, &cfg, gauge, s, move |stop| async move {
            st.notify_one();
            stop.cancelled().await;
        })
        .await
    });
    (shutdown, started, task)
}

fn holder(server: &FakeApiServer) -> Option<String> {
    let lease = server.get("leases", Some("weft-system"), "weft-controller")?;
    lease["spec"]["holderIdentity"].as_str().map(String::from)
}

#[tokio::test]
async fn one_leader_at_a_time_and_a_released_lease_passes_to_the_standby() {
    let server = FakeApiServer::start().await;
    let (stop_a, started_a, task_a) = candidate(&server, "replica-a");
    guard("a to lead", started_a.notified()).await;
    assert_eq!(holder(&server).as_deref(), Some("replica-a"));

    let (stop_b, started_b, task_b) = candidate(&server, "replica-b");
    // b waits as a standby while a renews; a's shutdown releases the Lease and b takes it.
    stop_a.cancel();
    guard("a to stop", task_a).await.unwrap().unwrap();
    guard("b to lead", started_b.notified()).await;
    assert_eq!(holder(&server).as_deref(), Some("replica-b"));
    stop_b.cancel();
    guard("b to stop", task_b).await.unwrap().unwrap();
    common::rbac::assert_granted(&server.requests(), &["base/controller/rbac.yaml"]);
}

// ----- NumaNetwork templates -----

/// Numaflow's Pipeline CRD as the fake API server needs it (names, scope, version served).
async fn install_pipeline_crd(client: &Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "pipelines.numaflow.numaproj.io"},
        "spec": {
            "group": "numaflow.numaproj.io", "scope": "Namespaced",
            "names": {"plural": "pipelines", "singular": "pipeline", "kind": "Pipeline", "listKind": "PipelineList"},
            "versions": [{"name": "v1alpha1", "served": true, "storage": true,
                          "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
                          "subresources": {"status": {}}}]
        }
    }))
    .unwrap();
    crds.create(&PostParams::default(), &crd).await.unwrap();
}

fn pipeline(name: &str, network: &str) -> Value {
    json!({
        "apiVersion": "numaflow.numaproj.io/v1alpha1", "kind": "Pipeline",
        "metadata": {"name": name},
        "spec": {
            "vertices": [{"name": "a", "udf": {}}, {"name": "b", "udf": {}}],
            "edges": [{"from": "a", "to": "b", "numaNetwork": {"name": network, "connectionType": "direct"}}]
        }
    })
}

fn ready(v: &Value) -> Option<(String, String)> {
    let c = v["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == "Ready")?;
    Some((c["status"].as_str()?.to_string(), c["reason"].as_str()?.to_string()))
}

#[tokio::test]
async fn numanetwork_templates_follow_the_pipelines_that_use_the_network() {
    let server = FakeApiServer::start().await;
    let client = server.client();
    install_crds(&client).await;
    install_pipeline_crd(&client).await;
    let nets: Api<NumaNetwork> = Api::all(client.clone());
    nets.create(&PostParams::default(), &network("net-a", "192.168.10.0/24")).await.unwrap();
    server.clear_requests();
    let running = start_numanetwork(client.clone());

    // No DeviceClass yet, no pipeline: nothing to make, and the network says why it is not ready.
    let v = guard(
        "DeviceClassNotFound",
        server.wait_for_object("numanetworks", None, "net-a", |v| {
            ready(v).is_some_and(|(_, r)| r == "DeviceClassNotFound")
        }),
    )
    .await;
    assert_eq!(ready(&v), Some(("False".into(), "DeviceClassNotFound".into())));
    assert_eq!(v["status"]["resourceClaimTemplate"], "net-a-rct");

    // Test-side writes go straight to the store (not recorded: the RBAC check is about the controller).
    server
        .insert(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "vf.nvidia.dra.net"},
            "spec": {"selectors": [{"cel": {"expression": "device.driver == \"nic.weft.io\""}}]}
        }))
        .unwrap();
    // Two pipelines in namespace video, one in batch, all on net-a; one elsewhere on another net.
    for (ns, name, net) in
        [("video", "p1", "net-a"), ("video", "p2", "net-a"), ("batch", "p3", "net-a"), ("other", "p4", "net-z")]
    {
        let mut p = pipeline(name, net);
        p["metadata"]["namespace"] = json!(ns);
        server.insert(p).unwrap();
    }
    let v = guard(
        "templates in video and batch",
        server.wait_for_object("numanetworks", None, "net-a", |v| {
            ready(v).is_some_and(|(s, _)| s == "True") && v["status"]["namespaces"] == json!(["batch", "video"])
        }),
    )
    .await;
    assert_eq!(ready(&v), Some(("True".into(), "TemplatesReady".into())));
    let t = server.get("resourceclaimtemplates", Some("video"), "net-a-rct").expect("template in video");
    assert!(server.get("resourceclaimtemplates", Some("batch"), "net-a-rct").is_some());
    assert!(server.get("resourceclaimtemplates", Some("other"), "net-a-rct").is_none());
    let devices = &t["spec"]["spec"]["devices"];
    assert_eq!(devices["requests"][0]["exactly"]["deviceClassName"], "vf.nvidia.dra.net");
    assert_eq!(devices["config"][0]["opaque"]["driver"], "nic.weft.io");
    assert_eq!(devices["config"][0]["opaque"]["parameters"]["ipRange"], "192.168.10.0/24");
    assert_eq!(devices["config"][0]["opaque"]["parameters"]["vlan"], 10);
    let uid = server.get("numanetworks", None, "net-a").unwrap()["metadata"]["uid"].clone();
    assert_eq!(t["metadata"]["ownerReferences"][0]["uid"], uid);

    // The last pipeline in batch goes: so does the template there.
    server.remove("pipelines", Some("batch"), "p3").unwrap();
    guard(
        "template gone from batch",
        server.wait_for_object("numanetworks", None, "net-a", |v| v["status"]["namespaces"] == json!(["video"])),
    )
    .await;
    assert!(server.get("resourceclaimtemplates", Some("batch"), "net-a-rct").is_none());
    assert!(server.get("resourceclaimtemplates", Some("video"), "net-a-rct").is_some());

    // A template deleted by hand comes back.
    server.remove("resourceclaimtemplates", Some("video"), "net-a-rct").unwrap();
    guard(
        "template back in video",
        server.wait_for_object("resourceclaimtemplates", Some("video"), "net-a-rct", |_| true),
    )
    .await;
    running.stop().await;
    common::rbac::assert_granted(&server.requests(), &["base/controller/rbac.yaml"]);
}

fn address(network: &str, ip: &str, claim_ns: &str, claim: &str, uid: &str) -> Value {
    json!({
        "apiVersion": "weft.io/v1alpha1", "kind": "NetworkAddress",
        "metadata": {"name": format!("{network}.{}", ip.replace('.', "-")),
                     "labels": {"weft.io/network": network, "weft.io/claim-uid": uid}},
        "spec": {"network": network, "address": ip, "node": "n1",
                 "claim": {"namespace": claim_ns, "name": claim, "uid": uid}}
    })
}

#[tokio::test]
async fn numanetwork_status_counts_addresses_and_collects_those_whose_claim_is_gone() {
    let server = FakeApiServer::start().await;
    let client = server.client();
    install_crds(&client).await;
    install_pipeline_crd(&client).await;
    server.clear_requests();
    server
        .insert(json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                       "metadata": {"name": "pod-a-nic", "namespace": "video", "uid": "claim-a"}, "spec": {}}))
        .unwrap();
    server
        .insert(json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                       "metadata": {"name": "dranet-claim", "namespace": "video", "uid": "claim-d",
                                    "labels": {"weft.io/numa-network": "net-a"}}, "spec": {}}))
        .unwrap();
    // Held by a live claim; by a claim that is gone; by a claim of the same name but another UID;
    // by a live claim known only by UID (dranet's profile provider); and by a gone one of those.
    server.insert(address("net-a", "192.168.10.1", "video", "pod-a-nic", "claim-a")).unwrap();
    server.insert(address("net-a", "192.168.10.2", "video", "pod-b-nic", "claim-b")).unwrap();
    server.insert(address("net-a", "192.168.10.3", "video", "pod-a-nic", "claim-old")).unwrap();
    server.insert(address("net-a", "192.168.10.4", "", "", "claim-d")).unwrap();
    server.insert(address("net-a", "192.168.10.5", "", "", "claim-e")).unwrap();
    let nets: Api<NumaNetwork> = Api::all(client.clone());
    nets.create(&PostParams::default(), &network("net-a", "192.168.10.0/24")).await.unwrap();
    server.clear_requests();
    let running = start_numanetwork(client.clone());
    let v = guard(
        "address usage",
        server.wait_for_object("numanetworks", None, "net-a", |v| !v["status"]["addresses"].is_null()),
    )
    .await;
    assert_eq!(v["status"]["addresses"], json!({"allocated": 2, "size": 254, "usage": "2/254"}));
    let left: Vec<String> = server
        .list("networkaddresses", None)
        .iter()
        .map(|a| a["spec"]["address"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(left, ["192.168.10.1", "192.168.10.4"]);

    // A new address is counted.
    server.insert(address("net-a", "192.168.10.9", "video", "pod-a-nic", "claim-a")).unwrap();
    guard(
        "usage 3",
        server.wait_for_object("numanetworks", None, "net-a", |v| v["status"]["addresses"]["allocated"] == 3),
    )
    .await;
    running.stop().await;
    common::rbac::assert_granted(&server.requests(), &["base/controller/rbac.yaml"]);
}
