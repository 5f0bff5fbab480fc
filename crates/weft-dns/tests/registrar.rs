//! The registrar end to end: the real controller skeleton (kube-runtime Controller, finalizer
//! helper, Event recorder) against the fake API server over HTTP, writing to a real etcd on
//! loopback. Records are checked the way CoreDNS reads them. Waits are on the fake's change
//! notifications, the controller's reconcile counter, or etcd state polled under a hang guard;
//! nothing asserts on time.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use kube::api::{Api, DeleteParams};
use serde_json::{Value, json};
use support::{Etcd, coredns_lookup, coredns_srv, guard, until};
use tokio_util::sync::CancellationToken;
use weft_dns::record::{Owner, Prefix, Record};
use weft_dns::{DnsSettings, EtcdStore, RecordStore};
use weft_fakeapi::{FakeApiServer, Verb};
use weft_kube::controller::{Context, ControllerMetrics};
use weft_pipeline::domain::{PIPELINE_NAME_LABEL, TRANSPORT_PORT_NAME, VERTEX_DOMAINS_ANNOTATION, VERTEX_NAME_LABEL};
use weft_testkit::controller::fast_settings;

const NS: &str = "default";
const DOMAIN: &str = "inference.net-a.video.default.vertexdomain.local";
const OUT_DOMAIN: &str = "out.net-a.video.default.vertexdomain.local";

fn entry(network: &str, domain: &str) -> Value {
    json!({"network": network, "domain": domain, "claim": format!("{network}-rct")})
}

/// A vertex pod of the seed's video pipeline, its claim entry `net-a-rct` generated as
/// `<pod>-net-a-rct`.
fn pod(name: &str, vertex: &str, ready: bool, entries: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name, "namespace": NS, "uid": format!("uid-{name}"),
            "labels": {PIPELINE_NAME_LABEL: "video", VERTEX_NAME_LABEL: vertex},
            "annotations": {VERTEX_DOMAINS_ANNOTATION: entries.to_string()},
        },
        "spec": {"containers": [{"name": "udf", "image": "udf"}], "resourceClaims": [
            {"name": "net-a-rct", "resourceClaimTemplateName": "net-a-rct"},
        ]},
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
            "resourceClaimStatuses": [{"name": "net-a-rct", "resourceClaimName": format!("{name}-net-a-rct")}],
        },
    })
}

/// The claim of `pod`'s NIC, with `ip` in `networkData` when given.
fn claim(pod: &str, ip: Option<&str>) -> Value {
    let mut device = json!({"driver": "nic.weft.io", "pool": "node-1", "device": "vf-0000-3b-02-1"});
    if let Some(ip) = ip {
        device["networkData"] = json!({"interfaceName": "net1", "ips": [format!("{ip}/24")]});
    }
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": format!("{pod}-net-a-rct"), "namespace": NS},
        "spec": {"devices": {"requests": [{"name": "nic", "exactly": {"deviceClassName": "vf.weft.io"}}]}},
        "status": {"devices": [device]},
    })
}

fn settings(etcd: &Etcd) -> DnsSettings {
    DnsSettings {
        endpoints: vec![etcd.endpoint.clone()],
        registrar_id: "r1".into(),
        claim_requeue: Duration::from_millis(50),
        ..DnsSettings::default()
    }
}

struct Running {
    metrics: ControllerMetrics,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    async fn stop(self) {
        self.stop.cancel();
        guard("the registrar to stop", self.task).await.unwrap();
    }

    /// Kills the registrar as a crash would: its task is dropped mid-flight, no cleanup runs.
    async fn kill(self) {
        self.task.abort();
        let _ = self.task.await;
    }

    async fn reconciled(&self, n: u64) {
        let mut rx = self.metrics.finished();
        guard("reconciles", rx.wait_for(|c| *c >= n)).await.unwrap();
    }
}

fn start(server: &FakeApiServer, dns: DnsSettings) -> Running {
    let metrics = ControllerMetrics::default();
    let ctx = Context::new(server.client(), "weft-controller", Some("t-0".into()), "weft-controller", metrics.clone());
    let stop = CancellationToken::new();
    let s = stop.clone();
    let store = EtcdStore::connect(&dns.endpoints, dns.request_timeout).unwrap();
    let task = tokio::spawn(async move {
        weft_dns::run_with_store(store, ctx, fast_settings(weft_dns::NAME), dns, async move { s.cancelled().await })
            .await
            .expect("valid settings");
    });
    Running { metrics, stop, task }
}

/// The addresses CoreDNS would answer for `domain`.
async fn answers(store: &EtcdStore, domain: &str) -> Vec<String> {
    coredns_lookup(store, "/skydns", domain).await.unwrap().into_iter().map(|a| a.ip.to_string()).collect()
}

fn key(domain: &str, pod: &str) -> String {
    Prefix::new("/skydns").unwrap().record_key(domain, pod)
}

fn has_finalizer(v: &Value) -> bool {
    v["metadata"]["finalizers"].as_array().is_some_and(|f| f.iter().any(|x| x == weft_dns::FINALIZER))
}

fn set_ready(server: &FakeApiServer, name: &str, ready: bool) {
    server
        .modify("pods", Some(NS), name, |p| {
            p["status"]["conditions"] = json!([{"type": "Ready", "status": if ready { "True" } else { "False" }}]);
        })
        .unwrap();
}

#[tokio::test]
async fn a_ready_pod_gets_its_record_and_loses_it_when_it_stops_being_ready() {
    let Some(etcd) = Etcd::start().await else { return };
    let store = etcd.store();
    let server = FakeApiServer::start().await;
    server.insert(claim("video-inference-0-a", Some("192.168.10.7"))).unwrap();
    server.insert(claim("video-inference-1-b", Some("192.168.10.8"))).unwrap();
    server.insert(pod("video-inference-0-a", "inference", true, json!([entry("net-a", DOMAIN)]))).unwrap();
    server.insert(pod("video-inference-1-b", "inference", true, json!([entry("net-a", DOMAIN)]))).unwrap();
    // A Numaflow pod without the annotation: watched, never given a record.
    let mut plain = pod("video-out-0-c", "out", true, json!([]));
    plain["metadata"]["annotations"] = json!({});
    server.insert(plain).unwrap();
    let running = start(&server, settings(&etcd));

    until("both records", || async { answers(&store, DOMAIN).await.len() == 2 }).await;
    let got = coredns_lookup(&store, "/skydns", DOMAIN).await.unwrap();
    assert_eq!(got.iter().map(|a| a.ip.to_string()).collect::<Vec<_>>(), ["192.168.10.7", "192.168.10.8"]);
    assert!(got.iter().all(|a| a.ttl == 10 && a.lease != 0), "short ttl, on the registrar's lease: {got:?}");
    assert_eq!(got[0].lease, got[1].lease, "one lease per registrar");
    let raw = store.get(&key(DOMAIN, "video-inference-0-a")).await.unwrap().expect("record");
    let v: Value = serde_json::from_slice(&raw.value).unwrap();
    assert_eq!(
        v["weft"],
        json!({"owner": "r1", "namespace": NS, "pod": "video-inference-0-a", "podUID": "uid-video-inference-0-a"})
    );
    assert!(has_finalizer(&server.get("pods", Some(NS), "video-inference-0-a").unwrap()));

    set_ready(&server, "video-inference-0-a", false);
    until("the unready pod's record to go", || async { answers(&store, DOMAIN).await == ["192.168.10.8"] }).await;
    set_ready(&server, "video-inference-0-a", true);
    until("the record back", || async { answers(&store, DOMAIN).await.len() == 2 }).await;
    assert!(store.get_prefix("/skydns/local/vertexdomain/default/video/net-a/out/").await.unwrap().is_empty());

    // Every request the registrar made is granted by `weft controller`'s ClusterRoles (base and dns).
    let requests = server.requests();
    weft_testkit::rbac::assert_granted(
        &requests,
        &["base/controller/rbac.yaml", "components/dns/controller-rbac.yaml"],
    );
    assert!(requests.iter().any(|r| r.verb == Verb::Get && r.resource == "resourceclaims"));
    running.stop().await;
}

#[tokio::test]
async fn a_named_transport_port_is_served_in_srv_answers() {
    let Some(etcd) = Etcd::start().await else { return };
    let store = etcd.store();
    let server = FakeApiServer::start().await;
    server.insert(claim("video-inference-0-a", Some("192.168.10.7"))).unwrap();
    let mut p = pod("video-inference-0-a", "inference", true, json!([entry("net-a", DOMAIN)]));
    p["spec"]["containers"][0]["ports"] = json!([{"name": TRANSPORT_PORT_NAME, "containerPort": 7001}]);
    server.insert(p).unwrap();
    let running = start(&server, settings(&etcd));

    until("the record", || async { answers(&store, DOMAIN).await.len() == 1 }).await;
    assert_eq!(
        coredns_srv(&store, "/skydns", DOMAIN).await.unwrap(),
        [(format!("video-inference-0-a.{DOMAIN}."), 7001, "192.168.10.7".parse().unwrap())],
        "one SRV target per pod, at the pod's port, its address in the additional section"
    );
    running.stop().await;
}

#[tokio::test]
async fn a_deleted_pod_loses_its_record_before_it_goes() {
    let Some(etcd) = Etcd::start().await else { return };
    let store = etcd.store();
    let server = FakeApiServer::start().await;
    server.insert(claim("video-inference-0-a", Some("192.168.10.7"))).unwrap();
    server.insert(pod("video-inference-0-a", "inference", true, json!([entry("net-a", DOMAIN)]))).unwrap();
    let running = start(&server, settings(&etcd));
    until("the record", || async { answers(&store, DOMAIN).await.len() == 1 }).await;

    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(server.client(), NS);
    pods.delete("video-inference-0-a", &DeleteParams::default()).await.unwrap();
    // The finalizer holds the pod until cleanup removed the record; once the pod is gone, so is
    // the record.
    guard("the pod to go", server.wait_for(|s| s.get("pods", Some(NS), "video-inference-0-a").is_none())).await;
    assert!(answers(&store, DOMAIN).await.is_empty());
    assert!(store.get(&key(DOMAIN, "video-inference-0-a")).await.unwrap().is_none());
    running.stop().await;
}

#[tokio::test]
async fn a_killed_registrars_records_expire_with_its_lease() {
    let Some(etcd) = Etcd::start().await else { return };
    let store = etcd.store();
    let server = FakeApiServer::start().await;
    server.insert(claim("video-inference-0-a", Some("192.168.10.7"))).unwrap();
    server.insert(pod("video-inference-0-a", "inference", true, json!([entry("net-a", DOMAIN)]))).unwrap();
    let dns = DnsSettings { lease_ttl: Duration::from_secs(2), ..settings(&etcd) };
    let running = start(&server, dns);
    until("the record", || async { answers(&store, DOMAIN).await.len() == 1 }).await;
    let lease = store.get(&key(DOMAIN, "video-inference-0-a")).await.unwrap().unwrap().lease;
    assert_ne!(lease, 0);

    // While it runs, the registrar keeps its lease alive: a sentinel on a lease of the same TTL,
    // granted after the record was put and never renewed, expires first, and the record is
    // still there after it.
    let sentinel = store.grant(2).await.unwrap();
    store.put("/weft-test/sentinel", b"{}".to_vec(), sentinel.id).await.unwrap();
    until("the sentinel to expire", || async { store.get("/weft-test/sentinel").await.unwrap().is_none() }).await;
    let kv = store.get(&key(DOMAIN, "video-inference-0-a")).await.unwrap().expect("the record outlives a lease TTL");
    assert_eq!(kv.lease, lease, "on the same lease, renewed");

    running.kill().await;
    until("the record to expire with the lease", || async { answers(&store, DOMAIN).await.is_empty() }).await;
    // Not a cleanup: the pod is still there, Ready, with the finalizer.
    let p = server.get("pods", Some(NS), "video-inference-0-a").unwrap();
    assert!(has_finalizer(&p) && p["metadata"]["deletionTimestamp"].is_null());
}

#[tokio::test]
async fn a_lost_lease_is_replaced_and_the_records_put_back_on_the_new_one() {
    let Some(etcd) = Etcd::start().await else { return };
    let store = etcd.store();
    let server = FakeApiServer::start().await;
    server.insert(claim("video-inference-0-a", Some("192.168.10.7"))).unwrap();
    server.insert(pod("video-inference-0-a", "inference", true, json!([entry("net-a", DOMAIN)]))).unwrap();
    let dns = DnsSettings { lease_ttl: Duration::from_secs(3), ..settings(&etcd) };
    let running = start(&server, dns);
    let k = key(DOMAIN, "video-inference-0-a");
    until("the record", || async { store.get(&k).await.unwrap().is_some() }).await;
    let old = store.get(&k).await.unwrap().unwrap().lease;

    // As if etcd had expired it while the registrar could not reach it.
    store.revoke(old).await.unwrap();
    assert!(store.get(&k).await.unwrap().is_none());
    until("the record on a new lease", || async {
        store.get(&k).await.unwrap().is_some_and(|kv| kv.lease != 0 && kv.lease != old)
    })
    .await;
    running.stop().await;
}

#[tokio::test]
async fn the_record_waits_for_the_address_in_the_claim() {
    let Some(etcd) = Etcd::start().await else { return };
    let store = etcd.store();
    let server = FakeApiServer::start().await;
    server.insert(claim("video-inference-0-a", None)).unwrap();
    server.insert(pod("video-inference-0-a", "inference", true, json!([entry("net-a", DOMAIN)]))).unwrap();
    let running = start(&server, settings(&etcd));
    // The finalizer reconcile, the first apply, and at least one requeue: still no address.
    running.reconciled(3).await;
    assert!(answers(&store, DOMAIN).await.is_empty());

    // The driver writes networkData (a claim change does not trigger the pod; the requeue finds it).
    server
        .modify("resourceclaims", Some(NS), "video-inference-0-a-net-a-rct", |c| {
            c["status"]["devices"][0]["networkData"] = json!({"interfaceName": "net1", "ips": ["192.168.10.9/24"]});
        })
        .unwrap();
    until("the record", || async { answers(&store, DOMAIN).await == ["192.168.10.9"] }).await;
    running.stop().await;
}

#[tokio::test]
async fn a_domain_the_labels_do_not_give_gets_no_record_and_a_warning() {
    let Some(etcd) = Etcd::start().await else { return };
    let store = etcd.store();
    let server = FakeApiServer::start().await;
    server.insert(claim("video-inference-0-a", Some("192.168.10.7"))).unwrap();
    // The inference pod claims the `out` vertex's name too.
    let entries = json!([entry("net-a", DOMAIN), entry("net-a", OUT_DOMAIN)]);
    server.insert(pod("video-inference-0-a", "inference", true, entries)).unwrap();
    let running = start(&server, settings(&etcd));
    until("the valid record", || async { answers(&store, DOMAIN).await.len() == 1 }).await;
    let events = guard(
        "the Warning Event",
        server.wait_for(|s| s.list("events.events.k8s.io", None).iter().any(|e| e["reason"] == "VertexDomainRefused")),
    );
    events.await;
    let ev = server.list("events.events.k8s.io", None);
    let ev = ev.iter().find(|e| e["reason"] == "VertexDomainRefused").unwrap();
    assert_eq!(ev["type"], "Warning");
    assert_eq!(ev["regarding"]["name"], "video-inference-0-a");
    assert!(ev["note"].as_str().unwrap().contains(OUT_DOMAIN), "{ev}");
    assert!(answers(&store, OUT_DOMAIN).await.is_empty());
    assert!(store.get(&key(OUT_DOMAIN, "video-inference-0-a")).await.unwrap().is_none());
    running.stop().await;
}

#[tokio::test]
async fn a_namespace_coredns_reads_as_a_wildcard_gets_no_record() {
    let Some(etcd) = Etcd::start().await else { return };
    let store = etcd.store();
    let server = FakeApiServer::start().await;
    server.insert(claim("video-inference-0-a", Some("192.168.10.7"))).unwrap();
    server.insert(pod("video-inference-0-a", "inference", true, json!([entry("net-a", DOMAIN)]))).unwrap();
    // The same pipeline in namespace `any`, its annotation naming the domain its labels give.
    let any_domain = "inference.net-a.video.any.vertexdomain.local";
    let mut c = claim("video-inference-0-z", Some("192.168.20.9"));
    c["metadata"]["namespace"] = json!("any");
    server.insert(c).unwrap();
    let mut p = pod("video-inference-0-z", "inference", true, json!([entry("net-a", any_domain)]));
    p["metadata"]["namespace"] = json!("any");
    server.insert(p).unwrap();
    let running = start(&server, settings(&etcd));

    until("default's record", || async { answers(&store, DOMAIN).await.len() == 1 }).await;
    guard(
        "the Warning Event",
        server.wait_for(|s| s.list("events.events.k8s.io", None).iter().any(|e| e["reason"] == "VertexDomainRefused")),
    )
    .await;
    let ev = server.list("events.events.k8s.io", None);
    let ev = ev.iter().find(|e| e["reason"] == "VertexDomainRefused").unwrap();
    assert_eq!(ev["regarding"]["name"], "video-inference-0-z");
    assert!(ev["note"].as_str().unwrap().contains("wildcard"), "{ev}");
    assert!(store.get(&key(any_domain, "video-inference-0-z")).await.unwrap().is_none());
    // Why: CoreDNS answers the `any` name with the other namespaces' pods of that vertex; had the
    // pod a record, `default`'s clients would not see it, but its own would see `default`'s.
    assert_eq!(answers(&store, any_domain).await, ["192.168.10.7"]);
    running.stop().await;
}

#[tokio::test]
async fn stale_records_of_this_registrar_are_collected_at_start_and_others_kept() {
    let Some(etcd) = Etcd::start().await else { return };
    let store = etcd.store();
    let server = FakeApiServer::start().await;
    let owner = |id: &str, pod: &str| Owner {
        owner: id.into(),
        namespace: NS.into(),
        pod: pod.into(),
        pod_uid: format!("uid-{pod}"),
    };
    let put = |k: String, v: Vec<u8>| {
        let store = store.clone();
        async move { store.put(&k, v, 0).await.unwrap() }
    };
    let rec = |ip: &str, o: Owner| Record::new(ip.parse().unwrap(), 10, o).to_bytes();
    // Left behind while the registrar was down: ours for a pod that is gone, ours for a pod that
    // is no longer ready, another registrar's for a gone pod, a record weft did not write, and
    // ours for a pod that is still ready.
    put(key(DOMAIN, "gone-0"), rec("10.0.0.1", owner("r1", "gone-0"))).await;
    put(key(DOMAIN, "idle-0"), rec("10.0.0.2", owner("r1", "idle-0"))).await;
    put(key(DOMAIN, "gone-1"), rec("10.0.0.3", owner("r2", "gone-1"))).await;
    put(key(DOMAIN, "manual"), br#"{"host":"10.0.0.4"}"#.to_vec()).await;
    put(key(DOMAIN, "live-0"), rec("10.0.0.5", owner("r1", "live-0"))).await;
    server.insert(claim("live-0", Some("10.0.0.5"))).unwrap();
    server.insert(pod("live-0", "inference", true, json!([entry("net-a", DOMAIN)]))).unwrap();
    server.insert(claim("idle-0", Some("10.0.0.2"))).unwrap();
    server.insert(pod("idle-0", "inference", false, json!([entry("net-a", DOMAIN)]))).unwrap();

    let running = start(&server, settings(&etcd));
    // The live pod's record is put on the registrar's lease by the controller, which starts only
    // after the collection finished.
    let live = key(DOMAIN, "live-0");
    until("the live record on the lease", || async { store.get(&live).await.unwrap().is_some_and(|kv| kv.lease != 0) })
        .await;
    assert!(store.get(&key(DOMAIN, "gone-0")).await.unwrap().is_none(), "ours, pod gone: collected");
    assert!(store.get(&key(DOMAIN, "idle-0")).await.unwrap().is_none(), "ours, pod not ready: collected");
    assert!(store.get(&key(DOMAIN, "gone-1")).await.unwrap().is_some(), "another registrar's: kept");
    assert!(store.get(&key(DOMAIN, "manual")).await.unwrap().is_some(), "not weft's: kept");
    let mut got = answers(&store, DOMAIN).await;
    got.sort();
    assert_eq!(got, ["10.0.0.3", "10.0.0.4", "10.0.0.5"]);
    running.stop().await;
}

#[tokio::test]
async fn an_orderly_stop_keeps_the_records_for_a_successor_unless_told_to_revoke() {
    let Some(etcd) = Etcd::start().await else { return };
    let store = etcd.store();
    let server = FakeApiServer::start().await;
    server.insert(claim("video-inference-0-a", Some("192.168.10.7"))).unwrap();
    server.insert(pod("video-inference-0-a", "inference", true, json!([entry("net-a", DOMAIN)]))).unwrap();

    let running = start(&server, settings(&etcd));
    until("the record", || async { answers(&store, DOMAIN).await.len() == 1 }).await;
    running.stop().await;
    // The lease (30 s) outlives the stop: the record stays for whoever takes over.
    assert_eq!(answers(&store, DOMAIN).await, ["192.168.10.7"]);

    let running = start(&server, DnsSettings { revoke_on_shutdown: true, ..settings(&etcd) });
    let k = key(DOMAIN, "video-inference-0-a");
    let first = store.get(&k).await.unwrap().unwrap().lease;
    until("the successor's lease on the record", || async {
        store.get(&k).await.unwrap().is_some_and(|kv| kv.lease != first)
    })
    .await;
    running.stop().await;
    assert!(answers(&store, DOMAIN).await.is_empty(), "revoked with the lease when the registrar stopped");
}

#[tokio::test]
async fn settings_that_cannot_work_are_refused_before_anything_starts() {
    let server = FakeApiServer::start().await;
    let ctx = Context::new(server.client(), "weft-controller", None, "weft-controller", ControllerMetrics::default());
    let dns = DnsSettings { endpoints: vec!["https://etcd:2379".into()], ..DnsSettings::default() };
    let e = weft_dns::run(ctx, fast_settings(weft_dns::NAME), dns, std::future::pending()).await.unwrap_err();
    assert_eq!(e.setting, "endpoints");
    assert!(server.requests().is_empty(), "no API request before the settings are checked");
}

#[tokio::test]
async fn a_prefix_of_more_than_one_segment_is_refused_because_coredns_srv_targets_would_be_wrong() {
    let Some(etcd) = Etcd::start().await else { return };
    let store = etcd.store();
    // CoreDNS turns a key back into the SRV target with msg.Domain, which drops one path segment:
    // under `/dns/sky` the second segment becomes the target's last label, outside the zone.
    let owner = Owner { owner: "r1".into(), namespace: NS.into(), pod: "p-0".into(), pod_uid: "u".into() };
    let record = Record::new("192.168.10.7".parse().unwrap(), 10, owner).with_port(Some(7001));
    let at = "/dns/sky/local/vertexdomain/default/video/net-a/inference/p-0";
    store.put(at, record.to_bytes(), 0).await.unwrap();
    let srv = coredns_srv(&store, "/dns/sky", DOMAIN).await.unwrap();
    assert_eq!(srv[0].0, format!("p-0.{DOMAIN}.sky."));

    let server = FakeApiServer::start().await;
    let ctx = Context::new(server.client(), "weft-controller", None, "weft-controller", ControllerMetrics::default());
    let dns = DnsSettings { prefix: "/dns/sky".into(), ..settings(&etcd) };
    let e = weft_dns::run(ctx, fast_settings(weft_dns::NAME), dns, std::future::pending()).await.unwrap_err();
    assert_eq!(e.setting, "prefix");
    assert!(e.why.contains("one segment"), "{e}");
    assert!(server.requests().is_empty(), "no API request before the settings are checked");
}
