//! `weft jobs render` predicts what Volcano really does with a job, quirks included, written from
//! Volcano's code (`pkg/webhooks/admission/jobs/validate`, `pkg/controllers/job`) and Go's `flag`
//! and `strconv` packages, and says why it is bad.

use serde_json::{Value, json};
use weft_jobs::admission::AdmissionOptions;
use weft_jobs::render::{PlaceholderKeys, RenderError, Rendered, render};

fn job(spec: Value) -> Value {
    json!({"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
        "metadata": {"name": "j", "namespace": "ml"}, "spec": spec})
}

fn task(name: &str, replicas: i64) -> Value {
    json!({"name": name, "replicas": replicas,
        "template": {"spec": {"containers": [{"name": "main", "image": "img"}]}}})
}

fn rendered(j: &Value) -> Rendered {
    render(j, &AdmissionOptions::default(), &PlaceholderKeys).expect("renders")
}

fn denied(j: &Value) -> String {
    match render(j, &AdmissionOptions::default(), &PlaceholderKeys) {
        Err(RenderError::Denied(reasons)) => reasons.join("\n"),
        other => panic!("expected a denial, got {other:?}"),
    }
}

fn env<'a>(r: &'a Rendered, pod: &str, name: &str) -> Option<&'a str> {
    let p = r.pods.iter().find(|p| p.pod.metadata.name.as_deref() == Some(pod)).expect("pod");
    p.pod.spec.as_ref()?.containers[0].env.iter().flatten().find(|e| e.name == name)?.value.as_deref()
}

#[test]
fn a_bad_tensorflow_port_is_zero_as_go_stores_it_and_the_warning_says_what_breaks() {
    let r =
        rendered(&job(json!({"plugins": {"tensorflow": ["--port=abc"]}, "tasks": [task("ps", 1), task("worker", 2)]})));
    let tf = env(&r, "j-worker-0", "TF_CONFIG").expect("TF_CONFIG");
    let cfg: Value = serde_json::from_str(tf).expect("json");
    assert_eq!(cfg["cluster"]["worker"][0], "j-worker-0.j:0", "{tf}");
    let w = r.warnings.join("\n");
    assert!(w.contains("goes on with -port=0"), "{w}");
    assert!(w.contains("dial port 0"), "{w}");
}

#[test]
fn an_unparsable_bool_is_false_as_go_stores_it() {
    let r = rendered(&job(json!({"plugins": {"svc": ["--inject-hosts-env=no"]}, "tasks": [task("worker", 2)]})));
    assert_eq!(env(&r, "j-worker-0", "VC_WORKER_HOSTS"), None, "no host env: Go stored false");
    let w = r.warnings.join("\n");
    assert!(w.contains("-inject-hosts-env=false") && w.contains("no VC_<task>_HOSTS"), "{w}");
    // The same job with a value Go reads: the env is there.
    let r = rendered(&job(json!({"plugins": {"svc": ["--inject-hosts-env=true"]}, "tasks": [task("worker", 2)]})));
    assert!(
        r.pods[0].pod.spec.as_ref().unwrap().containers[0].env.iter().flatten().any(|e| e.name == "VC_WORKER_HOSTS")
    );
}

#[test]
fn a_positional_argument_is_said_to_be_ignored_silently() {
    let r = rendered(&job(json!({"plugins": {"pytorch": ["--port=2000", "oops", "--master=boss"]},
        "tasks": [task("master", 1), task("worker", 2)]})));
    let w = r.warnings.join("\n");
    assert!(w.contains("silently ignores it and everything after it"), "{w}");
    assert_eq!(env(&r, "j-master-0", "MASTER_PORT"), Some("2000"), "flags before it apply");
}

#[test]
fn jobs_volcanos_webhook_denies_fail_with_its_reason() {
    for (spec, reason) in [
        (json!({"tasks": []}), "No task specified in job spec"),
        (json!({"plugins": {"gang": []}, "tasks": [task("w", 1)]}), "unable to find job plugin: gang;"),
        (
            json!({"plugins": {"mpi": ["--master=launcher"]}, "tasks": [task("w", 2)]}),
            "The specified mpi master task was not found",
        ),
        (json!({"tasks": [task("w", 1), task("w", 2)]}), "duplicated task name w;"),
        (
            json!({"tasks": [{"name": "w", "replicas": 1, "minAvailable": 2,
            "template": {"spec": {"containers": [{"name": "c", "image": "i"}]}}}]}),
            "'minAvailable' is greater than 'replicas' in task: w, job: j;",
        ),
        (
            json!({"minAvailable": 5, "tasks": [task("w", 2)]}),
            "job 'minAvailable' should not be greater than total replicas",
        ),
        (
            json!({"policies": [{"event": "PodFailed", "action": "RestartJob"}, {"event": "PodFailed", "action": "AbortJob"}],
            "tasks": [task("w", 1)]}),
            "duplicate event PodFailed  across different policy",
        ),
        (
            json!({"policies": [{"exitCode": 0, "action": "RestartJob"}], "tasks": [task("w", 1)]}),
            "0 is not a valid error code",
        ),
        (
            json!({"policies": [{"event": "Bogus", "action": "RestartJob"}], "tasks": [task("w", 1)]}),
            "invalid policy event",
        ),
        (json!({"volumes": [{"volumeClaimName": "data"}], "tasks": [task("w", 1)]}), "mountPath is required;"),
        (
            json!({"tasks": [
            {"name": "a", "replicas": 1, "dependsOn": {"name": ["b"]}, "template": {"spec": {"containers": [{"name": "c", "image": "i"}]}}},
            {"name": "b", "replicas": 1, "dependsOn": {"name": ["a"]}, "template": {"spec": {"containers": [{"name": "c", "image": "i"}]}}}]}),
            "doesn't form a directed acyclic graph(DAG)",
        ),
        (
            json!({"tasks": [{"name": "w", "replicas": 1, "template": {"spec": {"containers": []}}}]}),
            "containers: Required value",
        ),
        (
            json!({"tasks": [{"name": "w", "replicas": 1, "topologyPolicy": "single-numa-node",
            "template": {"spec": {"containers": [{"name": "c", "image": "i", "resources": {"requests": {"cpu": "500m"}}}]}}}]}),
            "the cpu request isn't an integer in spec.task[0] container[0].",
        ),
    ] {
        let got = denied(&job(spec.clone()));
        assert!(got.contains(reason), "{spec}: {got}");
    }
}

#[test]
fn names_kubernetes_would_refuse_and_runaway_sizes_are_denied() {
    let got = denied(&job(json!({"tasks": [task("h$(id)", 1)]})));
    assert!(got.contains("not a DNS label"), "{got}");
    assert!(got.contains("create pod with name j-h$(id)-0 validate failed"), "Volcano's own reason too: {got}");
    let got = denied(&job(json!({"tasks": [task("w", -1)]})));
    assert!(got.contains("'replicas' must be >= 0"), "{got}");
    let got = denied(&job(json!({"tasks": [task("worker", 1_000_000_000)]})));
    assert!(got.contains("1000000000 pods") && got.contains("at most 10000"), "{got}");
    // The cap is a setting.
    let mut opts = AdmissionOptions::default();
    opts.build.max_job_replicas = 3;
    assert!(render(&job(json!({"tasks": [task("w", 4)]})), &opts, &PlaceholderKeys).is_err());
    assert!(render(&job(json!({"tasks": [task("w", 3)]})), &opts, &PlaceholderKeys).is_ok());
}

#[test]
fn a_malformed_plugin_entry_names_its_field() {
    let e = render(
        &job(json!({"plugins": {"tensorflow": "--port=1"}, "tasks": [task("w", 1)]})),
        &AdmissionOptions::default(),
        &PlaceholderKeys,
    )
    .expect_err("malformed");
    assert!(e.to_string().contains("spec.plugins.tensorflow"), "{e}");
}

#[test]
fn volcanos_ray_without_a_head_task_still_gets_its_head_service() {
    let r = rendered(&job(json!({"plugins": {"ray": []}, "tasks": [task("worker", 2)]})));
    let svc = r
        .objects
        .iter()
        .find(|o| o.object["kind"] == "Service" && o.object["metadata"]["name"] == "j-head-svc")
        .unwrap_or_else(|| panic!("no j-head-svc: {:?}", r.objects));
    assert_eq!(svc.source, weft_jobs::Flavor::Volcano);
    assert_eq!(svc.object["spec"]["selector"]["volcano.sh/task-spec"], "head");
    let w = r.warnings.join("\n");
    assert!(w.contains("doesn't have head task head") && w.contains("j-head-svc"), "{w}");
}

/// Malformed shapes a YAML slip gives (`plugins` as a list, a string or a number, `tasks` as a
/// map, a quoted replica count): the error names the field by its path, as for every other
/// malformed field, not only serde's text.
#[test]
fn malformed_fields_are_named_by_their_path() {
    let bad_replicas = json!({"name": "w", "replicas": "2", "template": {"spec": {"containers": [{"name": "main"}]}}});
    for (spec, path, what) in [
        (json!({"plugins": ["svc"], "tasks": [task("w", 1)]}), "spec.plugins", "sequence"),
        (json!({"plugins": "svc", "tasks": [task("w", 1)]}), "spec.plugins", "string \"svc\""),
        (json!({"plugins": 3, "tasks": [task("w", 1)]}), "spec.plugins", "integer `3`"),
        (json!({"plugins": {"svc": [1]}, "tasks": [task("w", 1)]}), "spec.plugins.svc[0]", "integer `1`"),
        (json!({"tasks": {"w": task("w", 1)}}), "spec.tasks", "map"),
        (json!({"tasks": [task("m", 1), bad_replicas]}), "spec.tasks[1].replicas", "string \"2\""),
    ] {
        let e = render(&job(spec.clone()), &AdmissionOptions::default(), &PlaceholderKeys)
            .expect_err("malformed")
            .to_string();
        assert!(e.contains(&format!("{path}: ")) && e.contains(what), "{spec}: {e}");
    }
}

#[test]
fn the_base_pod_is_what_volcanos_controller_builds() {
    let mut j = job(json!({
        "volumes": [{"mountPath": "/data", "volumeClaimName": "datasets"}, {"mountPath": "/ckpt", "volumeClaim": {"resources": {}}}],
        "tasks": [{"name": "w", "replicas": 4, "topologyPolicy": "best-effort",
            "partitionPolicy": {"totalPartitions": 2, "partitionSize": 2},
            "template": {"spec": {"containers": [{"name": "main", "image": "img",
                "resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "2"}}}]}}}]}));
    j["metadata"]["annotations"] = json!({"volcano.sh/preemptable": "true", "volcano.sh/cooldown-time": "60s"});
    j["metadata"]["labels"] = json!({"volcano.sh/preemptable": "true"});
    let r = rendered(&j);
    let pod = &r.pods[3].pod;
    let spec = pod.spec.as_ref().unwrap();
    let claims: Vec<&str> = spec
        .volumes
        .iter()
        .flatten()
        .filter_map(|v| v.persistent_volume_claim.as_ref().map(|c| c.claim_name.as_str()))
        .collect();
    assert_eq!(claims[0], "datasets");
    assert!(claims[1].starts_with("j-pvc-"), "{claims:?}");
    let mounts: Vec<&str> = spec.containers[0].volume_mounts.iter().flatten().map(|m| m.mount_path.as_str()).collect();
    assert_eq!(mounts, ["/data", "/ckpt"]);
    let ann = pod.metadata.annotations.as_ref().unwrap();
    assert_eq!(ann["volcano.sh/numa-topology-policy"], "best-effort");
    assert_eq!(ann["volcano.sh/preemptable"], "true");
    assert_eq!(ann["volcano.sh/cooldown-time"], "60s");
    let labels = pod.metadata.labels.as_ref().unwrap();
    assert_eq!(labels["volcano.sh/partition-id"], "1", "index 3 / partitionSize 2");
    assert_eq!(labels["volcano.sh/preemptable"], "true");
    assert!(!labels.contains_key("volcano.sh/job-forwarding"), "only for queues with extendClusters");
    // A job Volcano marked for forwarding.
    j["metadata"]["annotations"]["volcano.sh/job-forwarding"] = json!("true");
    let r = rendered(&j);
    assert_eq!(r.pods[0].pod.metadata.labels.as_ref().unwrap()["volcano.sh/job-forwarding"], "true");
}

#[test]
fn results_that_depend_on_volcanos_random_plugin_order_are_warned_about() {
    let r = rendered(&job(json!({"plugins": {"pytorch": [], "hcclrank": []},
        "tasks": [task("master", 2), task("worker", 2)]})));
    let w = r.warnings.join("\n");
    assert!(w.contains("shown in weft's order") && w.contains("Go map order"), "{w}");
    assert!(w.contains("depends on the order") && w.contains("hccl~1rankIndex"), "{w}");
    // Plugins whose order does not matter: the notice, no such warning.
    let r = rendered(&job(json!({"plugins": {"svc": [], "env": []}, "tasks": [task("worker", 2)]})));
    let w = r.warnings.join("\n");
    assert!(w.contains("shown in weft's order") && !w.contains("depends on the order"), "{w}");
}
