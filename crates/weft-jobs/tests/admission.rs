//! Admission decisions: Volcano's job defaults, plugin dependencies, strict validation and the
//! pod patch, checked by applying each patch with a JSON-patch library and reading the result.

use serde_json::{Value, json};
use weft_jobs::admission::{AdmissionOptions, PodMutator, mutate_job, owning_job, validate_job};
use weft_jobs::{Job, PLUGINS_ANNOTATION};

fn apply(doc: &Value, ops: &[json_patch::PatchOperation]) -> Value {
    let mut out = doc.clone();
    json_patch::patch(&mut out, ops).expect("the patch applies to the object it was made for");
    out
}

fn job(spec: Value, weft: Option<&str>) -> Value {
    let mut j = json!({"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
        "metadata": {"name": "tf", "namespace": "ml", "uid": "uid-1"}, "spec": spec});
    if let Some(w) = weft {
        j["metadata"]["annotations"] = json!({ PLUGINS_ANNOTATION: w });
    }
    j
}

fn typed(v: &Value) -> Job {
    serde_json::from_value(v.clone()).expect("a Job")
}

fn task(name: &str, replicas: i64) -> Value {
    json!({"name": name, "replicas": replicas, "template": {"spec": {"containers": [{"name": "c", "image": "i"}]}}})
}

#[test]
fn volcano_defaults_fill_queue_scheduler_retries_tasks_and_min_available() {
    let j = job(
        json!({"tasks": [task("ps", 1), {"replicas": 2, "template": {"spec": {"hostNetwork": true, "containers": []}}}]}),
        None,
    );
    let ops = mutate_job(&j, &AdmissionOptions::default()).expect("mutates");
    let paths: Vec<String> =
        ops.iter().map(|o| serde_json::to_value(o).expect("op")["path"].as_str().unwrap_or("").to_owned()).collect();
    // Volcano's order: queue, schedulerName, maxRetry, tasks, minAvailable (no plugins: spec.plugins is nil).
    assert_eq!(paths, ["/spec/queue", "/spec/schedulerName", "/spec/maxRetry", "/spec/tasks", "/spec/minAvailable"]);
    let out = apply(&j, &ops);
    assert_eq!(out["spec"]["queue"], "default");
    assert_eq!(out["spec"]["schedulerName"], "volcano");
    assert_eq!(out["spec"]["maxRetry"], 3);
    assert_eq!(out["spec"]["tasks"][1]["name"], "default1", "an unnamed task is named default<i>");
    assert_eq!(out["spec"]["tasks"][1]["template"]["spec"]["dnsPolicy"], "ClusterFirstWithHostNet");
    assert_eq!(out["spec"]["tasks"][0]["minAvailable"], 1);
    assert_eq!(out["spec"]["tasks"][1]["minAvailable"], 2);
    assert_eq!(out["spec"]["tasks"][0]["maxRetry"], 3);
    assert_eq!(out["spec"]["minAvailable"], 3, "sum of the tasks' minAvailable");
    // Defaults are idempotent: a second pass changes nothing.
    assert!(mutate_job(&out, &AdmissionOptions::default()).expect("mutates").is_empty());
}

#[test]
fn set_fields_are_kept_and_partitions_size_min_available() {
    let mut t = task("w", 8);
    t["partitionPolicy"] = json!({"totalPartitions": 4, "partitionSize": 2, "minPartitions": 3});
    let j = job(json!({"queue": "q", "schedulerName": "other", "maxRetry": 5, "minAvailable": 1, "tasks": [t]}), None);
    let opts = AdmissionOptions { scheduler_name: "custom".into(), ..Default::default() };
    let out = apply(&j, &mutate_job(&j, &opts).expect("mutates"));
    assert_eq!((out["spec"]["queue"].as_str(), out["spec"]["schedulerName"].as_str()), (Some("q"), Some("other")));
    assert_eq!((out["spec"]["maxRetry"].as_i64(), out["spec"]["minAvailable"].as_i64()), (Some(5), Some(1)));
    assert_eq!(out["spec"]["tasks"][0]["minAvailable"], 6, "minPartitions × partitionSize");
    let unset = job(json!({"tasks": [task("w", 1)]}), None);
    assert_eq!(apply(&unset, &mutate_job(&unset, &opts).expect("mutates"))["spec"]["schedulerName"], "custom");
}

#[test]
fn volcano_plugin_dependencies_go_into_spec_plugins() {
    let j = job(json!({"tasks": [task("master", 1), task("worker", 2)], "plugins": {"mpi": ["--port=2222"]}}), None);
    let out = apply(&j, &mutate_job(&j, &AdmissionOptions::default()).expect("mutates"));
    assert_eq!(out["spec"]["plugins"], json!({"mpi": ["--port=2222"], "svc": [], "ssh": []}));
    let j = job(json!({"tasks": [task("w", 2)], "plugins": {"env": [], "svc": ["--disable-network-policy"]}}), None);
    let out = apply(&j, &mutate_job(&j, &AdmissionOptions::default()).expect("mutates"));
    assert_eq!(out["spec"]["plugins"], json!({"env": [], "svc": ["--disable-network-policy"]}), "env never pulls svc");
}

#[test]
fn weft_plugin_dependencies_go_into_the_annotation_unless_volcano_has_them() {
    let j =
        job(json!({"tasks": [task("scheduler", 1), task("server", 1), task("worker", 2)]}), Some(r#"{"mxnet":[]}"#));
    let out = apply(&j, &mutate_job(&j, &AdmissionOptions::default()).expect("mutates"));
    let ann: Value = serde_json::from_str(out["metadata"]["annotations"][PLUGINS_ANNOTATION].as_str().expect("string"))
        .expect("json");
    assert_eq!(ann, json!({"mxnet": [], "svc": []}));

    let j = job(
        json!({"tasks": [task("master", 1), task("worker", 2)], "plugins": {"svc": []}}),
        Some(r#"{"mpi":["--slots=4"]}"#),
    );
    let out = apply(&j, &mutate_job(&j, &AdmissionOptions::default()).expect("mutates"));
    let ann: Value = serde_json::from_str(out["metadata"]["annotations"][PLUGINS_ANNOTATION].as_str().expect("string"))
        .expect("json");
    assert_eq!(ann, json!({"mpi": ["--slots=4"], "ssh": []}), "svc comes from spec.plugins; ssh is added");

    // Nothing to add: the annotation is not rewritten.
    let j = job(json!({"tasks": [task("w", 2)]}), Some(r#"{ "env" : [] }"#));
    let ops = mutate_job(&j, &AdmissionOptions::default()).expect("mutates");
    assert_eq!(apply(&j, &ops)["metadata"]["annotations"][PLUGINS_ANNOTATION], r#"{ "env" : [] }"#);
}

#[test]
fn a_job_without_spec_is_an_error_not_a_patch() {
    let e = mutate_job(&json!({"metadata": {"name": "x"}}), &AdmissionOptions::default()).expect_err("no spec");
    assert!(e.contains("spec"), "{e}");
}

#[test]
fn validation_rejects_unknown_and_doubly_listed_plugins_naming_them() {
    let opts = AdmissionOptions::default();
    let v = validate_job(&typed(&job(json!({"tasks": [task("w", 2)]}), Some(r#"{"horovod":[]}"#))), None, &opts);
    assert!(!v.allowed());
    assert!(v.message().contains("unknown plugin \"horovod\"") && v.message().contains("mxnet"), "{}", v.message());

    let both = job(
        json!({"tasks": [task("master", 1), task("worker", 1)], "plugins": {"pytorch": [], "svc": []}}),
        Some(r#"{"pytorch":[],"svc":[]}"#),
    );
    let v = validate_job(&typed(&both), None, &opts);
    assert!(v.message().contains("plugin pytorch: listed in both spec.plugins"), "{}", v.message());
    assert!(!v.message().contains("plugin svc"), "svc with equal args is left to Volcano: {}", v.message());
    let svc_equal = job(json!({"tasks": [task("w", 2)], "plugins": {"svc": []}}), Some(r#"{"svc":[]}"#));
    let v = validate_job(&typed(&svc_equal), None, &opts);
    assert!(v.allowed(), "{}", v.message());
    assert!(v.warnings.iter().any(|w| w.contains("svc") && w.contains("Volcano runs it")), "{:?}", v.warnings);

    let svc_differs =
        job(json!({"tasks": [task("w", 2)], "plugins": {"svc": []}}), Some(r#"{"svc":["--disable-network-policy"]}"#));
    assert!(validate_job(&typed(&svc_differs), None, &opts).message().contains("plugin svc: listed in both"));
}

#[test]
fn validation_requires_dependencies_and_a_parsable_annotation() {
    let opts = AdmissionOptions::default();
    let j = job(json!({"tasks": [task("master", 1), task("worker", 2)]}), Some(r#"{"mpi":[]}"#));
    let v = validate_job(&typed(&j), None, &opts);
    assert!(
        v.message().contains("plugin mpi needs plugin svc") && v.message().contains("plugin mpi needs plugin ssh"),
        "{}",
        v.message()
    );
    let fixed = apply(&j, &mutate_job(&j, &opts).expect("mutates"));
    assert!(
        !validate_job(&typed(&fixed), None, &opts).message().contains("needs plugin"),
        "after the mutating webhook the dependencies are there"
    );

    let bad = job(json!({"tasks": [task("w", 1)]}), Some(r#"["svc"]"#));
    let v = validate_job(&typed(&bad), None, &opts);
    assert!(v.message().starts_with("annotation weft.io/job-plugins:"), "{}", v.message());
}

#[test]
fn validation_rejects_pod_names_too_long_for_dns() {
    let long_task = "t".repeat(58);
    let j = job(json!({"tasks": [task(&long_task, 10)]}), Some(r#"{"env":[]}"#));
    let v = validate_job(&typed(&j), None, &AdmissionOptions::default());
    // "tf-" + 58 + "-9" = 63 characters: fine.
    assert!(v.allowed(), "{}", v.message());
    let j = job(json!({"tasks": [task(&long_task, 100)]}), Some(r#"{"env":[]}"#));
    let v = validate_job(&typed(&j), None, &AdmissionOptions::default());
    assert!(v.message().contains("has 64 characters"), "{}", v.message());
}

#[test]
fn the_plugin_annotation_is_immutable_on_update() {
    let opts = AdmissionOptions::default();
    let old = typed(&job(json!({"tasks": [task("w", 2)]}), Some(r#"{"env":[]}"#)));
    let scaled = typed(&job(json!({"tasks": [task("w", 4)]}), Some(r#"{"env":[]}"#)));
    assert!(validate_job(&scaled, Some(&old), &opts).allowed(), "scaling is an allowed update");
    let changed = typed(&job(json!({"tasks": [task("w", 2)]}), Some(r#"{"env":[],"svc":[]}"#)));
    assert!(validate_job(&changed, Some(&old), &opts).message().contains("cannot change after the job is created"));
}

#[test]
fn plugins_volcano_lacks_in_spec_plugins_are_denied_with_volcanos_reason() {
    // Volcano's webhook denies them ("unable to find job plugin"); weft's denies them too.
    let j = job(json!({"tasks": [task("w", 2)], "plugins": {"mxnet": [], "gang": []}}), None);
    let v = validate_job(&typed(&j), None, &AdmissionOptions::default());
    assert!(!v.allowed());
    let m = v.message();
    assert!(m.contains("unable to find job plugin: gang;"), "{m}");
    assert!(m.contains("unable to find job plugin: mxnet;") && m.contains("weft.io/job-plugins"), "{m}");
}

#[test]
fn spec_plugin_problems_volcano_only_logs_come_back_as_warnings() {
    let j = job(json!({"tasks": [task("w", 2)], "plugins": {"env": ["--oops"]}}), None);
    let v = validate_job(&typed(&j), None, &AdmissionOptions::default());
    assert!(v.allowed(), "{}", v.message());
    assert!(v.warnings.iter().any(|w| w.contains("plugin env") && w.contains("Volcano ignores")), "{:?}", v.warnings);
}

#[test]
fn pod_patch_adds_weft_plugin_env_and_leaves_unknown_fields_alone() {
    let j = typed(&job(json!({"tasks": [task("worker", 3)]}), Some(r#"{"env":[]}"#)));
    let mutator = PodMutator::new(&j, &AdmissionOptions::default()).expect("builds");
    assert!(!mutator.is_empty());
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "tf-worker-2", "annotations": {"volcano.sh/task-spec": "worker"},
            "ownerReferences": [{"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "name": "tf", "uid": "uid-1", "controller": true}]},
        "spec": {"futureField": {"x": 1}, "containers": [{"name": "c", "image": "i", "env": [{"name": "A", "value": "1"}]}]}});
    let out = apply(&pod, &mutator.mutate(&pod).expect("mutates"));
    assert_eq!(
        out["spec"]["containers"][0]["env"],
        json!([{"name": "A", "value": "1"}, {"name": "VK_TASK_INDEX", "value": "2"}, {"name": "VC_TASK_INDEX", "value": "2"}])
    );
    assert_eq!(out["spec"]["futureField"], json!({"x": 1}), "fields unknown to the typed Pod survive");
    assert_eq!(owning_job(&pod), Some(("tf".to_owned(), "uid-1".to_owned())));
}

#[test]
fn owning_job_needs_a_controller_reference_to_a_volcano_job() {
    let with = |r: Value| json!({"metadata": {"ownerReferences": [r]}});
    assert_eq!(
        owning_job(&with(
            json!({"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": "u", "controller": true})
        )),
        None
    );
    assert_eq!(
        owning_job(&with(json!({"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "name": "j", "uid": "u"}))),
        None
    );
    assert_eq!(owning_job(&json!({"metadata": {}})), None);
}

#[test]
fn a_job_over_the_replica_cap_gets_no_pod_mutator() {
    // A job admitted before weft's webhook, say: its pods must not make the webhook build host
    // lists of a billion names.
    let j = typed(&job(json!({"tasks": [task("worker", 1_000_000_000)]}), Some(r#"{"svc":[]}"#)));
    let e = PodMutator::new(&j, &AdmissionOptions::default()).expect_err("refused");
    assert!(e[0].to_string().contains("1000000000 pods"), "{:?}", e);
}

/// `n` tasks `t0`, `t1`, … of one replica each.
fn many_tasks(n: usize) -> Value {
    Value::Array((0..n).map(|i| task(&format!("t{i}"), 1)).collect())
}

/// The pod Volcano's controller creates for replica `index` of `task`, as JSON.
fn volcano_pod(j: &Job, task: &str, index: usize) -> Value {
    let t = j.task(task).expect("task");
    serde_json::to_value(weft_jobs::naming::volcano_pod(j, t, index)).expect("pod")
}

#[test]
fn weft_svc_host_env_is_bounded_per_pod_and_a_job_beyond_it_is_denied() {
    use weft_jobs::plugins::svc::MAX_POD_HOSTS_ENV_BYTES;
    let opts = AdmissionOptions::default();
    // 10,000 tasks of one replica: every pod would carry 20,000 references.
    let j = typed(&job(json!({"tasks": many_tasks(10_000)}), Some(r#"{"svc":[]}"#)));
    let v = validate_job(&j, None, &opts);
    let m = v.message();
    assert!(!v.allowed(), "denied");
    assert!(
        m.contains("plugin svc: job ml/tf:")
            && m.contains("20000 host env references")
            && m.contains(&format!("at most {MAX_POD_HOSTS_ENV_BYTES} bytes per pod"))
            && m.contains("-inject-hosts-env=false"),
        "{m}"
    );
    // Its pods (the job got in before weft's webhook, say) get no plugins built.
    let e = PodMutator::new(&j, &opts).expect_err("refused");
    assert!(e[0].to_string().contains("20000 host env references"), "{e:?}");
    // Without the variables the job is fine.
    let j = typed(&job(json!({"tasks": many_tasks(10_000)}), Some(r#"{"svc":["--inject-hosts-env=false"]}"#)));
    assert!(validate_job(&j, None, &opts).allowed());

    // A job within the bound: its pods' patch stays within it (plus svc's hostname, volume and mount).
    let j = typed(&job(json!({"tasks": many_tasks(1_000)}), Some(r#"{"svc":[]}"#)));
    assert!(validate_job(&j, None, &opts).allowed(), "{}", validate_job(&j, None, &opts).message());
    let ops = PodMutator::new(&j, &opts).expect("builds").mutate(&volcano_pod(&j, "t999", 0)).expect("mutates");
    let patch = serde_json::to_vec(&ops).expect("json").len();
    assert!(patch <= MAX_POD_HOSTS_ENV_BYTES + 1024, "{patch}");
    let env = &apply(&volcano_pod(&j, "t999", 0), &ops)["spec"]["containers"][0]["env"];
    assert_eq!(env.as_array().map(Vec::len), Some(2_000));
}

#[test]
fn volcano_svc_host_env_beyond_the_bound_is_a_warning_naming_the_job_and_the_limit() {
    let j = typed(&job(json!({"plugins": {"svc": []}, "tasks": many_tasks(10_000)}), None));
    let v = validate_job(&j, None, &AdmissionOptions::default());
    assert!(v.allowed(), "{}", v.message());
    let w = v.warnings.join("\n");
    assert!(w.contains("plugin svc: job ml/tf:") && w.contains("at most 262144 bytes per pod"), "{w}");
}

#[test]
fn a_host_list_longer_than_one_environment_string_may_be_is_refused() {
    // 4,000 hosts of 36 bytes: VC_WORKER_WITH_A_LONG_NAME_HOSTS resolves to ~144 KB, over Linux's
    // 128 KiB per environment string; the ConfigMap (~288 KB) fits.
    let long = "worker-with-a-long-name";
    let j = typed(&job(json!({"tasks": [task(long, 4_000)]}), Some(r#"{"svc":[]}"#)));
    let m = validate_job(&j, None, &AdmissionOptions::default()).message();
    assert!(
        m.contains("VC_WORKER_WITH_A_LONG_NAME_HOSTS holds") && m.contains("over 131072") && m.contains("E2BIG"),
        "{m}"
    );
    // Volcano's svc: a warning.
    let j = typed(&job(json!({"plugins": {"svc": []}, "tasks": [task(long, 4_000)]}), None));
    let v = validate_job(&j, None, &AdmissionOptions::default());
    assert!(v.allowed() && v.warnings.join("\n").contains("over 131072"), "{v:?}");
}

#[test]
fn the_svc_config_map_is_measured_as_kubernetes_counts_it() {
    // Kubernetes sums the ConfigMap's values, and svc's holds every host twice (<task>.host and
    // VC_<TASK>_HOSTS): 8,000 hosts of 78 bytes are ~624 KB once, ~1.25 MB in the ConfigMap.
    let name = |j: &mut Value| j["metadata"]["name"] = json!("a-job-with-long-name");
    let task_name = "a-task-with-a-thirty-char-name";
    let mut j = job(json!({"tasks": [task(task_name, 8_000)]}), None);
    name(&mut j);
    let v = validate_job(&typed(&j), None, &AdmissionOptions::default());
    assert!(v.message().contains("a-job-with-long-name-svc") && v.message().contains("at most 1048576"), "{v:?}");
    // ~860 KB in the ConfigMap: accepted.
    let mut j = job(json!({"tasks": [task(task_name, 5_500)]}), None);
    name(&mut j);
    let v = validate_job(&typed(&j), None, &AdmissionOptions::default());
    assert!(v.allowed(), "{}", v.message());
}
