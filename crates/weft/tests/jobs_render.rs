//! `weft jobs render` as a user runs it: the example jobs, every output form, and the errors.

use std::process::Command;

use serde_json::Value;

fn weft(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_weft")).args(args).output().expect("weft runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn example(name: &str) -> String {
    format!("{}/../../deploy/examples/jobs/{name}", env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn json_output_holds_the_job_pods_objects_and_plugins() {
    let (code, out, err) = weft(&["jobs", "render", &example("mpi.yaml"), "-o", "json"]);
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).expect("JSON on stdout");
    assert_eq!(v["pods"].as_array().map(Vec::len), Some(3));
    assert_eq!(v["plugins"][2]["name"], "mpi");
    assert_eq!(v["plugins"][2]["source"], "weft");
    let kinds: Vec<&str> =
        v["objects"].as_array().expect("objects").iter().filter_map(|o| o["object"]["kind"].as_str()).collect();
    assert_eq!(kinds, ["ConfigMap", "Service", "NetworkPolicy", "Secret", "ConfigMap"]);
}

#[test]
fn yaml_output_is_one_document_per_object_with_kinds() {
    let (code, out, err) = weft(&["jobs", "render", &example("ray.yaml"), "-o", "yaml"]);
    assert_eq!(code, 0, "{err}");
    let docs: Vec<Value> = serde_saphyr::from_multiple(&out).expect("YAML documents");
    let kinds: Vec<&str> = docs.iter().filter_map(|d| d["kind"].as_str()).collect();
    // The job, 3 pods, then svc's ConfigMap/Service/NetworkPolicy and ray's head Service.
    assert_eq!(kinds, ["Job", "Pod", "Pod", "Pod", "ConfigMap", "Service", "NetworkPolicy", "Service"]);
    assert_eq!(docs[1]["metadata"]["name"], "ray-cluster-head-0");
}

#[test]
fn the_table_names_pods_by_task_range_and_the_objects() {
    let (code, out, err) = weft(&["jobs", "render", &example("pytorch.yaml")]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("Job ml/llama-ft: 4 pods"), "{out}");
    assert!(out.contains("llama-ft-worker-{0..2}"), "{out}");
    assert!(out.contains("weft-wait-for-master"), "{out}");
    assert!(out.contains("llama-ft-svc"), "{out}");
}

#[test]
fn a_job_the_webhook_would_deny_exits_2_with_the_reason() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("bad.yaml");
    let text = std::fs::read_to_string(example("ray.yaml")).expect("example");
    std::fs::write(&path, text.replace(r#"'{"ray": []}'"#, r#"'{"ray": ["--headContainer=ray-head"]}'"#))
        .expect("write");
    let (code, _, err) = weft(&["jobs", "render", path.to_str().expect("utf-8")]);
    assert_eq!(code, 2);
    assert!(err.contains("job ray-cluster") && err.contains("-headContainer") && err.contains("\"ray-head\""), "{err}");
}

#[test]
fn a_file_without_a_volcano_job_says_so() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("deploy.yaml");
    std::fs::write(&path, "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: x\n").expect("write");
    let (code, _, err) = weft(&["jobs", "render", path.to_str().expect("utf-8")]);
    assert_eq!(code, 2);
    assert!(err.contains("no Volcano Job") && err.contains("1 document"), "{err}");
    let (code, _, err) = weft(&["jobs", "render", "/nonexistent/job.yaml"]);
    assert_eq!(code, 2);
    assert!(err.contains("/nonexistent/job.yaml"), "{err}");
}

#[test]
fn a_job_volcano_would_deny_exits_2_with_volcanos_reason() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("dup.yaml");
    let text = std::fs::read_to_string(example("tensorflow.yaml")).expect("example");
    // Both tasks named worker: Volcano's webhook says "duplicated task name worker;".
    std::fs::write(&path, text.replace("- name: ps", "- name: worker")).expect("write");
    let (code, out, err) = weft(&["jobs", "render", path.to_str().expect("utf-8")]);
    assert_eq!(code, 2, "{out}");
    assert!(err.contains("duplicated task name worker;"), "{err}");
}

/// What `weft jobs render` printed when it held every pod at once: `to_string_pretty` of the whole
/// render (one job: the object; more: a list), and the YAML documents (job, pods, objects).
fn printed_whole(files: &[String]) -> (String, String) {
    use weft_jobs::admission::AdmissionOptions;
    use weft_jobs::render::{PlaceholderKeys, render};
    let renders: Vec<_> = files
        .iter()
        .map(|f| {
            let job: Value = serde_saphyr::from_str(&std::fs::read_to_string(f).expect("read")).expect("YAML");
            render(&job, &AdmissionOptions::default(), &PlaceholderKeys).expect("renders")
        })
        .collect();
    let json = if let [one] = renders.as_slice() { serde_json::to_value(one) } else { serde_json::to_value(&renders) };
    let json = serde_json::to_string_pretty(&json.expect("value")).expect("json") + "\n";
    let mut yaml = String::new();
    for r in &renders {
        let mut docs = vec![r.job.clone()];
        for p in &r.pods {
            let mut v = serde_json::to_value(&p.pod).expect("pod");
            v["apiVersion"] = "v1".into();
            v["kind"] = "Pod".into();
            docs.push(v);
        }
        docs.extend(r.objects.iter().map(|o| o.object.clone()));
        for d in &docs {
            yaml.push_str("---\n");
            yaml.push_str(&serde_saphyr::to_string(d).expect("yaml"));
        }
    }
    (json, yaml)
}

fn stdout_of(file: &str, output: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_weft"))
        .args(["jobs", "render", file, "-o", output])
        .env_remove("WEFT_WAIT_IMAGE")
        .output()
        .expect("weft runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("utf-8")
}

#[test]
fn output_written_a_pod_at_a_time_is_what_the_whole_render_printed() {
    for name in ["mpi.yaml", "mxnet.yaml", "pytorch.yaml", "ray.yaml", "tensorflow.yaml"] {
        let file = example(name);
        let (json, yaml) = printed_whole(std::slice::from_ref(&file));
        assert_eq!(stdout_of(&file, "json"), json, "{name}");
        assert_eq!(stdout_of(&file, "yaml"), yaml, "{name}");
    }
    // Two jobs in one file: JSON is a list of them.
    let dir = tempfile::tempdir().expect("tmp");
    let both = dir.path().join("both.yaml");
    let text = |n: &str| std::fs::read_to_string(example(n)).expect("example");
    std::fs::write(&both, format!("{}\n---\n{}", text("mpi.yaml"), text("ray.yaml"))).expect("write");
    let (json, yaml) = printed_whole(&[example("mpi.yaml"), example("ray.yaml")]);
    let both = both.to_str().expect("utf-8");
    assert_eq!(stdout_of(both, "json"), json);
    assert_eq!(stdout_of(both, "yaml"), yaml);
}
