//! Golden tests for the svc, env, ssh, tensorflow and hcclrank plugins. Every expected string here
//! is written from Volcano's code (`pkg/controllers/job/plugins/...` at ed72c7c8, summarised in
//! shared/reference/volcano-job-plugins.md), not produced by weft: pods are built as Volcano's job
//! controller builds them (`naming::volcano_pod`), run through `on_pod_create`, and compared.

use std::time::Instant;

use k8s_openapi::api::core::v1::{Container, Pod, Secret};
use serde_json::{Value, json};
use weft_jobs::job::Job;
use weft_jobs::naming;
use weft_jobs::pipeline::JobPlugins;
use weft_jobs::plugin::{
    BuildInput, BuildOptions, Flavor, JobObject, JobPlugin, ObjectContext, PluginError, SshKeyPair,
};
use weft_jobs::plugins::{env, hcclrank, ssh, svc, tensorflow};

type Build = fn(BuildInput<'_>) -> Result<Box<dyn JobPlugin>, PluginError>;

/// A Job from its JSON; `tasks` are `(name, replicas, extra template spec fields)`.
fn job(name: &str, tasks: &[(&str, i32, Value)]) -> Job {
    let tasks: Vec<Value> = tasks
        .iter()
        .map(|(n, r, extra)| {
            let mut spec = json!({
                "containers": [{"name": "main", "image": "img", "env": [{"name": "USER_VAR", "value": "x"}],
                                "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
                "initContainers": [{"name": "init", "image": "img"}],
                "volumes": [{"name": "data", "emptyDir": {}}],
            });
            if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
                spec.extend(extra.clone());
            }
            json!({"name": n, "replicas": r, "template": {"spec": spec}})
        })
        .collect();
    serde_json::from_value(json!({
        "apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
        "metadata": {"name": name, "namespace": "ns", "uid": "uid-1"},
        "spec": {"tasks": tasks},
    }))
    .expect("job parses")
}

fn args(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| (*s).to_owned()).collect()
}

fn build(f: Build, job: &Job, a: &[&str], flavor: Flavor) -> Result<Box<dyn JobPlugin>, PluginError> {
    let a = args(a);
    f(BuildInput { job, args: &a, flavor, options: &BuildOptions::default() })
}

fn weft(f: Build, job: &Job, a: &[&str]) -> Box<dyn JobPlugin> {
    build(f, job, a, Flavor::Weft).expect("builds (weft)")
}

fn volcano(f: Build, job: &Job, a: &[&str]) -> Box<dyn JobPlugin> {
    build(f, job, a, Flavor::Volcano).expect("builds (volcano)")
}

/// Pod `index` of `task`, created by Volcano's controller and mutated by `plugin`.
fn mutated(plugin: &dyn JobPlugin, job: &Job, task: &str, index: usize) -> Pod {
    let t = job.task(task).expect("task exists");
    let mut pod = naming::volcano_pod(job, t, index);
    plugin.on_pod_create(&mut pod).expect("pod mutates");
    pod
}

fn containers(pod: &Pod) -> &[Container] {
    &pod.spec.as_ref().expect("spec").containers
}

fn init_containers(pod: &Pod) -> &[Container] {
    pod.spec.as_ref().expect("spec").init_containers.as_deref().unwrap_or_default()
}

fn to_json<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).expect("serialises")
}

/// The env of a container as JSON (names, values and valueFrom, in order).
fn env_json(c: &Container) -> Value {
    to_json(&c.env)
}

fn tf_config(c: &Container) -> Option<String> {
    c.env.iter().flatten().find(|e| e.name == "TF_CONFIG").and_then(|e| e.value.clone())
}

fn owner() -> Value {
    json!([{"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "name": "my-job", "uid": "uid-1",
            "controller": true, "blockOwnerDeletion": true}])
}

fn fixed_keys() -> SshKeyPair {
    SshKeyPair {
        private_key: "-----BEGIN RSA PRIVATE KEY-----\nAAA\n-----END RSA PRIVATE KEY-----\n".into(),
        public_key: "ssh-rsa AAAAB3 \n".into(),
    }
}

// ---------------------------------------------------------------------------------------------
// tensorflow

/// Volcano's own tensorflow_test.go golden values: job train-123, ps×2, worker×2, chief×1, port 5000.
#[test]
fn tf_config_ps_worker_chief_matches_volcano_test() {
    let j = job("train-123", &[("ps", 2, json!({})), ("worker", 2, json!({})), ("chief", 1, json!({}))]);
    let cluster = r#"{"cluster":{"ps":["train-123-ps-0.train-123:5000","train-123-ps-1.train-123:5000"],"worker":["train-123-worker-0.train-123:5000","train-123-worker-1.train-123:5000"],"chief":["train-123-chief-0.train-123:5000"]},"#;
    for flavor in [Flavor::Weft, Flavor::Volcano] {
        let p = build(tensorflow::build, &j, &["--port=5000"], flavor).expect("builds");
        assert!(p.warnings().is_empty(), "{:?}", p.warnings());
        for (task, i, expected_task) in [
            ("ps", 0, r#""task":{"type":"ps","index":0}}"#),
            ("ps", 1, r#""task":{"type":"ps","index":1}}"#),
            ("worker", 0, r#""task":{"type":"worker","index":0}}"#),
            ("worker", 1, r#""task":{"type":"worker","index":1}}"#),
            ("chief", 0, r#""task":{"type":"chief","index":0}}"#),
        ] {
            let pod = mutated(p.as_ref(), &j, task, i);
            let c = &containers(&pod)[0];
            assert_eq!(tf_config(c), Some(format!("{cluster}{expected_task}")), "{task}-{i}");
            // Appended after the template's env; init containers untouched.
            assert_eq!(c.env.as_ref().expect("env")[0].name, "USER_VAR");
            assert_eq!(c.env.as_ref().expect("env").len(), 2);
            assert_eq!(init_containers(&pod)[0].env, None);
        }
    }
}

/// The reference's example, default port, two containers.
#[test]
fn tf_config_default_port_every_container() {
    let j = job(
        "j",
        &[
            ("ps", 1, json!({})),
            ("worker", 2, json!({"containers": [{"name": "a"}, {"name": "b", "env": [{"name": "E", "value": "1"}]}]})),
        ],
    );
    let p = weft(tensorflow::build, &j, &[]);
    let pod = mutated(p.as_ref(), &j, "worker", 1);
    let expected = r#"{"cluster":{"ps":["j-ps-0.j:2222"],"worker":["j-worker-0.j:2222","j-worker-1.j:2222"]},"task":{"type":"worker","index":1}}"#;
    assert_eq!(env_json(&containers(&pod)[0]), json!([{"name": "TF_CONFIG", "value": expected}]));
    assert_eq!(
        env_json(&containers(&pod)[1]),
        json!([{"name": "E", "value": "1"}, {"name": "TF_CONFIG", "value": expected}])
    );
}

#[test]
fn tf_single_pod_job_is_left_alone() {
    let j = job("j", &[("worker", 1, json!({}))]);
    for flavor in [Flavor::Weft, Flavor::Volcano] {
        let p = build(tensorflow::build, &j, &[], flavor).expect("builds");
        let pod = mutated(p.as_ref(), &j, "worker", 0);
        assert_eq!(tf_config(&containers(&pod)[0]), None);
        assert_eq!(pod, naming::volcano_pod(&j, &j.spec.tasks[0], 0), "pod unchanged");
    }
    // One task with two replicas is distributed.
    let j = job("j", &[("worker", 2, json!({}))]);
    let pod = mutated(weft(tensorflow::build, &j, &[]).as_ref(), &j, "worker", 0);
    assert_eq!(
        tf_config(&containers(&pod)[0]).as_deref(),
        Some(r#"{"cluster":{"worker":["j-worker-0.j:2222","j-worker-1.j:2222"]},"task":{"type":"worker","index":0}}"#)
    );
}

#[test]
fn tf_custom_role_names_with_dashes_and_subdomain() {
    let j = job(
        "my-job",
        &[("param-server", 1, json!({"subdomain": "sub"})), ("trainer", 2, json!({})), ("eval", 1, json!({}))],
    );
    let p = weft(tensorflow::build, &j, &["-ps=param-server", "--worker", "trainer", "--evaluator=eval", "-port=0x10"]);
    let pod = mutated(p.as_ref(), &j, "param-server", 0);
    assert_eq!(
        tf_config(&containers(&pod)[0]).as_deref(),
        Some(
            r#"{"cluster":{"ps":["my-job-param-server-0.sub:16"],"worker":["my-job-trainer-0.my-job:16","my-job-trainer-1.my-job:16"],"evaluator":["my-job-eval-0.my-job:16"]},"task":{"type":"ps","index":0}}"#
        )
    );
    let pod = mutated(p.as_ref(), &j, "eval", 0);
    assert!(tf_config(&containers(&pod)[0]).expect("set").ends_with(r#""task":{"type":"evaluator","index":0}}"#));
}

/// Volcano's quirk: a fixed template hostname gives every replica the same host (the loop does
/// not break, unlike svc's). weft refuses such a job.
#[test]
fn tf_template_hostname_quirk() {
    let j = job("j", &[("ps", 1, json!({})), ("worker", 2, json!({"hostname": "fixed"}))]);
    let p = volcano(tensorflow::build, &j, &[]);
    let pod = mutated(p.as_ref(), &j, "ps", 0);
    assert_eq!(
        tf_config(&containers(&pod)[0]).as_deref(),
        Some(
            r#"{"cluster":{"ps":["j-ps-0.j:2222"],"worker":["fixed.j:2222","fixed.j:2222"]},"task":{"type":"ps","index":0}}"#
        )
    );
    assert_eq!(p.warnings().len(), 1);
    assert!(
        p.warnings()[0].starts_with("plugin tensorflow: task \"worker\" (worker) fixes its template hostname"),
        "{:?}",
        p.warnings()
    );

    let e = build(tensorflow::build, &j, &[], Flavor::Weft).expect_err("weft refuses").to_string();
    assert!(
        e.starts_with("plugin tensorflow: task \"worker\" (worker) fixes its template hostname and has 2 replicas"),
        "{e}"
    );

    // One replica with a fixed hostname is fine.
    let j = job("j", &[("ps", 1, json!({"hostname": "p", "subdomain": "s"})), ("worker", 1, json!({}))]);
    let pod = mutated(weft(tensorflow::build, &j, &[]).as_ref(), &j, "worker", 0);
    assert_eq!(
        tf_config(&containers(&pod)[0]).as_deref(),
        Some(r#"{"cluster":{"ps":["p.s:2222"],"worker":["j-worker-0.j:2222"]},"task":{"type":"worker","index":0}}"#)
    );
}

#[test]
fn tf_task_without_role_is_left_out_but_typed_by_its_name() {
    let j = job("j", &[("worker", 2, json!({})), ("tensorboard", 1, json!({}))]);
    let p = volcano(tensorflow::build, &j, &[]);
    assert_eq!(
        p.warnings(),
        vec![
            "plugin tensorflow: task \"tensorboard\" matches no role flag; Volcano leaves it out of the cluster and gives its pods task type \"tensorboard\""
                .to_owned()
        ]
    );
    let pod = mutated(p.as_ref(), &j, "tensorboard", 0);
    assert_eq!(
        tf_config(&containers(&pod)[0]).as_deref(),
        Some(
            r#"{"cluster":{"worker":["j-worker-0.j:2222","j-worker-1.j:2222"]},"task":{"type":"tensorboard","index":0}}"#
        )
    );
    // weft keeps Volcano's output here.
    let pod2 = mutated(weft(tensorflow::build, &j, &[]).as_ref(), &j, "tensorboard", 0);
    assert_eq!(pod, pod2);
}

#[test]
fn tf_strict_rejections_name_plugin_flag_and_task() {
    let j = job("j", &[("worker", 2, json!({})), ("chief", 1, json!({}))]);
    let err = |a: &[&str]| build(tensorflow::build, &j, a, Flavor::Weft).expect_err("weft rejects").to_string();
    assert_eq!(
        err(&["--prot=1"]),
        "plugin tensorflow: unknown flag -prot (accepted: -ps, -worker, -chief, -evaluator, -port)"
    );
    assert_eq!(err(&["--port=abc"]), "plugin tensorflow: flag -port: invalid value \"abc\": expected an integer");
    assert_eq!(
        err(&["--port=70000"]),
        "plugin tensorflow: flag -port: invalid value \"70000\": expected a port from 1 to 65535"
    );
    assert_eq!(
        err(&["--ps=params"]),
        "plugin tensorflow: flag -ps names task \"params\", which the job does not have (its tasks: worker, chief)"
    );
    assert_eq!(
        err(&["--worker=chief"]),
        "plugin tensorflow: -worker and -chief both name task \"chief\"; a task can have one role only"
    );
    // The default -ps naming no task is fine (all-reduce job).
    assert!(build(tensorflow::build, &j, &[], Flavor::Weft).is_ok());

    let j = job("j", &[("trainer", 3, json!({}))]);
    let e = build(tensorflow::build, &j, &[], Flavor::Weft).expect_err("no role").to_string();
    assert_eq!(
        e,
        "plugin tensorflow: no task of the job matches a role flag (-ps=ps, -worker=worker, -chief=chief, \
         -evaluator=evaluator; its tasks: trainer); name the job's tasks with the role flags, e.g. --worker=<task>"
    );
}

#[test]
fn tf_volcano_flavor_warns_where_volcano_is_silent() {
    let j = job("j", &[("worker", 2, json!({})), ("chief", 1, json!({}))]);
    let p = volcano(tensorflow::build, &j, &["--ps=params", "--bogus", "--port=1"]);
    // Parsing stops at --bogus: --port keeps its default.
    assert_eq!(
        p.warnings(),
        vec![
            "plugin tensorflow: unknown flag -bogus (accepted: -ps, -worker, -chief, -evaluator, -port); Volcano only logs this and goes on: flags before it keep their values, the rest their defaults".to_owned(),
            "plugin tensorflow: -ps names task \"params\", which the job does not have (its tasks: worker, chief); Volcano leaves the ps role out of TF_CONFIG".to_owned(),
        ]
    );
    let pod = mutated(p.as_ref(), &j, "chief", 0);
    assert_eq!(
        tf_config(&containers(&pod)[0]).as_deref(),
        Some(
            r#"{"cluster":{"worker":["j-worker-0.j:2222","j-worker-1.j:2222"],"chief":["j-chief-0.j:2222"]},"task":{"type":"chief","index":0}}"#
        )
    );

    // Two flags on one task: Volcano lists it under the first of ps/worker/chief/evaluator but
    // types its pods by the first of chief/worker/ps/evaluator.
    let p = volcano(tensorflow::build, &j, &["--ps=chief"]);
    let pod = mutated(p.as_ref(), &j, "chief", 0);
    assert_eq!(
        tf_config(&containers(&pod)[0]).as_deref(),
        Some(
            r#"{"cluster":{"ps":["j-chief-0.j:2222"],"worker":["j-worker-0.j:2222","j-worker-1.j:2222"]},"task":{"type":"chief","index":0}}"#
        )
    );
    assert!(
        p.warnings()[0].contains("Volcano lists it as ps in the cluster but gives its pods task type chief"),
        "{:?}",
        p.warnings()
    );

    // No role at all: an empty cluster and the raw task name.
    let j = job("j", &[("trainer", 2, json!({}))]);
    let p = volcano(tensorflow::build, &j, &[]);
    let pod = mutated(p.as_ref(), &j, "trainer", 1);
    assert_eq!(
        tf_config(&containers(&pod)[0]).as_deref(),
        Some(r#"{"cluster":{},"task":{"type":"trainer","index":1}}"#)
    );
    assert_eq!(p.warnings().len(), 1);
}

#[test]
fn tf_pod_without_index_is_refused() {
    let j = job("j", &[("worker", 2, json!({}))]);
    let p = weft(tensorflow::build, &j, &[]);
    let mut pod = naming::volcano_pod(&j, &j.spec.tasks[0], 0);
    pod.metadata.name = Some("j-worker-x".into());
    let e = p.on_pod_create(&mut pod).expect_err("no index");
    assert!(matches!(e, PluginError::Pod { plugin: "tensorflow", .. }), "{e:?}");
    assert!(e.to_string().starts_with("plugin tensorflow: pod \"j-worker-x\": "), "{e}");
    pod.metadata.name = Some("jw".into());
    assert!(p.on_pod_create(&mut pod).is_err());
}

// ---------------------------------------------------------------------------------------------
// svc

fn mpi_job() -> Job {
    job("my-job", &[("mpi-master", 1, json!({})), ("mpi-worker", 3, json!({}))])
}

#[test]
fn svc_objects_golden() {
    let j = mpi_job();
    let keys = fixed_keys();
    let objects = weft(svc::build, &j, &[]).job_objects(&ObjectContext { ssh_keys: &keys }).expect("objects");
    let manifests: Vec<Value> = objects.iter().map(JobObject::to_manifest).collect();
    let selector = json!({"volcano.sh/job-name": "my-job", "volcano.sh/job-namespace": "ns"});
    assert_eq!(
        manifests,
        vec![
            json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "my-job-svc", "namespace": "ns", "ownerReferences": owner()},
                "data": {
                    "mpi_master.host": "my-job-mpi-master-0.my-job",
                    "VC_MPI_MASTER_HOSTS": "my-job-mpi-master-0.my-job",
                    "VC_MPI_MASTER_NUM": "1",
                    "mpi_worker.host": "my-job-mpi-worker-0.my-job\nmy-job-mpi-worker-1.my-job\nmy-job-mpi-worker-2.my-job",
                    "VC_MPI_WORKER_HOSTS": "my-job-mpi-worker-0.my-job,my-job-mpi-worker-1.my-job,my-job-mpi-worker-2.my-job",
                    "VC_MPI_WORKER_NUM": "3",
                },
            }),
            json!({
                "apiVersion": "v1", "kind": "Service",
                "metadata": {"name": "my-job", "namespace": "ns", "ownerReferences": owner()},
                "spec": {"clusterIP": "None", "selector": selector},
            }),
            json!({
                "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                "metadata": {"name": "my-job", "namespace": "ns", "ownerReferences": owner()},
                "spec": {
                    "podSelector": {"matchLabels": selector},
                    "ingress": [{"from": [{"podSelector": {"matchLabels": selector}}]}],
                    "policyTypes": ["Ingress"],
                },
            }),
        ]
    );

    let objects = weft(svc::build, &j, &["--publish-not-ready-addresses", "-disable-network-policy=true"])
        .job_objects(&ObjectContext { ssh_keys: &keys })
        .expect("objects");
    assert_eq!(objects.len(), 2);
    assert_eq!(objects[1].to_manifest()["spec"]["publishNotReadyAddresses"], json!(true));
}

#[test]
fn svc_template_hostname_lists_one_host() {
    let j = job("my-job", &[("head", 3, json!({"hostname": "head", "subdomain": "sub"})), ("w", 0, json!({}))]);
    let keys = fixed_keys();
    let objects = weft(svc::build, &j, &[]).job_objects(&ObjectContext { ssh_keys: &keys }).expect("objects");
    assert_eq!(
        objects[0].to_manifest()["data"],
        json!({"head.host": "head.sub", "VC_HEAD_HOSTS": "head.sub", "VC_HEAD_NUM": "1",
               "w.host": "", "VC_W_HOSTS": "", "VC_W_NUM": "0"})
    );
    // The template's hostname and subdomain stay.
    let pod = mutated(weft(svc::build, &j, &[]).as_ref(), &j, "head", 2);
    let spec = pod.spec.as_ref().expect("spec");
    assert_eq!((spec.hostname.as_deref(), spec.subdomain.as_deref()), (Some("head"), Some("sub")));
}

#[test]
fn svc_pod_golden() {
    let j = mpi_job();
    let pod = mutated(weft(svc::build, &j, &[]).as_ref(), &j, "mpi-worker", 2);
    let spec = to_json(pod.spec.as_ref().expect("spec"));
    let cm = |key: &str| json!({"name": key, "valueFrom": {"configMapKeyRef": {"name": "my-job-svc", "key": key}}});
    let host_env =
        [cm("VC_MPI_MASTER_HOSTS"), cm("VC_MPI_MASTER_NUM"), cm("VC_MPI_WORKER_HOSTS"), cm("VC_MPI_WORKER_NUM")];
    let mount = json!({"name": "my-job-svc", "mountPath": "/etc/volcano"});
    let mut main_env = vec![json!({"name": "USER_VAR", "value": "x"})];
    main_env.extend(host_env.iter().cloned());
    assert_eq!(spec["hostname"], json!("my-job-mpi-worker-2"));
    assert_eq!(spec["subdomain"], json!("my-job"));
    assert_eq!(spec["containers"][0]["env"], Value::Array(main_env));
    assert_eq!(spec["initContainers"][0]["env"], Value::Array(host_env.to_vec()));
    assert_eq!(spec["containers"][0]["volumeMounts"], json!([{"name": "data", "mountPath": "/data"}, mount]));
    assert_eq!(spec["initContainers"][0]["volumeMounts"], json!([mount]));
    assert_eq!(
        spec["volumes"],
        json!([{"name": "data", "emptyDir": {}}, {"name": "my-job-svc", "configMap": {"name": "my-job-svc"}}])
    );

    // Without the env: names and mounts only.
    let pod = mutated(weft(svc::build, &j, &["--inject-hosts-env=false"]).as_ref(), &j, "mpi-master", 0);
    assert_eq!(env_json(&containers(&pod)[0]), json!([{"name": "USER_VAR", "value": "x"}]));
    assert_eq!(init_containers(&pod)[0].env, None);
}

#[test]
fn svc_strict_rejections() {
    let j = mpi_job();
    let e = build(svc::build, &j, &["--inject-hosts-env=maybe"], Flavor::Weft).expect_err("bad bool").to_string();
    assert_eq!(
        e,
        "plugin svc: flag -inject-hosts-env: invalid value \"maybe\": expected a bool (true, false, 1, 0, t, f)"
    );
    // Go: `--inject-hosts-env false` is the bool flag then a positional argument.
    let e = build(svc::build, &j, &["--inject-hosts-env", "false"], Flavor::Weft).expect_err("positional");
    assert!(e.to_string().starts_with("plugin svc: unexpected argument \"false\""), "{e}");
    let p = volcano(svc::build, &j, &["--inject-hosts-env", "false"]);
    assert_eq!(p.warnings().len(), 1);
    // ... and Volcano injects the env (the flag was set to true).
    let pod = mutated(p.as_ref(), &j, "mpi-master", 0);
    assert_eq!(containers(&pod)[0].env.as_ref().expect("env").len(), 5);
}

// ---------------------------------------------------------------------------------------------
// env

#[test]
fn env_index_order_on_containers_and_init_containers() {
    let j = mpi_job();
    for flavor in [Flavor::Weft, Flavor::Volcano] {
        let p = build(env::build, &j, &[], flavor).expect("builds");
        let pod = mutated(p.as_ref(), &j, "mpi-worker", 2);
        assert_eq!(
            env_json(&containers(&pod)[0]),
            json!([{"name": "USER_VAR", "value": "x"}, {"name": "VK_TASK_INDEX", "value": "2"},
                   {"name": "VC_TASK_INDEX", "value": "2"}])
        );
        assert_eq!(
            env_json(&init_containers(&pod)[0]),
            json!([{"name": "VK_TASK_INDEX", "value": "2"}, {"name": "VC_TASK_INDEX", "value": "2"}])
        );
    }
    let e = build(env::build, &j, &["--index=1"], Flavor::Weft).expect_err("no flags").to_string();
    assert_eq!(e, r#"plugin env: takes no arguments, got ["--index=1"]"#);
}

// ---------------------------------------------------------------------------------------------
// ssh

fn secret(objects: &[JobObject]) -> &Secret {
    match objects {
        [JobObject::Secret(s)] => s,
        other => panic!("expected one Secret, got {other:?}"),
    }
}

fn secret_text(s: &Secret, key: &str) -> String {
    let data = s.data.as_ref().expect("data");
    String::from_utf8(data.get(key).expect("key present").0.clone()).expect("utf-8")
}

#[test]
fn ssh_secret_golden_two_tasks() {
    let j = job("my-job", &[("mpi-master", 1, json!({})), ("mpi-worker", 2, json!({}))]);
    let keys = fixed_keys();
    let objects = weft(ssh::build, &j, &[]).job_objects(&ObjectContext { ssh_keys: &keys }).expect("objects");
    let s = secret(&objects);
    assert_eq!(
        secret_text(s, "config"),
        "StrictHostKeyChecking no\nUserKnownHostsFile /dev/null\n\
         Host my-job-mpi-master-0\n  HostName my-job-mpi-master-0.my-job\n  Port 22\n\
         Host my-job-mpi-worker-0\n  HostName my-job-mpi-worker-0.my-job\n  Port 22\n\
         Host my-job-mpi-worker-1\n  HostName my-job-mpi-worker-1.my-job\n  Port 22\n"
    );
    assert_eq!(secret_text(s, "id_rsa"), keys.private_key);
    assert_eq!(secret_text(s, "id_rsa.pub"), keys.public_key);
    assert_eq!(secret_text(s, "authorized_keys"), keys.public_key);
    let m = objects[0].to_manifest();
    assert_eq!(m["kind"], "Secret");
    assert_eq!(m["type"], "Opaque");
    assert_eq!(m["metadata"], json!({"name": "my-job-ssh", "namespace": "ns", "ownerReferences": owner()}));
    let mut data_keys: Vec<&str> = m["data"].as_object().expect("data").keys().map(String::as_str).collect();
    data_keys.sort_unstable();
    assert_eq!(data_keys, ["authorized_keys", "config", "id_rsa", "id_rsa.pub"]);
}

#[test]
fn ssh_config_with_hostname_subdomain_and_port() {
    let j = job("my-job", &[("head", 3, json!({"hostname": "head"})), ("w", 1, json!({"subdomain": "sub"}))]);
    let keys = fixed_keys();
    let objects =
        weft(ssh::build, &j, &["--ssh-port=2222"]).job_objects(&ObjectContext { ssh_keys: &keys }).expect("objects");
    assert_eq!(
        secret_text(secret(&objects), "config"),
        "StrictHostKeyChecking no\nUserKnownHostsFile /dev/null\n\
         Host head\n  HostName head.my-job\n  Port 2222\n\
         Host my-job-w-0\n  HostName my-job-w-0.sub\n  Port 2222\n"
    );
}

#[test]
fn ssh_volume_and_mounts_golden() {
    let j = mpi_job();
    let items = json!([
        {"key": "id_rsa", "path": ".ssh/id_rsa"},
        {"key": "id_rsa.pub", "path": ".ssh/id_rsa.pub"},
        {"key": "authorized_keys", "path": ".ssh/authorized_keys"},
        {"key": "config", "path": ".ssh/config"},
    ]);
    for (a, path, mode) in [
        (&[][..], "/root/.ssh", 0o600),
        (&["--ssh-key-file-path=/home/user/.ssh"], "/home/user/.ssh", 0o644),
        (&["--ssh-key-file-path=/root/.ssh/"], "/root/.ssh/", 0o644),
    ] {
        let pod = mutated(weft(ssh::build, &j, a).as_ref(), &j, "mpi-worker", 0);
        let spec = to_json(pod.spec.as_ref().expect("spec"));
        assert_eq!(
            spec["volumes"],
            json!([{"name": "data", "emptyDir": {}},
                   {"name": "my-job-ssh", "secret": {"secretName": "my-job-ssh", "items": items, "defaultMode": mode}}])
        );
        let mount = json!({"name": "my-job-ssh", "mountPath": path, "subPath": ".ssh"});
        assert_eq!(spec["containers"][0]["volumeMounts"], json!([{"name": "data", "mountPath": "/data"}, mount]));
        assert_eq!(spec["initContainers"][0]["volumeMounts"], json!([mount]));
    }
    assert_eq!((0o600, 0o644), (384, 420));
}

#[test]
fn ssh_user_keys_and_strict_rejections() {
    let j = mpi_job();
    let keys = fixed_keys();
    let ctx = ObjectContext { ssh_keys: &keys };
    let p = weft(ssh::build, &j, &["--ssh-private-key=PRIV", "--ssh-public-key=PUB"]);
    let objects = p.job_objects(&ctx).expect("objects");
    let s = secret(&objects);
    assert_eq!(
        (secret_text(s, "id_rsa"), secret_text(s, "id_rsa.pub"), secret_text(s, "authorized_keys")),
        ("PRIV".into(), "PUB".into(), "PUB".into())
    );

    let err = |a: &[&str]| build(ssh::build, &j, a, Flavor::Weft).expect_err("weft rejects").to_string();
    assert_eq!(
        err(&["--ssh-port=70000"]),
        "plugin ssh: flag -ssh-port: invalid value \"70000\": expected a port from 1 to 65535"
    );
    assert_eq!(
        err(&["--ssh-prot=22"]),
        "plugin ssh: unknown flag -ssh-prot (accepted: -ssh-key-file-path, -ssh-private-key, -ssh-public-key, -ssh-port)"
    );
    assert!(
        err(&["--ssh-private-key=PRIV"])
            .starts_with("plugin ssh: flag -ssh-private-key is given without -ssh-public-key")
    );

    // Volcano: the port falls back to 22, a lone private key is stored with an empty public key.
    let p = volcano(ssh::build, &j, &["--ssh-port=-1", "--ssh-private-key=PRIV"]);
    assert_eq!(p.warnings().len(), 2, "{:?}", p.warnings());
    assert_eq!(p.warnings()[0], "plugin ssh: invalid ssh port -1; Volcano falls back to port 22");
    let objects = p.job_objects(&ctx).expect("objects");
    let s = secret(&objects);
    assert!(secret_text(s, "config").ends_with("  Port 22\n"));
    assert_eq!((secret_text(s, "id_rsa"), secret_text(s, "authorized_keys")), ("PRIV".into(), String::new()));
}

#[test]
fn ssh_random_keys_land_in_the_secret() {
    let j = mpi_job();
    let objects =
        weft(ssh::build, &j, &[]).job_objects(&ObjectContext { ssh_keys: &ssh::RandomKeys }).expect("objects");
    let s = secret(&objects);
    assert!(secret_text(s, "id_rsa").starts_with("-----BEGIN RSA PRIVATE KEY-----\n"));
    assert!(secret_text(s, "id_rsa.pub").starts_with("ssh-rsa AAAA"));
    assert_eq!(ssh::keys_from_secret(s).map(|k| k.public_key), Some(secret_text(s, "authorized_keys")));
}

// ---------------------------------------------------------------------------------------------
// hcclrank

fn rank(pod: &Pod) -> Option<&str> {
    pod.metadata.annotations.as_ref().and_then(|a| a.get("hccl/rankIndex")).map(String::as_str)
}

#[test]
fn hcclrank_ranks_master_then_workers() {
    let j = job("j", &[("master", 2, json!({})), ("worker", 3, json!({})), ("other", 1, json!({}))]);
    let p = weft(hcclrank::build, &j, &[]);
    assert_eq!(rank(&mutated(p.as_ref(), &j, "master", 1)), Some("1"));
    assert_eq!(rank(&mutated(p.as_ref(), &j, "worker", 0)), Some("2"));
    assert_eq!(rank(&mutated(p.as_ref(), &j, "worker", 2)), Some("4"));
    assert_eq!(rank(&mutated(p.as_ref(), &j, "other", 0)), None);

    // A RANK env var (pytorch's) wins; an existing annotation is kept.
    let mut pod = naming::volcano_pod(&j, &j.spec.tasks[1], 0);
    let spec = pod.spec.as_mut().expect("spec");
    spec.containers[0].env.get_or_insert_with(Vec::new).push(k8s_openapi::api::core::v1::EnvVar {
        name: "RANK".into(),
        value: Some("7".into()),
        value_from: None,
    });
    p.on_pod_create(&mut pod).expect("mutates");
    assert_eq!(rank(&pod), Some("7"));
    pod.metadata.annotations.as_mut().expect("annotations").insert("hccl/rankIndex".into(), "9".into());
    p.on_pod_create(&mut pod).expect("mutates");
    assert_eq!(rank(&pod), Some("9"));

    // Custom role names.
    let p = weft(hcclrank::build, &j, &["--master=other", "--worker=master"]);
    assert_eq!(rank(&mutated(p.as_ref(), &j, "master", 1)), Some("2"));
}

#[test]
fn hcclrank_missing_master() {
    let j = job("j", &[("worker", 3, json!({}))]);
    let e = build(hcclrank::build, &j, &[], Flavor::Weft).expect_err("no master").to_string();
    assert_eq!(
        e,
        "plugin hcclrank: flag -master names task \"master\", which the job does not have (its tasks: worker)"
    );
    let e = build(hcclrank::build, &job("j", &[("master", 1, json!({}))]), &["--worker=w"], Flavor::Weft)
        .expect_err("explicit worker missing")
        .to_string();
    assert_eq!(e, "plugin hcclrank: flag -worker names task \"w\", which the job does not have (its tasks: master)");

    let p = volcano(hcclrank::build, &j, &[]);
    assert_eq!(p.warnings().len(), 1);
    assert_eq!(rank(&mutated(p.as_ref(), &j, "worker", 2)), Some("2"), "Volcano: 0 master replicas");
}

#[test]
fn hcclrank_needs_the_task_index_label() {
    let j = job("j", &[("master", 1, json!({})), ("worker", 1, json!({}))]);
    let p = weft(hcclrank::build, &j, &[]);
    let mut pod = naming::volcano_pod(&j, &j.spec.tasks[1], 0);
    pod.metadata.labels.as_mut().expect("labels").remove(naming::TASK_INDEX_KEY);
    let e = p.on_pod_create(&mut pod).expect_err("no label").to_string();
    assert_eq!(e, "plugin hcclrank: pod \"j-worker-0\": it has no label volcano.sh/task-index, which its rank needs");
}

// ---------------------------------------------------------------------------------------------
// together, and at scale

/// svc, ssh and env through the pipeline (Volcano's spec.plugins): weft's fixed order.
#[test]
fn svc_ssh_env_in_pipeline_order() {
    let mut j = mpi_job();
    j.spec.plugins = Some([("env", vec![]), ("ssh", vec![]), ("svc", vec![])].map(|(k, v)| (k.to_owned(), v)).into());
    let plugins = JobPlugins::volcano(&j);
    assert!(plugins.warnings().is_empty(), "{:?}", plugins.warnings());
    let mut pod = naming::volcano_pod(&j, &j.spec.tasks[0], 0);
    plugins.mutate_pod(&mut pod).expect("mutates");
    let names: Vec<&str> = containers(&pod)[0].env.iter().flatten().map(|e| e.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "USER_VAR",
            "VC_MPI_MASTER_HOSTS",
            "VC_MPI_MASTER_NUM",
            "VC_MPI_WORKER_HOSTS",
            "VC_MPI_WORKER_NUM",
            "VK_TASK_INDEX",
            "VC_TASK_INDEX"
        ]
    );
    let mounts: Vec<&str> = containers(&pod)[0].volume_mounts.iter().flatten().map(|m| m.mount_path.as_str()).collect();
    assert_eq!(mounts, ["/data", "/etc/volcano", "/root/.ssh"]);
}

/// A 1,000-pod job: every pod mutated by all five plugins; checks the last pod and reports the
/// time per pod (the budget is well under 1 ms per pod in release; the assert is loose for debug).
#[test]
fn thousand_pod_job() {
    let j = job("big", &[("ps", 8, json!({})), ("worker", 992, json!({})), ("master", 1, json!({}))]);
    let plugins: Vec<Box<dyn JobPlugin>> = vec![
        weft(svc::build, &j, &[]),
        weft(ssh::build, &j, &[]),
        weft(env::build, &j, &[]),
        weft(tensorflow::build, &j, &[]),
        weft(hcclrank::build, &j, &[]),
    ];
    let start = Instant::now();
    let mut last = None;
    for t in &j.spec.tasks {
        for i in 0..naming::replicas(t) {
            let mut pod = naming::volcano_pod(&j, t, i);
            for p in &plugins {
                p.on_pod_create(&mut pod).expect("mutates");
            }
            last = Some(pod);
        }
    }
    let per_pod = start.elapsed() / 1001;
    eprintln!("1,001 pods, 5 plugins: {per_pod:?} per pod (including volcano_pod)");
    let last = last.expect("pods");
    let tf = tf_config(&containers(&last)[0]).expect("TF_CONFIG");
    assert!(tf.starts_with(r#"{"cluster":{"ps":["big-ps-0.big:2222","#));
    assert!(
        tf.contains(r#""big-worker-991.big:2222"]},"task":{"type":"master","index":0}}"#),
        "{}",
        &tf[tf.len() - 80..]
    );
    assert_eq!(rank(&last), Some("0"));
    assert!(per_pod.as_millis() < 20, "{per_pod:?} per pod");
}
