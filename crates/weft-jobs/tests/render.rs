//! `render` over the example jobs in `deploy/examples/jobs/`: what admission, Volcano's plugins and
//! weft's plugins together give each pod, with expected values written from Volcano's formats and
//! the design (hostfile lines, TF_CONFIG, MPI_HOST, the wait container's arguments).

use k8s_openapi::api::core::v1::{Container, Pod};
use serde_json::{Value, json};
use weft_jobs::Flavor;
use weft_jobs::admission::AdmissionOptions;
use weft_jobs::render::{PLACEHOLDER_KEY, PlaceholderKeys, RenderError, Rendered, render};

fn example(name: &str) -> Value {
    let path = format!("{}/../../deploy/examples/jobs/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).expect("example exists");
    serde_saphyr::from_str(&text).expect("example is YAML")
}

fn rendered(job: &Value) -> Rendered {
    render(job, &AdmissionOptions::default(), &PlaceholderKeys).expect("renders")
}

fn pod<'a>(r: &'a Rendered, name: &str) -> &'a Pod {
    &r.pods.iter().find(|p| p.pod.metadata.name.as_deref() == Some(name)).expect("pod exists").pod
}

fn main_container(p: &Pod) -> &Container {
    &p.spec.as_ref().expect("spec").containers[0]
}

fn env_value<'a>(c: &'a Container, name: &str) -> Option<&'a str> {
    c.env.iter().flatten().find(|e| e.name == name).and_then(|e| e.value.as_deref())
}

fn env_names(c: &Container) -> Vec<&str> {
    c.env.iter().flatten().map(|e| e.name.as_str()).collect()
}

fn object<'a>(r: &'a Rendered, kind: &str, name: &str) -> &'a Value {
    &r.objects
        .iter()
        .find(|o| o.object["kind"] == kind && o.object["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
        .object
}

#[test]
fn mpi_job_gets_hostfile_ssh_and_a_launcher_that_waits_for_every_worker() {
    let r = rendered(&example("mpi.yaml"));
    let plugins: Vec<(&str, Flavor)> = r.plugins.iter().map(|p| (p.name, p.source)).collect();
    assert_eq!(plugins, [("svc", Flavor::Weft), ("ssh", Flavor::Weft), ("mpi", Flavor::Weft)], "dependencies added");
    let names: Vec<&str> = r.pods.iter().map(|p| p.pod.metadata.name.as_deref().unwrap_or("")).collect();
    assert_eq!(names, ["nccl-tests-launcher-0", "nccl-tests-worker-0", "nccl-tests-worker-1"]);

    // The design's hostfile: one line per worker, slots = the worker's GPUs (8).
    let hostfile = object(&r, "ConfigMap", "nccl-tests-mpi-hostfile");
    assert_eq!(
        hostfile["data"]["hostfile"],
        "nccl-tests-worker-0.nccl-tests slots=8\nnccl-tests-worker-1.nccl-tests slots=8"
    );
    assert_eq!(hostfile["metadata"]["namespace"], "ml");
    assert_eq!(hostfile["metadata"]["ownerReferences"][0]["kind"], "Job");

    let launcher = pod(&r, "nccl-tests-launcher-0");
    let c = main_container(launcher);
    assert_eq!(env_value(c, "MPI_HOST"), Some("nccl-tests-worker-0.nccl-tests,nccl-tests-worker-1.nccl-tests"));
    assert_eq!(env_value(c, "OMPI_MCA_orte_default_hostfile"), Some("/etc/mpi/hostfile"));
    let init = launcher.spec.as_ref().and_then(|s| s.init_containers.as_ref()).expect("init containers");
    assert_eq!(init.len(), 1);
    assert_eq!(init[0].name, "weft-wait-for-worker");
    assert_eq!(init[0].command, Some(vec!["weft".to_owned(), "wait-for".to_owned()]));
    assert_eq!(
        init[0].args,
        Some(vec!["--timeout=600".to_owned(), "nccl-tests-worker-{0..1}.nccl-tests:22".to_owned()])
    );
    // Workers wait for nothing and carry no MPI_HOST.
    let worker = pod(&r, "nccl-tests-worker-1");
    assert!(worker.spec.as_ref().and_then(|s| s.init_containers.as_ref()).is_none_or(Vec::is_empty));
    assert_eq!(env_value(main_container(worker), "MPI_HOST"), None);

    // The ssh Secret is there, with placeholder keys in a render.
    let secret = object(&r, "Secret", "nccl-tests-ssh");
    let config = secret["data"]["config"].as_str().expect("base64 config");
    assert!(!config.is_empty());
    let id_rsa = secret["data"]["id_rsa"].as_str().expect("key");
    let decoded = String::from_utf8(base64_decode(id_rsa)).expect("utf-8");
    assert_eq!(decoded, PLACEHOLDER_KEY);
}

#[test]
fn volcano_env_then_weft_svc_and_tensorflow_give_each_pod_its_tf_config() {
    let r = rendered(&example("tensorflow.yaml"));
    let plugins: Vec<(&str, Flavor)> = r.plugins.iter().map(|p| (p.name, p.source)).collect();
    assert_eq!(plugins, [("env", Flavor::Volcano), ("svc", Flavor::Weft), ("tensorflow", Flavor::Weft)]);
    let w1 = main_container(pod(&r, "tf-ps-worker-1"));
    assert_eq!(
        env_value(w1, "TF_CONFIG"),
        Some(
            r#"{"cluster":{"ps":["tf-ps-ps-0.tf-ps:2222","tf-ps-ps-1.tf-ps:2222"],"worker":["tf-ps-worker-0.tf-ps:2222","tf-ps-worker-1.tf-ps:2222","tf-ps-worker-2.tf-ps:2222","tf-ps-worker-3.tf-ps:2222"]},"task":{"type":"worker","index":1}}"#
        )
    );
    // Volcano's env plugin runs in Volcano's controller, before weft's admission: its vars come first.
    assert_eq!(
        env_names(w1),
        ["VK_TASK_INDEX", "VC_TASK_INDEX", "VC_PS_HOSTS", "VC_PS_NUM", "VC_WORKER_HOSTS", "VC_WORKER_NUM", "TF_CONFIG"]
    );
    assert_eq!(env_value(w1, "VC_TASK_INDEX"), Some("1"));
    let ps0 = main_container(pod(&r, "tf-ps-ps-0"));
    assert!(env_value(ps0, "TF_CONFIG").is_some_and(|t| t.ends_with(r#""task":{"type":"ps","index":0}}"#)));
    // The svc plugin's hosts ConfigMap, as Volcano writes it.
    let hosts = object(&r, "ConfigMap", "tf-ps-svc");
    assert_eq!(hosts["data"]["VC_PS_HOSTS"], "tf-ps-ps-0.tf-ps,tf-ps-ps-1.tf-ps");
    assert_eq!(hosts["data"]["ps.host"], "tf-ps-ps-0.tf-ps\ntf-ps-ps-1.tf-ps");
    assert_eq!(hosts["data"]["VC_WORKER_NUM"], "4");
}

#[test]
fn pytorch_workers_get_rank_pet_vars_and_wait_for_the_master() {
    let r = rendered(&example("pytorch.yaml"));
    let w2 = pod(&r, "llama-ft-worker-2");
    let c = main_container(w2);
    let pairs: Vec<(&str, Option<&str>)> = [
        "MASTER_ADDR",
        "MASTER_PORT",
        "WORLD_SIZE",
        "RANK",
        "PET_MASTER_ADDR",
        "PET_MASTER_PORT",
        "PET_NNODES",
        "PET_NODE_RANK",
        "PET_NPROC_PER_NODE",
    ]
    .iter()
    .map(|n| (*n, env_value(c, n)))
    .collect();
    assert_eq!(
        pairs,
        [
            ("MASTER_ADDR", Some("llama-ft-master-0.llama-ft")),
            ("MASTER_PORT", Some("23456")),
            ("WORLD_SIZE", Some("4")),
            ("RANK", Some("3")),
            ("PET_MASTER_ADDR", Some("llama-ft-master-0.llama-ft")),
            ("PET_MASTER_PORT", Some("23456")),
            ("PET_NNODES", Some("4")),
            ("PET_NODE_RANK", Some("3")),
            ("PET_NPROC_PER_NODE", Some("8")),
        ]
    );
    let init = w2.spec.as_ref().and_then(|s| s.init_containers.as_ref()).expect("wait");
    assert_eq!(init[0].args, Some(vec!["--timeout=600".to_owned(), "llama-ft-master-0.llama-ft:23456".to_owned()]));
    let master = main_container(pod(&r, "llama-ft-master-0"));
    assert_eq!(env_value(master, "RANK"), Some("0"));
}

#[test]
fn render_fills_admission_defaults_and_the_default_namespace() {
    let mut job = example("ray.yaml");
    job["metadata"].as_object_mut().expect("metadata").remove("namespace");
    let r = rendered(&job);
    assert_eq!(r.job["metadata"]["namespace"], "default");
    assert_eq!(r.job["spec"]["queue"], "default");
    assert_eq!(r.job["spec"]["maxRetry"], 3);
    assert_eq!(
        serde_json::from_str::<Value>(r.job["metadata"]["annotations"]["weft.io/job-plugins"].as_str().expect("s"))
            .expect("json"),
        json!({"ray": [], "svc": []})
    );
    let head_svc = object(&r, "Service", "ray-cluster-head-svc");
    assert_eq!(head_svc["metadata"]["namespace"], "default");
    let head = main_container(pod(&r, "ray-cluster-head-0"));
    assert_eq!(
        head.command,
        Some(vec!["sh".to_owned(), "-c".to_owned(), "ray start --head --block --dashboard-host=0.0.0.0 --port=6379 --dashboard-port=8265 --ray-client-server-port=10001".to_owned()])
    );
    let worker = main_container(pod(&r, "ray-cluster-worker-0"));
    assert_eq!(
        worker.command,
        Some(vec![
            "sh".to_owned(),
            "-c".to_owned(),
            "ray start --block --address=ray-cluster-head-0.ray-cluster:6379".to_owned()
        ])
    );
}

#[test]
fn jobs_the_webhook_would_deny_are_errors_naming_plugin_flag_and_task() {
    let mut job = example("pytorch.yaml");
    job["metadata"]["annotations"]["weft.io/job-plugins"] = json!(r#"{"pytorch": ["--master=launcher"]}"#);
    match render(&job, &AdmissionOptions::default(), &PlaceholderKeys) {
        Err(RenderError::Denied(errors)) => {
            assert!(
                errors
                    .iter()
                    .any(|e| e.contains("plugin pytorch") && e.contains("-master") && e.contains("\"launcher\"")),
                "{errors:?}"
            )
        }
        other => panic!("expected a denial, got {other:?}"),
    }
    let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"}});
    assert!(matches!(
        render(&deployment, &AdmissionOptions::default(), &PlaceholderKeys),
        Err(RenderError::NotAJob(_))
    ));
}

#[test]
fn every_example_renders_and_each_pod_is_a_valid_pod_object() {
    for name in ["mpi.yaml", "mxnet.yaml", "pytorch.yaml", "ray.yaml", "tensorflow.yaml"] {
        let r = rendered(&example(name));
        let total: i64 =
            r.job["spec"]["tasks"].as_array().expect("tasks").iter().map(|t| t["replicas"].as_i64().unwrap_or(0)).sum();
        assert_eq!(r.pods.len() as i64, total, "{name}");
        for p in &r.pods {
            let n = p.pod.metadata.name.as_deref().unwrap_or("");
            for c in p.pod.spec.iter().flat_map(|s| s.init_containers.iter().flatten().chain(&s.containers)) {
                assert!(c.name.len() <= 63, "{name}: {n}: container {}", c.name);
                let mut seen = std::collections::BTreeSet::new();
                for e in c.env.iter().flatten() {
                    assert!(seen.insert(&e.name), "{name}: {n}/{}: env {} twice", c.name, e.name);
                }
            }
        }
    }
}

fn base64_decode(s: &str) -> Vec<u8> {
    // The k8s-openapi ByteString wire form is standard base64; decode it through serde.
    let v: k8s_openapi::ByteString = serde_json::from_value(Value::String(s.to_owned())).expect("base64");
    v.0
}
