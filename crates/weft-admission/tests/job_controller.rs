//! The Volcano Job controller run for real (kube-runtime `Controller`, reflectors, server-side
//! apply, the Event recorder) against the fake API server over HTTP. No sleeps: waits are on the
//! fake's change notifications or the controller's reconcile counter, each under a hang guard.
//!
//! The objects' shapes are the plugins' business (weft-jobs' tests); here: which objects exist
//! when, their owner, labels and one content fact each, and which writes the controller makes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use weft_testkit as common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::controller::{Running, fast_settings, guard};
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use weft_admission::job_controller::{self, JobControllerConfig};
use weft_fakeapi::{FakeApiServer, RecordedRequest, ResourceSpec, Verb};
use weft_kube::controller::{Context, ControllerMetrics};

const NS: &str = "ml";
const JOBS: &str = "jobs.batch.volcano.sh";
/// Every plugin that makes objects: svc (hosts ConfigMap, Service, NetworkPolicy), ssh (Secret),
/// mpi (hostfile ConfigMap).
const ALL: &str = r#"{"svc": [], "ssh": [], "mpi": []}"#;

fn volcano_jobs() -> ResourceSpec {
    ResourceSpec::namespaced("batch.volcano.sh", "v1alpha1", "jobs", "Job").with_status()
}

/// A fake API server with NetworkPolicies and, when `volcano`, Volcano's Jobs.
async fn server(volcano: bool) -> FakeApiServer {
    let server = FakeApiServer::start().await;
    server.register(ResourceSpec::namespaced("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy"));
    if volcano {
        server.register(volcano_jobs());
    }
    server
}

/// An MPI job: one master, `workers` workers, weft plugins `plugins` (no annotation when `None`).
fn job(name: &str, workers: i32, plugins: Option<&str>) -> Value {
    let mut metadata = json!({"name": name, "namespace": NS});
    if let Some(p) = plugins {
        metadata["annotations"] = json!({"weft.io/job-plugins": p});
    }
    let task = |task: &str, replicas: i32| {
        json!({"name": task, "replicas": replicas,
               "template": {"spec": {"containers": [{"name": task, "image": "mpi:1"}], "restartPolicy": "OnFailure"}}})
    };
    json!({
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": metadata,
        "spec": {"minAvailable": 1 + workers, "schedulerName": "volcano", "queue": "default",
                 "tasks": [task("master", 1), task("worker", workers)]},
        "status": {"state": {"phase": "Running"}}
    })
}

fn start(client: Client) -> Running {
    let metrics = ControllerMetrics::default();
    let ctx = Context::new(client, "weft-controller", Some("c-0".into()), "weft-controller", metrics.clone());
    let settings = fast_settings(job_controller::NAME);
    let config = JobControllerConfig { api_poll: Duration::from_millis(20), ..JobControllerConfig::default() };
    let stop = CancellationToken::new();
    let s = stop.clone();
    let task = tokio::spawn(job_controller::run(ctx, settings, config, async move { s.cancelled().await }));
    Running { metrics, stop, task }
}

const KINDS: [(&str, &str); 4] =
    [("configmaps", "ConfigMap"), ("secrets", "Secret"), ("services", "Service"), ("networkpolicies", "NetworkPolicy")];

/// `(kind, name)` of every object labelled `weft.io/job=<job>` in the namespace.
fn objects_of(server: &FakeApiServer, job: &str) -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    for (resource, kind) in KINDS {
        for o in server.list(resource, Some(NS)) {
            if o["metadata"]["labels"]["weft.io/job"] == job {
                out.insert((kind.to_owned(), o["metadata"]["name"].as_str().unwrap().to_owned()));
            }
        }
    }
    out
}

fn set(items: &[(&str, &str)]) -> BTreeSet<(String, String)> {
    items.iter().map(|(k, n)| ((*k).to_owned(), (*n).to_owned())).collect()
}

/// What a job with svc + ssh + mpi gets.
fn all_objects(job: &str) -> BTreeSet<(String, String)> {
    set(&[
        ("ConfigMap", &format!("{job}-svc")),
        ("ConfigMap", &format!("{job}-mpi-hostfile")),
        ("Secret", &format!("{job}-ssh")),
        ("Service", job),
        ("NetworkPolicy", job),
    ])
}

async fn wait_objects(server: &FakeApiServer, job: &str, want: BTreeSet<(String, String)>) {
    let what = format!("the objects of {job} to be {want:?}");
    guard(&what, server.wait_for(|s| objects_of(s, job) == want)).await;
}

/// Writes to the kinds this controller manages.
fn object_writes(requests: &[RecordedRequest]) -> Vec<String> {
    requests
        .iter()
        .filter(|r| KINDS.iter().any(|(res, _)| r.resource == *res))
        .filter(|r| matches!(r.verb, Verb::Create | Verb::Update | Verb::Patch | Verb::Delete | Verb::DeleteCollection))
        .map(|r| format!("{} {}/{}", r.verb.as_str(), r.resource, r.name.as_deref().unwrap_or("")))
        .collect()
}

fn ssh_private_key(server: &FakeApiServer, job: &str) -> String {
    let secret = server.get("secrets", Some(NS), &format!("{job}-ssh")).expect("ssh secret");
    secret["data"]["id_rsa"].as_str().expect("id_rsa").to_owned()
}

fn set_phase(server: &FakeApiServer, job: &str, phase: &str) {
    server.modify(JOBS, Some(NS), job, |v| v["status"]["state"]["phase"] = json!(phase)).unwrap();
}

#[tokio::test]
async fn a_job_gets_its_objects_owned_and_labelled_and_a_restart_writes_nothing() {
    let server = server(true).await;
    let stored = server.insert(job("train", 2, Some(ALL))).unwrap();
    let uid = stored["metadata"]["uid"].as_str().unwrap().to_owned();
    let first = start(server.client());
    wait_objects(&server, "train", all_objects("train")).await;

    for (resource, kind) in KINDS {
        for o in server.list(resource, Some(NS)) {
            let meta = &o["metadata"];
            let name = meta["name"].as_str().unwrap();
            assert_eq!(meta["labels"]["app.kubernetes.io/managed-by"], "weft", "{kind} {name}");
            assert_eq!(meta["labels"]["weft.io/job"], "train", "{kind} {name}");
            let owners = meta["ownerReferences"].as_array().unwrap();
            assert_eq!(owners.len(), 1, "{kind} {name}");
            assert_eq!(
                (&owners[0]["apiVersion"], &owners[0]["kind"], &owners[0]["name"], &owners[0]["uid"]),
                (&json!("batch.volcano.sh/v1alpha1"), &json!("Job"), &json!("train"), &json!(uid)),
                "{kind} {name}"
            );
            assert_eq!(owners[0]["controller"], true, "{kind} {name}");
            assert!(meta["finalizers"].is_null(), "no finalizers: {kind} {name}");
        }
    }
    let hosts = server.get("configmaps", Some(NS), "train-svc").unwrap();
    assert_eq!(hosts["data"]["VC_WORKER_NUM"], "2");
    assert_eq!(hosts["data"]["VC_WORKER_HOSTS"], "train-worker-0.train,train-worker-1.train");
    let hostfile = server.get("configmaps", Some(NS), "train-mpi-hostfile").unwrap();
    assert_eq!(hostfile["data"]["hostfile"].as_str().unwrap().lines().count(), 2);
    let svc = server.get("services", Some(NS), "train").unwrap();
    assert_eq!(svc["spec"]["clusterIP"], "None");
    assert!(!ssh_private_key(&server, "train").is_empty());
    // Every write was a server-side apply by the controller's field manager.
    let writes: Vec<_> =
        server.requests().into_iter().filter(|r| !object_writes(std::slice::from_ref(r)).is_empty()).collect();
    assert!(
        writes.iter().all(|r| r.verb == Verb::Patch && r.field_manager.as_deref() == Some("weft-controller")),
        "{writes:?}"
    );
    first.stop().await;
    let keys = ssh_private_key(&server, "train");

    // A fresh controller, with no memory of the first, finds everything in place: no writes.
    server.clear_requests();
    let second = start(server.client());
    second.reconciled(1).await;
    // Volcano updates the job's status often: a reconcile for that writes nothing either.
    let before = *second.metrics.finished().borrow();
    set_phase(&server, "train", "Running");
    server.modify(JOBS, Some(NS), "train", |v| v["status"]["succeeded"] = json!(0)).unwrap();
    second.reconciled(before + 1).await;
    second.stop().await;
    let requests = server.requests();
    assert_eq!(object_writes(&requests), Vec::<String>::new(), "steady state writes nothing");
    assert!(requests.iter().any(|r| r.verb == Verb::Watch && r.resource == "secrets"), "it did watch");
    assert_eq!(ssh_private_key(&server, "train"), keys);
    common::rbac::assert_granted(
        &server.requests(),
        &["base/controller/rbac.yaml", "components/webhook/controller-rbac.yaml"],
    );
}

#[tokio::test]
async fn scaling_regenerates_hosts_hostfile_and_ssh_config_but_keeps_the_keys() {
    let server = server(true).await;
    server.insert(job("scale", 2, Some(ALL))).unwrap();
    let running = start(server.client());
    wait_objects(&server, "scale", all_objects("scale")).await;
    let keys = ssh_private_key(&server, "scale");

    server.modify(JOBS, Some(NS), "scale", |v| v["spec"]["tasks"][1]["replicas"] = json!(3)).unwrap();
    let hosts = guard(
        "the hosts ConfigMap to list 3 workers",
        server.wait_for_object("configmaps", Some(NS), "scale-svc", |v| v["data"]["VC_WORKER_NUM"] == "3"),
    )
    .await;
    assert!(hosts["data"]["VC_WORKER_HOSTS"].as_str().unwrap().ends_with(",scale-worker-2.scale"), "{hosts}");
    let hostfile = guard(
        "the hostfile to list 3 workers",
        server.wait_for_object("configmaps", Some(NS), "scale-mpi-hostfile", |v| {
            v["data"]["hostfile"].as_str().is_some_and(|h| h.lines().count() == 3)
        }),
    )
    .await;
    assert!(hostfile["data"]["hostfile"].as_str().unwrap().contains("scale-worker-2.scale"), "{hostfile}");
    let config_has_new_host = |v: &Value| {
        v["data"]["config"].as_str().and_then(base64_decode).is_some_and(|c| c.contains("Host scale-worker-2\n"))
    };
    guard(
        "the ssh config to name the new worker",
        server.wait_for_object("secrets", Some(NS), "scale-ssh", config_has_new_host),
    )
    .await;
    running.stop().await;
    assert_eq!(ssh_private_key(&server, "scale"), keys, "the keys never change");
    common::rbac::assert_granted(
        &server.requests(),
        &["base/controller/rbac.yaml", "components/webhook/controller-rbac.yaml"],
    );
}

/// Standard base64 (what the API server stores Secret data as), decoded to text.
fn base64_decode(s: &str) -> Option<String> {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut bits = 0u32;
    let mut n = 0;
    let mut out = Vec::new();
    for c in s.bytes().filter(|c| *c != b'=') {
        bits = (bits << 6) | ALPHABET.iter().position(|a| *a == c)? as u32;
        n += 6;
        if n >= 8 {
            n -= 8;
            out.push((bits >> n) as u8);
            bits &= (1 << n) - 1;
        }
    }
    String::from_utf8(out).ok()
}

#[tokio::test]
async fn objects_no_longer_desired_are_pruned_and_others_are_left_alone() {
    let server = server(true).await;
    let stored = server.insert(job("prune", 2, Some(ALL))).unwrap();
    // Labelled for the job but owned by an earlier job of the same name: not this job's to delete.
    server
        .insert(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "prune-old", "namespace": NS,
                "labels": {"app.kubernetes.io/managed-by": "weft", "weft.io/job": "prune"},
                "ownerReferences": [{"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "name": "prune",
                    "uid": "an-earlier-job", "controller": true}]}}))
        .unwrap();
    let running = start(server.client());
    let mut want = all_objects("prune");
    want.insert(("ConfigMap".into(), "prune-old".into()));
    wait_objects(&server, "prune", want).await;

    // ssh and mpi removed, the NetworkPolicy turned off.
    server
        .modify(JOBS, Some(NS), "prune", |v| {
            v["metadata"]["annotations"]["weft.io/job-plugins"] = json!(r#"{"svc": ["--disable-network-policy"]}"#)
        })
        .unwrap();
    wait_objects(
        &server,
        "prune",
        set(&[("ConfigMap", "prune-svc"), ("ConfigMap", "prune-old"), ("Service", "prune")]),
    )
    .await;
    running.stop().await;
    let deletes: BTreeSet<String> =
        object_writes(&server.requests()).into_iter().filter(|w| w.starts_with("delete")).collect();
    let expected = ["delete configmaps/prune-mpi-hostfile", "delete networkpolicies/prune", "delete secrets/prune-ssh"];
    assert_eq!(deletes, expected.iter().map(|s| (*s).to_owned()).collect(), "uid {}", stored["metadata"]["uid"]);
    common::rbac::assert_granted(
        &server.requests(),
        &["base/controller/rbac.yaml", "components/webhook/controller-rbac.yaml"],
    );
}

#[tokio::test]
async fn an_ended_job_loses_its_objects_and_gets_them_back_when_it_runs_again() {
    let server = server(true).await;
    server.insert(job("done", 1, Some(ALL))).unwrap();
    let running = start(server.client());
    wait_objects(&server, "done", all_objects("done")).await;
    let keys = ssh_private_key(&server, "done");

    set_phase(&server, "done", "Completed");
    wait_objects(&server, "done", BTreeSet::new()).await;

    // Resumed (as Volcano's ResumeJob does from Aborted; here straight back to Running).
    set_phase(&server, "done", "Running");
    wait_objects(&server, "done", all_objects("done")).await;
    running.stop().await;
    assert_ne!(ssh_private_key(&server, "done"), keys, "like Volcano's OnJobDelete + OnJobAdd: new keys");

    for phase in ["Failed", "Terminated"] {
        let running = start(server.client());
        wait_objects(&server, "done", all_objects("done")).await;
        set_phase(&server, "done", phase);
        wait_objects(&server, "done", BTreeSet::new()).await;
        running.stop().await;
        set_phase(&server, "done", "Running");
    }
    common::rbac::assert_granted(
        &server.requests(),
        &["base/controller/rbac.yaml", "components/webhook/controller-rbac.yaml"],
    );
}

#[tokio::test]
async fn an_invalid_annotation_gets_a_warning_event_and_no_objects() {
    let server = server(true).await;
    server.insert(job("bad", 1, Some(r#"{"mpi": ["--master=launcher"], "nope": []}"#))).unwrap();
    server.insert(job("good", 1, Some(r#"{"svc": []}"#))).unwrap();
    let running = start(server.client());
    let events = guard(
        "the InvalidJobPlugins Event",
        server.wait_for(|s| s.list("events.events.k8s.io", None).iter().any(|e| e["reason"] == "InvalidJobPlugins")),
    );
    events.await;
    wait_objects(&server, "good", set(&[("ConfigMap", "good-svc"), ("Service", "good"), ("NetworkPolicy", "good")]))
        .await;
    // A status update of the bad job: reconciled again, no second Event for the same errors.
    let before = *running.metrics.finished().borrow();
    set_phase(&server, "bad", "Pending");
    running.reconciled(before + 1).await;
    running.stop().await;

    assert_eq!(objects_of(&server, "bad"), BTreeSet::new());
    assert!(!object_writes(&server.requests()).iter().any(|w| w.contains("/bad")), "nothing written for the bad job");
    let events: Vec<Value> =
        server.list("events.events.k8s.io", None).into_iter().filter(|e| e["reason"] == "InvalidJobPlugins").collect();
    assert_eq!(events.len(), 1, "{events:#?}");
    let e = &events[0];
    assert_eq!((e["type"].as_str(), e["regarding"]["name"].as_str()), (Some("Warning"), Some("bad")));
    let note = e["note"].as_str().unwrap();
    assert!(note.contains("weft.io/job-plugins") && note.contains("\"nope\"") && note.contains("launcher"), "{note}");
    assert!(e["series"].is_null(), "sent once: {e}");
    common::rbac::assert_granted(
        &server.requests(),
        &["base/controller/rbac.yaml", "components/webhook/controller-rbac.yaml"],
    );
}

#[tokio::test]
async fn a_job_without_the_annotation_gets_nothing_until_it_has_one() {
    let server = server(true).await;
    server.insert(job("plain", 2, None)).unwrap();
    // Volcano's own plugins are Volcano's business.
    server
        .insert({
            let mut j = job("volcano-only", 2, None);
            j["spec"]["plugins"] = json!({"svc": [], "ssh": []});
            j
        })
        .unwrap();
    server.insert(job("marker", 1, Some(r#"{"svc": ["--disable-network-policy"]}"#))).unwrap();
    let running = start(server.client());
    wait_objects(&server, "marker", set(&[("ConfigMap", "marker-svc"), ("Service", "marker")])).await;
    running.stop().await;
    assert_eq!(objects_of(&server, "plain"), BTreeSet::new());
    assert_eq!(objects_of(&server, "volcano-only"), BTreeSet::new());
    let writes = object_writes(&server.requests());
    assert!(writes.iter().all(|w| w.contains("/marker")), "{writes:?}");

    let running = start(server.client());
    server
        .modify(JOBS, Some(NS), "plain", |v| v["metadata"]["annotations"] = json!({"weft.io/job-plugins": ALL}))
        .unwrap();
    wait_objects(&server, "plain", all_objects("plain")).await;
    running.stop().await;
    common::rbac::assert_granted(
        &server.requests(),
        &["base/controller/rbac.yaml", "components/webhook/controller-rbac.yaml"],
    );
}

#[tokio::test]
async fn a_deleted_or_edited_object_is_put_back() {
    let server = server(true).await;
    server.insert(job("heal", 2, Some(ALL))).unwrap();
    let client = server.client();
    let running = start(client.clone());
    wait_objects(&server, "heal", all_objects("heal")).await;
    let old_uid = server.get("configmaps", Some(NS), "heal-svc").unwrap()["metadata"]["uid"].clone();

    let cms: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(client.clone(), NS);
    cms.delete("heal-svc", &DeleteParams::default()).await.unwrap();
    let back = guard(
        "heal-svc to be recreated",
        server.wait_for_object("configmaps", Some(NS), "heal-svc", |v| v["metadata"]["uid"] != old_uid),
    )
    .await;
    assert_eq!(back["data"]["VC_WORKER_NUM"], "2");

    // Someone edits a field the controller owns: put back too.
    cms.patch("heal-svc", &PatchParams::default(), &Patch::Merge(json!({"data": {"VC_WORKER_NUM": "7"}})))
        .await
        .unwrap();
    guard(
        "VC_WORKER_NUM to be restored",
        server.wait_for_object("configmaps", Some(NS), "heal-svc", |v| v["data"]["VC_WORKER_NUM"] == "2"),
    )
    .await;

    // The Secret deleted: recreated (the job's pods mount it by name). Its keys lived only in it.
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(client.clone(), NS);
    secrets.delete("heal-ssh", &DeleteParams::default()).await.unwrap();
    guard(
        "heal-ssh to be recreated",
        server.wait_for_object("secrets", Some(NS), "heal-ssh", |v| v["data"]["id_rsa"].is_string()),
    )
    .await;
    running.stop().await;
    common::rbac::assert_granted(
        &server.requests(),
        &["base/controller/rbac.yaml", "components/webhook/controller-rbac.yaml"],
    );
}

#[tokio::test]
async fn without_volcano_the_controller_waits_and_starts_once_the_api_is_served() {
    let server = server(false).await;
    let running = start(server.client());
    assert!(!running.task.is_finished(), "waiting, not crashed");
    server.register(volcano_jobs());
    server.insert(job("late", 1, Some(r#"{"svc": []}"#))).unwrap();
    wait_objects(&server, "late", set(&[("ConfigMap", "late-svc"), ("Service", "late"), ("NetworkPolicy", "late")]))
        .await;
    running.stop().await;
    common::rbac::assert_granted(
        &server.requests(),
        &["base/controller/rbac.yaml", "components/webhook/controller-rbac.yaml"],
    );
}
