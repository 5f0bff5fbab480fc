//! Golden tests for the framework plugins pytorch, mpi, ray and mxnet.
//!
//! Every expected value here is written by hand from Volcano's code (volcano-sh/volcano at
//! ed72c7c8, `pkg/controllers/job/plugins/distributed-framework/*`), its MXNet example and the
//! design (`docs/design/distributed-framework-plugins.md`), not produced by the code under test.
//! Pods are built the way Volcano's job controller builds them ([`naming::volcano_pod`]) and then
//! passed to the plugin's `on_pod_create`.

use k8s_openapi::api::core::v1::{Container, Pod};
use serde_json::{Value, json};
use weft_jobs::naming;
use weft_jobs::plugin::{BuildInput, BuildOptions, Flavor, JobPlugin, ObjectContext, PluginError, SshKeyPair};
use weft_jobs::plugins::{BuildFn, mpi, mxnet, pytorch, ray};
use weft_jobs::{Job, JobPlugins};

const IMAGE: &str = "weft:test";

fn options() -> BuildOptions {
    BuildOptions { wait_image: IMAGE.to_owned(), ..BuildOptions::default() }
}

/// A job `name` in namespace `ns` (uid `u1`) with the given tasks.
fn job_named(name: &str, tasks: Value) -> Job {
    serde_json::from_value(json!({
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": "ns", "uid": "u1"},
        "spec": {"tasks": tasks},
    }))
    .expect("job parses")
}

fn jobj(tasks: Value) -> Job {
    job_named("j", tasks)
}

/// A task with one container `main`.
fn task(name: &str, replicas: i32) -> Value {
    task_with(name, replicas, json!({"containers": [{"name": "main", "image": "img"}]}))
}

fn task_with(name: &str, replicas: i32, spec: Value) -> Value {
    json!({"name": name, "replicas": replicas, "template": {"spec": spec}})
}

fn gpu_container(name: &str, resources: Value) -> Value {
    json!({"name": name, "image": "img", "resources": resources})
}

fn args(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| (*s).to_owned()).collect()
}

fn build(f: BuildFn, job: &Job, a: &[&str], flavor: Flavor) -> Result<Box<dyn JobPlugin>, PluginError> {
    let opts = options();
    let a = args(a);
    f(BuildInput { job, args: &a, flavor, options: &opts })
}

fn weft(f: BuildFn, job: &Job, a: &[&str]) -> Box<dyn JobPlugin> {
    build(f, job, a, Flavor::Weft).expect("weft build")
}

fn volcano(f: BuildFn, job: &Job, a: &[&str]) -> Box<dyn JobPlugin> {
    build(f, job, a, Flavor::Volcano).expect("volcano build")
}

fn rejected(f: BuildFn, job: &Job, a: &[&str]) -> String {
    build(f, job, a, Flavor::Weft).expect_err("strict build rejects").to_string()
}

/// Replica `i` of `task` after the plugin ran.
fn pod(plugin: &dyn JobPlugin, job: &Job, task: &str, i: usize) -> Pod {
    let t = job.task(task).expect("task");
    let mut pod = naming::volcano_pod(job, t, i);
    plugin.on_pod_create(&mut pod).expect("on_pod_create");
    pod
}

fn containers(pod: &Pod) -> &[Container] {
    &pod.spec.as_ref().expect("spec").containers
}

fn init_containers(pod: &Pod) -> &[Container] {
    pod.spec.as_ref().expect("spec").init_containers.as_deref().unwrap_or_default()
}

fn init_names(pod: &Pod) -> Vec<&str> {
    init_containers(pod).iter().map(|c| c.name.as_str()).collect()
}

/// `NAME=value` for each env var of the container, in order.
fn env(c: &Container) -> Vec<String> {
    c.env.iter().flatten().map(|e| format!("{}={}", e.name, e.value.as_deref().unwrap_or("<valueFrom>"))).collect()
}

fn ports(c: &Container) -> Value {
    serde_json::to_value(&c.ports).expect("ports")
}

fn strs(a: &[&str]) -> Vec<String> {
    args(a)
}

/// The weft wait init container for `task` with these arguments, as `launch::wait_container`
/// documents it.
fn assert_weft_wait(c: &Container, task: &str, wait_args: &[&str]) {
    assert_eq!(c.name, format!("weft-wait-for-{task}"));
    assert_eq!(c.image.as_deref(), Some(IMAGE));
    assert_eq!(c.command, Some(strs(&["weft", "wait-for"])));
    assert_eq!(c.args, Some(strs(wait_args)));
    assert!(c.env.is_none() && c.ports.is_none() && c.volume_mounts.is_none(), "wait container is bare: {c:?}");
}

fn objects(plugin: &dyn JobPlugin) -> Vec<Value> {
    let keys = SshKeyPair { private_key: String::new(), public_key: String::new() };
    let ctx = ObjectContext { ssh_keys: &keys };
    plugin.job_objects(&ctx).expect("objects").iter().map(|o| o.to_manifest()).collect()
}

fn owner() -> Value {
    json!([{"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "name": "j", "uid": "u1",
            "controller": true, "blockOwnerDeletion": true}])
}

// ------------------------------------------------------------------------------------------------
// pytorch
// ------------------------------------------------------------------------------------------------

/// master 1, worker 3, and a tensorboard task that is neither.
fn pytorch_job() -> Job {
    jobj(json!([task("master", 1), task("worker", 3), task("tensorboard", 1)]))
}

#[test]
fn pytorch_volcano_env_order_rank_and_port() {
    let job = pytorch_job();
    let p = volcano(pytorch::build, &job, &[]);
    assert!(p.warnings().is_empty());

    let master = pod(p.as_ref(), &job, "master", 0);
    let c = &containers(&master)[0];
    assert_eq!(env(c), strs(&["MASTER_ADDR=j-master-0.j", "MASTER_PORT=23456", "WORLD_SIZE=4", "RANK=0"]));
    assert_eq!(ports(c), json!([{"name": "pytorchjob-port", "containerPort": 23456}]));
    assert!(init_containers(&master).is_empty());

    let worker = pod(p.as_ref(), &job, "worker", 2);
    let c = &containers(&worker)[0];
    assert_eq!(env(c), strs(&["MASTER_ADDR=j-master-0.j", "MASTER_PORT=23456", "WORLD_SIZE=4", "RANK=3"]));
    assert_eq!(ports(c), json!([{"name": "pytorchjob-port", "containerPort": 23456}]));
    assert!(init_containers(&worker).is_empty(), "Volcano waits only with --wait-master-enabled");

    // WORLD_SIZE counts master + worker only (Volcano PR #4281); other tasks get no RANK.
    let tb = pod(p.as_ref(), &job, "tensorboard", 0);
    let c = &containers(&tb)[0];
    assert_eq!(env(c), strs(&["MASTER_ADDR=j-master-0.j", "MASTER_PORT=23456", "WORLD_SIZE=4"]));
    assert_eq!(ports(c), json!([{"name": "pytorchjob-port", "containerPort": 23456}]));
    assert!(objects(p.as_ref()).is_empty());
}

#[test]
fn pytorch_appends_after_existing_env_and_keeps_an_exposed_port() {
    let job = jobj(json!([task_with(
        "master",
        1,
        json!({"containers": [
            {"name": "main", "env": [{"name": "A", "value": "1"}], "ports": [{"name": "dist", "containerPort": 23456}]},
            {"name": "side"}
        ]})
    )]));
    let p = volcano(pytorch::build, &job, &[]);
    let m = pod(p.as_ref(), &job, "master", 0);
    let [main, side] = containers(&m) else { panic!("two containers") };
    assert_eq!(env(main), strs(&["A=1", "MASTER_ADDR=j-master-0.j", "MASTER_PORT=23456", "WORLD_SIZE=1", "RANK=0"]));
    assert_eq!(ports(main), json!([{"name": "dist", "containerPort": 23456}]));
    assert_eq!(env(side), strs(&["MASTER_ADDR=j-master-0.j", "MASTER_PORT=23456", "WORLD_SIZE=1", "RANK=0"]));
    assert_eq!(ports(side), json!([{"name": "pytorchjob-port", "containerPort": 23456}]));
}

#[test]
fn pytorch_volcano_wait_for_master_script_is_volcanos() {
    let job = pytorch_job();
    let p = volcano(pytorch::build, &job, &["--wait-master-enabled", "--wait-master-timeout=120", "--port=29500"]);
    let w = pod(p.as_ref(), &job, "worker", 0);
    let [init] = init_containers(&w) else { panic!("one init container: {:?}", init_names(&w)) };
    let script = concat!(
        "echo \"Waiting for master node j-master-0.j:29500 to be ready...\"\n",
        "TIMEOUT=120\n",
        "ELAPSED=0\n",
        "until { nc -z j-master-0.j 29500 || echo > /dev/tcp/j-master-0.j/29500; } 2>/dev/null; do\n",
        "  if [ $ELAPSED -ge $TIMEOUT ]; then\n",
        "    echo \"Timeout waiting for master after ${TIMEOUT} seconds\"\n",
        "    exit 1\n",
        "  fi\n",
        "  echo \"Master not ready yet, retrying in 2 seconds... (elapsed: ${ELAPSED}s)\"\n",
        "  sleep 2\n",
        "  ELAPSED=$((ELAPSED + 2))\n",
        "done\n",
        "echo \"Master node is ready!\"",
    );
    assert_eq!(
        serde_json::to_value(init).expect("json"),
        json!({"name": "wait-for-master", "image": "busybox:1.36.1", "command": ["sh", "-c", script]})
    );
    // Masters and other tasks never wait.
    assert!(init_containers(&pod(p.as_ref(), &job, "master", 0)).is_empty());
    assert!(init_containers(&pod(p.as_ref(), &job, "tensorboard", 0)).is_empty());
}

#[test]
fn pytorch_volcano_is_lenient_like_go() {
    let job = pytorch_job();
    // Go stops at the bad value: -master after it keeps its default, and -port holds what Go's
    // intValue.Set stored before returning the error: strconv.ParseInt's 0.
    let p = volcano(pytorch::build, &job, &["--port=abc", "--master=boss"]);
    let w = p.warnings();
    assert_eq!(w.len(), 2, "{w:?}");
    assert!(w[0].contains("plugin pytorch") && w[0].contains("-port") && w[0].contains("abc"), "{}", w[0]);
    assert!(w[0].contains("goes on with -port=0"), "{}", w[0]);
    assert!(w[1].contains("port 0") && w[1].contains("API server rejects the pod"), "{}", w[1]);
    let m = pod(p.as_ref(), &job, "master", 0);
    assert_eq!(env(&containers(&m)[0])[1], "MASTER_PORT=0");
    let ports = containers(&m)[0].ports.clone().unwrap_or_default();
    assert!(ports.iter().any(|p| p.name.as_deref() == Some("pytorchjob-port") && p.container_port == 0), "{ports:?}");

    // weft's own flags are unknown to Volcano.
    let p = volcano(pytorch::build, &job, &["--wait=false"]);
    assert!(p.warnings()[0].contains("unknown flag -wait"), "{:?}", p.warnings());

    // No master task: Volcano changes nothing, weft says so.
    let p = volcano(pytorch::build, &job, &["--master=boss"]);
    assert!(p.warnings().iter().any(|w| w.contains("-master") && w.contains("\"boss\"")), "{:?}", p.warnings());
    let t = job.task("worker").expect("worker");
    let mut w = naming::volcano_pod(&job, t, 1);
    let before = w.clone();
    p.on_pod_create(&mut w).expect("no-op");
    assert_eq!(w, before);
}

#[test]
fn pytorch_weft_adds_pet_vars_and_waits_for_the_master() {
    let gpus = json!({"containers": [gpu_container("main", json!({"limits": {"nvidia.com/gpu": "8"}}))]});
    let job = jobj(json!([task_with("master", 1, gpus.clone()), task_with("worker", 3, gpus), task("tensorboard", 1)]));
    let p = weft(pytorch::build, &job, &[]);

    let m = pod(p.as_ref(), &job, "master", 0);
    assert_eq!(
        env(&containers(&m)[0]),
        strs(&[
            "MASTER_ADDR=j-master-0.j",
            "MASTER_PORT=23456",
            "WORLD_SIZE=4",
            "RANK=0",
            "PET_MASTER_ADDR=j-master-0.j",
            "PET_MASTER_PORT=23456",
            "PET_NNODES=4",
            "PET_NODE_RANK=0",
            "PET_NPROC_PER_NODE=8",
        ])
    );
    assert!(init_containers(&m).is_empty(), "the master waits for no one");

    let w = pod(p.as_ref(), &job, "worker", 2);
    assert_eq!(
        env(&containers(&w)[0]),
        strs(&[
            "MASTER_ADDR=j-master-0.j",
            "MASTER_PORT=23456",
            "WORLD_SIZE=4",
            "RANK=3",
            "PET_MASTER_ADDR=j-master-0.j",
            "PET_MASTER_PORT=23456",
            "PET_NNODES=4",
            "PET_NODE_RANK=3",
            "PET_NPROC_PER_NODE=8",
        ])
    );
    let [wait] = init_containers(&w) else { panic!("one wait: {:?}", init_names(&w)) };
    assert_weft_wait(wait, "master", &["--timeout=600", "j-master-0.j:23456"]);

    // No GPUs: no PET_NPROC_PER_NODE; not a role: no RANK, no PET_NODE_RANK, no wait.
    let tb = pod(p.as_ref(), &job, "tensorboard", 0);
    assert_eq!(
        env(&containers(&tb)[0]),
        strs(&[
            "MASTER_ADDR=j-master-0.j",
            "MASTER_PORT=23456",
            "WORLD_SIZE=4",
            "PET_MASTER_ADDR=j-master-0.j",
            "PET_MASTER_PORT=23456",
            "PET_NNODES=4",
        ])
    );
    assert!(init_containers(&tb).is_empty());
}

#[test]
fn pytorch_nproc_per_node_from_flag_limit_or_request() {
    let job = jobj(json!([
        task_with(
            "master",
            1,
            json!({"containers": [
                gpu_container("a", json!({"requests": {"nvidia.com/gpu": "2"}})),
                gpu_container("b", json!({"limits": {"nvidia.com/gpu": "4"}, "requests": {"nvidia.com/gpu": "4"}})),
                gpu_container("c", json!({"limits": {"nvidia.com/gpu": "0"}})),
            ]})
        ),
        task("worker", 1),
    ]));
    let nproc = |p: &dyn JobPlugin| -> Vec<Option<String>> {
        let m = pod(p, &job, "master", 0);
        containers(&m)
            .iter()
            .map(|c| env(c).into_iter().find_map(|e| e.strip_prefix("PET_NPROC_PER_NODE=").map(str::to_owned)))
            .collect()
    };
    let p = weft(pytorch::build, &job, &[]);
    assert_eq!(nproc(p.as_ref()), vec![Some("2".to_owned()), Some("4".to_owned()), None]);
    for flag in ["gpu", "cpu", "auto", "3"] {
        let p = weft(pytorch::build, &job, &[&format!("--nproc-per-node={flag}")]);
        assert_eq!(nproc(p.as_ref()), vec![Some(flag.to_owned()); 3]);
    }
    // Volcano sets no PET_* at all.
    let p = volcano(pytorch::build, &job, &[]);
    let m = pod(p.as_ref(), &job, "master", 0);
    assert!(containers(&m).iter().flat_map(env).all(|e| !e.starts_with("PET_")));
}

#[test]
fn pytorch_never_both_waits() {
    let job = pytorch_job();
    let p = weft(pytorch::build, &job, &["--wait-master-enabled"]);
    let w = pod(p.as_ref(), &job, "worker", 0);
    assert_eq!(init_names(&w), vec!["wait-for-master"]);
    let command = init_containers(&w)[0].command.as_ref().expect("command");
    assert!(command[2].contains("TIMEOUT=300\n"), "Volcano's default timeout");

    let p = weft(pytorch::build, &job, &["--wait=false"]);
    assert!(init_containers(&pod(p.as_ref(), &job, "worker", 0)).is_empty());

    let p = weft(pytorch::build, &job, &["--wait-master-enabled", "--wait=false"]);
    assert_eq!(init_names(&pod(p.as_ref(), &job, "worker", 0)), vec!["wait-for-master"]);

    let e = rejected(pytorch::build, &job, &["--wait-master-enabled", "--wait=true"]);
    assert!(e.contains("plugin pytorch") && e.contains("-wait") && e.contains("-wait-master-enabled"), "{e}");

    let p = weft(pytorch::build, &job, &["--wait-timeout=30", "--port=29500"]);
    let w = pod(p.as_ref(), &job, "worker", 1);
    assert_weft_wait(&init_containers(&w)[0], "master", &["--timeout=30", "j-master-0.j:29500"]);
}

#[test]
fn pytorch_wait_is_added_once_and_after_the_users_init_containers() {
    let job = jobj(json!([
        task("master", 1),
        task_with("worker", 2, json!({"initContainers": [{"name": "prep"}], "containers": [{"name": "main"}]})),
    ]));
    let p = weft(pytorch::build, &job, &[]);
    let t = job.task("worker").expect("worker");
    let mut w = naming::volcano_pod(&job, t, 0);
    p.on_pod_create(&mut w).expect("first");
    p.on_pod_create(&mut w).expect("again");
    assert_eq!(init_names(&w), vec!["prep", "weft-wait-for-master"]);
    assert!(init_containers(&w)[0].env.is_none(), "pytorch sets env on containers only");
}

#[test]
fn pytorch_dashed_task_names_and_hostname() {
    let job = job_named("my-job", json!([task("pt-master", 1), task("pt-worker", 2)]));
    let p = weft(pytorch::build, &job, &["--master=pt-master", "--worker=pt-worker"]);
    let w = pod(p.as_ref(), &job, "pt-worker", 1);
    assert_eq!(w.metadata.name.as_deref(), Some("my-job-pt-worker-1"));
    let e = env(&containers(&w)[0]);
    assert_eq!(e[0], "MASTER_ADDR=my-job-pt-master-0.my-job");
    assert_eq!(e[2], "WORLD_SIZE=3");
    assert_eq!(e[3], "RANK=2");
    assert_weft_wait(&init_containers(&w)[0], "pt-master", &["--timeout=600", "my-job-pt-master-0.my-job:23456"]);

    let job = jobj(json!([
        task_with("master", 1, json!({"hostname": "boss", "subdomain": "sub", "containers": [{"name": "main"}]})),
        task("worker", 1),
    ]));
    let p = weft(pytorch::build, &job, &[]);
    let w = pod(p.as_ref(), &job, "worker", 0);
    assert_eq!(env(&containers(&w)[0])[0], "MASTER_ADDR=boss.sub");
    assert_weft_wait(&init_containers(&w)[0], "master", &["--timeout=600", "boss.sub:23456"]);
}

#[test]
fn pytorch_single_pod_job() {
    let job = jobj(json!([task("master", 1)]));
    let p = weft(pytorch::build, &job, &[]);
    let m = pod(p.as_ref(), &job, "master", 0);
    assert_eq!(
        env(&containers(&m)[0]),
        strs(&[
            "MASTER_ADDR=j-master-0.j",
            "MASTER_PORT=23456",
            "WORLD_SIZE=1",
            "RANK=0",
            "PET_MASTER_ADDR=j-master-0.j",
            "PET_MASTER_PORT=23456",
            "PET_NNODES=1",
            "PET_NODE_RANK=0",
        ])
    );
    assert!(init_containers(&m).is_empty());
}

#[test]
fn pytorch_strict_rejections_name_plugin_flag_and_task() {
    let job = pytorch_job();
    let e = rejected(pytorch::build, &job, &["--master=boss"]);
    assert!(
        e.contains("plugin pytorch") && e.contains("-master") && e.contains("\"boss\"") && e.contains("worker"),
        "{e}"
    );

    let two = job_named("j", json!([task("master", 2), task("worker", 2)]));
    let e = rejected(pytorch::build, &two, &[]);
    assert!(
        e.contains("plugin pytorch") && e.contains("-master") && e.contains("\"master\"") && e.contains("2 replicas"),
        "{e}"
    );
    // Volcano takes it (every master gets RANK 0).
    let p = volcano(pytorch::build, &two, &[]);
    assert_eq!(env(&containers(&pod(p.as_ref(), &two, "master", 1))[0])[3], "RANK=0");

    let e = rejected(pytorch::build, &job, &["--worker=workers"]);
    assert!(e.contains("plugin pytorch") && e.contains("-worker") && e.contains("\"workers\""), "{e}");
    let e = rejected(pytorch::build, &job, &["--worker=master"]);
    assert!(e.contains("-master") && e.contains("-worker") && e.contains("differ"), "{e}");
    for bad in ["--port=0", "--port=65536", "--port=-1"] {
        let e = rejected(pytorch::build, &job, &[bad]);
        assert!(e.contains("plugin pytorch") && e.contains("-port") && e.contains("65535"), "{bad}: {e}");
    }
    for bad in ["--nproc-per-node=0", "--nproc-per-node=lots", "--nproc-per-node=-2"] {
        let e = rejected(pytorch::build, &job, &[bad]);
        assert!(e.contains("-nproc-per-node"), "{bad}: {e}");
    }
    let e = rejected(pytorch::build, &job, &["--wait-timeout=0"]);
    assert!(e.contains("plugin pytorch") && e.contains("-wait-timeout"), "{e}");
    let e = rejected(pytorch::build, &job, &["--wait-master-enabled", "--wait-master-timeout=0", "--wait=false"]);
    assert!(e.contains("-wait-master-timeout"), "{e}");
    let e = rejected(pytorch::build, &job, &["--prot=1"]);
    assert!(e.contains("plugin pytorch") && e.contains("unknown flag -prot"), "{e}");
    let e = rejected(pytorch::build, &job, &["--wait", "false"]);
    assert!(e.contains("plugin pytorch") && e.contains("\"false\""), "Go's bool syntax: {e}");
    // A worker task that is absent but not asked for is fine (master-only job).
    assert!(build(pytorch::build, &job_named("j", json!([task("master", 1)])), &[], Flavor::Weft).is_ok());
}

#[test]
fn pytorch_flags_match_volcano() {
    let names: Vec<(&str, &str)> = pytorch::FLAGS.iter().map(|f| (f.name, f.default)).collect();
    assert_eq!(
        names,
        vec![
            ("master", "master"),
            ("worker", "worker"),
            ("port", "23456"),
            ("wait-master-enabled", "false"),
            ("wait-master-timeout", "300"),
            ("wait-master-image", "busybox:1.36.1"),
        ]
    );
    // weft's flavor parses Volcano's flags followed by its own; its own must not shadow one.
    for module_flags in [
        (pytorch::FLAGS, pytorch::WEFT_EXTRA_FLAGS),
        (mpi::FLAGS, mpi::WEFT_EXTRA_FLAGS),
        (ray::FLAGS, ray::WEFT_EXTRA_FLAGS),
    ] {
        let (volcano, extra) = module_flags;
        assert!(extra.iter().all(|e| volcano.iter().all(|v| v.name != e.name)), "{extra:?}");
    }
}

// ------------------------------------------------------------------------------------------------
// mpi
// ------------------------------------------------------------------------------------------------

/// master 1 (with a user init container), worker 3.
fn mpi_job(worker: Value) -> Job {
    jobj(json!([
        task_with("master", 1, json!({"initContainers": [{"name": "prep"}], "containers": [{"name": "main"}]})),
        worker,
    ]))
}

#[test]
fn mpi_volcano_mpi_host_and_ports() {
    let job = mpi_job(task("worker", 3));
    let p = volcano(mpi::build, &job, &[]);
    let m = pod(p.as_ref(), &job, "master", 0);
    let host = "MPI_HOST=j-worker-0.j,j-worker-1.j,j-worker-2.j";
    for c in init_containers(&m).iter().chain(containers(&m)) {
        assert_eq!(env(c), strs(&[host]), "{}", c.name);
        assert_eq!(ports(c), json!([{"name": "mpijob-port", "containerPort": 22}]), "{}", c.name);
        assert!(c.volume_mounts.is_none());
    }
    assert_eq!(init_names(&m), vec!["prep"]);
    assert!(m.spec.as_ref().expect("spec").volumes.is_none());

    let w = pod(p.as_ref(), &job, "worker", 1);
    let c = &containers(&w)[0];
    assert!(c.env.is_none());
    assert_eq!(ports(c), json!([{"name": "mpijob-port", "containerPort": 22}]));
    assert!(objects(p.as_ref()).is_empty(), "Volcano writes no hostfile");
}

#[test]
fn mpi_volcano_hostname_missing_worker_and_missing_master() {
    let job = mpi_job(task_with("worker", 3, json!({"hostname": "w", "containers": [{"name": "main"}]})));
    let p = volcano(mpi::build, &job, &["--port=2222"]);
    let m = pod(p.as_ref(), &job, "master", 0);
    assert_eq!(env(&containers(&m)[0]), strs(&["MPI_HOST=w.j"]));
    assert_eq!(ports(&containers(&m)[0]), json!([{"name": "mpijob-port", "containerPort": 2222}]));

    // No worker task: master pods are left exactly as they were (not even the port); others get
    // the port.
    let job = jobj(json!([task("master", 1), task("other", 1)]));
    let p = volcano(mpi::build, &job, &[]);
    assert!(p.warnings().iter().any(|w| w.contains("-worker") && w.contains("\"worker\"")), "{:?}", p.warnings());
    let t = job.task("master").expect("master");
    let mut m = naming::volcano_pod(&job, t, 0);
    let before = m.clone();
    p.on_pod_create(&mut m).expect("no-op");
    assert_eq!(m, before);
    let o = pod(p.as_ref(), &job, "other", 0);
    assert_eq!(ports(&containers(&o)[0]), json!([{"name": "mpijob-port", "containerPort": 22}]));

    // No master task: Volcano's webhook rejects the job.
    let e = build(mpi::build, &job, &["--master=launcher"], Flavor::Volcano).expect_err("rejected").to_string();
    assert!(
        e.contains("plugin mpi")
            && e.contains("\"launcher\"")
            && e.contains("The specified mpi master task was not found"),
        "{e}"
    );
}

#[test]
fn mpi_weft_hostfile_configmap_with_slots_flag() {
    let job = mpi_job(task("worker", 3));
    let p = weft(mpi::build, &job, &["--slots=4"]);
    assert_eq!(
        objects(p.as_ref()),
        vec![json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "j-mpi-hostfile", "namespace": "ns", "ownerReferences": owner()},
            "data": {"hostfile": "j-worker-0.j slots=4\nj-worker-1.j slots=4\nj-worker-2.j slots=4"},
        })]
    );
}

fn hostfile_of(p: &dyn JobPlugin) -> String {
    objects(p)[0]["data"]["hostfile"].as_str().expect("hostfile").to_owned()
}

#[test]
fn mpi_weft_hostfile_slots_from_gpus_and_hostname() {
    // Per pod: limits else requests, summed over containers: 2 + 1 = 3.
    let worker = task_with(
        "worker",
        3,
        json!({"containers": [
            gpu_container("a", json!({"limits": {"nvidia.com/gpu": "2"}, "requests": {"nvidia.com/gpu": "1"}})),
            gpu_container("b", json!({"requests": {"nvidia.com/gpu": "1"}})),
            gpu_container("c", json!({"limits": {"cpu": "2"}})),
        ]}),
    );
    let job = mpi_job(worker);
    let p = weft(mpi::build, &job, &[]);
    assert_eq!(hostfile_of(p.as_ref()), "j-worker-0.j slots=3\nj-worker-1.j slots=3\nj-worker-2.j slots=3");
    // The flag wins over the GPUs.
    let p = weft(mpi::build, &job, &["--slots=1"]);
    assert_eq!(hostfile_of(p.as_ref()), "j-worker-0.j slots=1\nj-worker-1.j slots=1\nj-worker-2.j slots=1");

    // No GPUs: one slot.
    let p = weft(mpi::build, &mpi_job(task("worker", 2)), &[]);
    assert_eq!(hostfile_of(p.as_ref()), "j-worker-0.j slots=1\nj-worker-1.j slots=1");

    // A fixed hostname is one line; a subdomain is honoured.
    let job =
        mpi_job(task_with("worker", 3, json!({"hostname": "w", "subdomain": "s", "containers": [{"name": "m"}]})));
    let p = weft(mpi::build, &job, &["--slots=4"]);
    assert_eq!(hostfile_of(p.as_ref()), "w.s slots=4");
    assert_eq!(env(&containers(&pod(p.as_ref(), &job, "master", 0))[0])[0], "MPI_HOST=w.s");
}

#[test]
fn mpi_weft_pods_mount_the_hostfile_and_the_master_waits_for_sshd() {
    let job = mpi_job(task("worker", 3));
    let p = weft(mpi::build, &job, &[]);
    let m = pod(p.as_ref(), &job, "master", 0);
    let spec = m.spec.as_ref().expect("spec");
    assert_eq!(
        serde_json::to_value(&spec.volumes).expect("json"),
        json!([{"name": "j-mpi-hostfile", "configMap": {"name": "j-mpi-hostfile"}}])
    );
    let mount = json!([{"name": "j-mpi-hostfile", "mountPath": "/etc/mpi"}]);
    let main = &containers(&m)[0];
    assert_eq!(
        env(main),
        strs(&["MPI_HOST=j-worker-0.j,j-worker-1.j,j-worker-2.j", "OMPI_MCA_orte_default_hostfile=/etc/mpi/hostfile"])
    );
    assert_eq!(serde_json::to_value(&main.volume_mounts).expect("json"), mount);
    assert_eq!(ports(main), json!([{"name": "mpijob-port", "containerPort": 22}]));

    assert_eq!(init_names(&m), vec!["prep", "weft-wait-for-worker"]);
    let prep = &init_containers(&m)[0];
    assert_eq!(env(prep), strs(&["MPI_HOST=j-worker-0.j,j-worker-1.j,j-worker-2.j"]), "OMPI_* on containers only");
    assert_eq!(serde_json::to_value(&prep.volume_mounts).expect("json"), mount);
    assert_eq!(ports(prep), json!([{"name": "mpijob-port", "containerPort": 22}]));
    assert_weft_wait(&init_containers(&m)[1], "worker", &["--timeout=600", "j-worker-{0..2}.j:22"]);

    let w = pod(p.as_ref(), &job, "worker", 2);
    let c = &containers(&w)[0];
    assert_eq!(env(c), strs(&["OMPI_MCA_orte_default_hostfile=/etc/mpi/hostfile"]));
    assert_eq!(serde_json::to_value(&c.volume_mounts).expect("json"), mount);
    assert!(init_containers(&w).is_empty(), "workers wait for no one");

    let p = weft(mpi::build, &job, &["--wait=false", "--port=2222"]);
    let m = pod(p.as_ref(), &job, "master", 0);
    assert_eq!(init_names(&m), vec!["prep"]);
    assert_eq!(ports(&containers(&m)[0]), json!([{"name": "mpijob-port", "containerPort": 2222}]));

    let p = weft(mpi::build, &job, &["--wait-timeout=90", "--port=2222"]);
    let m = pod(p.as_ref(), &job, "master", 0);
    assert_weft_wait(&init_containers(&m)[1], "worker", &["--timeout=90", "j-worker-{0..2}.j:2222"]);
}

#[test]
fn mpi_weft_dashed_names_single_worker_and_second_run() {
    let job = job_named("my-job", json!([task("mpi-master", 1), task("mpi-worker", 1)]));
    let p = weft(mpi::build, &job, &["--master=mpi-master", "--worker=mpi-worker"]);
    assert_eq!(objects(p.as_ref())[0]["metadata"]["name"], "my-job-mpi-hostfile");
    assert_eq!(hostfile_of(p.as_ref()), "my-job-mpi-worker-0.my-job slots=1");
    let t = job.task("mpi-master").expect("master");
    let mut m = naming::volcano_pod(&job, t, 0);
    p.on_pod_create(&mut m).expect("first");
    p.on_pod_create(&mut m).expect("again");
    let spec = m.spec.as_ref().expect("spec");
    assert_eq!(spec.volumes.as_ref().map(Vec::len), Some(1));
    assert_eq!(spec.containers[0].volume_mounts.as_ref().map(Vec::len), Some(1));
    assert_eq!(init_names(&m), vec!["weft-wait-for-mpi-worker"]);
    assert_weft_wait(&init_containers(&m)[0], "mpi-worker", &["--timeout=600", "my-job-mpi-worker-0.my-job:22"]);
}

#[test]
fn mpi_strict_rejections() {
    let job = mpi_job(task("worker", 3));
    let e = rejected(mpi::build, &job, &["--worker=workers"]);
    assert!(e.contains("plugin mpi") && e.contains("-worker") && e.contains("\"workers\""), "{e}");
    let e = rejected(mpi::build, &job, &["--master=launcher"]);
    assert!(e.contains("plugin mpi") && e.contains("-master") && e.contains("\"launcher\""), "{e}");
    let e = rejected(mpi::build, &job, &["--master=worker"]);
    assert!(e.contains("plugin mpi") && e.contains("differ"), "{e}");
    for bad in ["--slots=0", "--slots=-2"] {
        let e = rejected(mpi::build, &job, &[bad]);
        assert!(e.contains("plugin mpi") && e.contains("-slots"), "{bad}: {e}");
    }
    let e = rejected(mpi::build, &job, &["--port=0"]);
    assert!(e.contains("-port"), "{e}");
    let e = rejected(mpi::build, &job, &["--wait-timeout=-5"]);
    assert!(e.contains("-wait-timeout"), "{e}");
    // Volcano knows no --slots.
    let p = volcano(mpi::build, &job, &["--slots=4"]);
    assert!(p.warnings()[0].contains("unknown flag -slots"), "{:?}", p.warnings());
    let names: Vec<(&str, &str)> = mpi::FLAGS.iter().map(|f| (f.name, f.default)).collect();
    assert_eq!(names, vec![("master", "master"), ("worker", "worker"), ("port", "22")]);
}

// ------------------------------------------------------------------------------------------------
// ray
// ------------------------------------------------------------------------------------------------

fn ray_job() -> Job {
    jobj(json!([
        task_with(
            "head",
            1,
            json!({"containers": [
                {"name": "head", "image": "ray", "command": ["old"], "ports": [{"name": "dash", "containerPort": 8266}]},
                {"name": "sidecar", "image": "x"}
            ]})
        ),
        task_with("worker", 2, json!({"containers": [{"name": "worker", "image": "ray"}, {"name": "sidecar"}]})),
    ]))
}

const RAY_PORTS: &[&str] = &["--port=6380", "--dashboardPort=8266", "--clientPort=10002"];

#[test]
fn ray_volcano_head_and_worker_commands_with_custom_ports() {
    let job = ray_job();
    let p = volcano(ray::build, &job, RAY_PORTS);
    let h = pod(p.as_ref(), &job, "head", 0);
    let [head, sidecar] = containers(&h) else { panic!("two containers") };
    assert_eq!(
        head.command,
        Some(strs(&[
            "sh",
            "-c",
            "ray start --head --block --dashboard-host=0.0.0.0 --port=6380 --dashboard-port=8266 --ray-client-server-port=10002"
        ]))
    );
    assert_eq!(
        ports(head),
        json!([
            {"name": "dash", "containerPort": 8266},
            {"name": "gcs", "containerPort": 6380},
            {"name": "client-server", "containerPort": 10002},
        ])
    );
    assert!(sidecar.command.is_none() && sidecar.ports.is_none());
    assert!(init_containers(&h).is_empty());

    let w = pod(p.as_ref(), &job, "worker", 1);
    let [worker, sidecar] = containers(&w) else { panic!("two containers") };
    assert_eq!(worker.command, Some(strs(&["sh", "-c", "ray start --block --address=j-head-0.j:6380"])));
    assert!(worker.ports.is_none() && worker.env.is_none());
    assert!(sidecar.command.is_none());
    assert!(init_containers(&w).is_empty(), "Volcano's ray adds no wait");
}

#[test]
fn ray_default_commands_and_head_service_shape() {
    let job = ray_job();
    let p = volcano(ray::build, &job, &[]);
    let h = pod(p.as_ref(), &job, "head", 0);
    assert_eq!(
        containers(&h)[0].command,
        Some(strs(&[
            "sh",
            "-c",
            "ray start --head --block --dashboard-host=0.0.0.0 --port=6379 --dashboard-port=8265 --ray-client-server-port=10001"
        ]))
    );
    let w = pod(p.as_ref(), &job, "worker", 0);
    assert_eq!(containers(&w)[0].command, Some(strs(&["sh", "-c", "ray start --block --address=j-head-0.j:6379"])));

    let expected = json!([{
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "j-head-svc", "namespace": "ns", "ownerReferences": owner()},
        "spec": {
            "selector": {"volcano.sh/job-name": "j", "volcano.sh/job-namespace": "ns", "volcano.sh/task-spec": "head"},
            "ports": [
                {"name": "gcs", "port": 6379, "targetPort": "gcs", "protocol": "TCP"},
                {"name": "dashboard", "port": 8265, "targetPort": "dashboard", "protocol": "TCP"},
                {"name": "client-server", "port": 10001, "targetPort": "client-server", "protocol": "TCP"},
            ],
        },
    }]);
    assert_eq!(objects(p.as_ref()), expected.as_array().expect("array").clone());
    assert_eq!(objects(weft(ray::build, &job, &[]).as_ref()), expected.as_array().expect("array").clone());
}

/// Volcano's ray plugin creates `<job>-head-svc` in `OnJobAdd` without looking for the head task
/// (only `OnPodCreate` checks it, failing every pod): the Service is there, selecting no pod.
#[test]
fn ray_volcano_without_head_fails_every_pod_but_creates_the_head_service() {
    let job = jobj(json!([task("worker", 2)]));
    let p = build(ray::build, &job, &[], Flavor::Volcano).expect("Volcano builds it");
    let w = p.warnings().join("\n");
    assert!(w.contains("plugin ray") && w.contains("-head") && w.contains("job j doesn't have head task head"), "{w}");
    let objects = objects(p.as_ref());
    let [svc] = objects.as_slice() else { panic!("one object: {objects:?}") };
    assert_eq!(svc["kind"], "Service");
    assert_eq!(svc["metadata"]["name"], "j-head-svc");
    assert_eq!(svc["spec"]["selector"]["volcano.sh/task-spec"], "head");
    assert_eq!(svc["spec"]["ports"][0], json!({"name": "gcs", "port": 6379, "targetPort": "gcs", "protocol": "TCP"}));
    // Volcano creates no pod of the job; the render shows them unchanged by ray.
    let w0 = pod(p.as_ref(), &job, "worker", 0);
    assert!(containers(&w0)[0].command.is_none());
    // The pipeline keeps ray (for its Service) and the warning.
    let mut job = job;
    job.spec.plugins = Some([("ray".to_owned(), Vec::new())].into());
    let plugins = JobPlugins::volcano(&job);
    assert!(plugins.runs().iter().any(|r| r.name == "ray"));
    assert!(plugins.warnings().iter().any(|w| w.contains("doesn't have head task")), "{:?}", plugins.warnings());
    // weft's flavor refuses the job instead.
    let e = build(ray::build, &jobj(json!([task("worker", 2)])), &[], Flavor::Weft).expect_err("strict");
    assert!(e.to_string().contains("flag -head names task \"head\""), "{e}");
}

#[test]
fn ray_weft_workers_wait_for_the_gcs() {
    let job = ray_job();
    let p = weft(ray::build, &job, RAY_PORTS);
    let w = pod(p.as_ref(), &job, "worker", 1);
    let [wait] = init_containers(&w) else { panic!("one wait: {:?}", init_names(&w)) };
    assert_weft_wait(wait, "head", &["--timeout=600", "j-head-0.j:6380"]);
    assert_eq!(containers(&w)[0].command, Some(strs(&["sh", "-c", "ray start --block --address=j-head-0.j:6380"])));
    assert!(init_containers(&pod(p.as_ref(), &job, "head", 0)).is_empty());

    let p = weft(ray::build, &job, &["--wait=false"]);
    assert!(init_containers(&pod(p.as_ref(), &job, "worker", 0)).is_empty());

    // Dashed names and custom containers; a head-only cluster.
    let job = job_named(
        "ray-job",
        json!([
            task_with("ray-head", 1, json!({"containers": [{"name": "ray-node"}]})),
            task_with("ray-worker", 2, json!({"containers": [{"name": "ray-node"}]})),
        ]),
    );
    let a = ["--head=ray-head", "--worker=ray-worker", "--headContainer=ray-node", "--workerContainer=ray-node"];
    let p = weft(ray::build, &job, &a);
    let w = pod(p.as_ref(), &job, "ray-worker", 0);
    assert_eq!(
        containers(&w)[0].command,
        Some(strs(&["sh", "-c", "ray start --block --address=ray-job-ray-head-0.ray-job:6379"]))
    );
    assert_weft_wait(&init_containers(&w)[0], "ray-head", &["--timeout=600", "ray-job-ray-head-0.ray-job:6379"]);
    assert!(
        build(
            ray::build,
            &job_named("j", json!([task_with("head", 1, json!({"containers": [{"name": "head"}]}))])),
            &[],
            Flavor::Weft
        )
        .is_ok()
    );
}

#[test]
fn ray_strict_rejections() {
    let job = ray_job();
    let e = rejected(ray::build, &job, &["--head=boss"]);
    assert!(e.contains("plugin ray") && e.contains("-head") && e.contains("\"boss\""), "{e}");
    let e = rejected(ray::build, &job, &["--headContainer=ray"]);
    assert!(
        e.contains("plugin ray")
            && e.contains("-headContainer")
            && e.contains("\"ray\"")
            && e.contains("\"head\"")
            && e.contains("head, sidecar"),
        "{e}"
    );
    let e = rejected(ray::build, &job, &["--workerContainer=main"]);
    assert!(e.contains("-workerContainer") && e.contains("\"worker\"") && e.contains("\"main\""), "{e}");
    let e = rejected(ray::build, &job, &["--dashboardPort=6379"]);
    assert!(e.contains("plugin ray") && e.contains("must differ"), "{e}");
    let e = rejected(ray::build, &job, &["--clientPort=70000"]);
    assert!(e.contains("-clientPort") && e.contains("65535"), "{e}");
    let two = job_named("j", json!([task_with("head", 2, json!({"containers": [{"name": "head"}]}))]));
    let e = rejected(ray::build, &two, &[]);
    assert!(e.contains("plugin ray") && e.contains("-head") && e.contains("2 replicas"), "{e}");
    let names: Vec<&str> = ray::FLAGS.iter().map(|f| f.name).collect();
    assert_eq!(
        names,
        vec!["head", "headContainer", "worker", "workerContainer", "port", "dashboardPort", "clientPort"]
    );
}

// ------------------------------------------------------------------------------------------------
// mxnet
// ------------------------------------------------------------------------------------------------

fn mxnet_job() -> Job {
    job_named("mx", json!([task("scheduler", 1), task("server", 2), task("worker", 3), task("eval", 1)]))
}

fn dmlc(role: &str) -> Vec<String> {
    strs(&[
        "DMLC_PS_ROOT_URI=mx-scheduler-0.mx",
        "DMLC_PS_ROOT_PORT=9000",
        "DMLC_NUM_SERVER=2",
        "DMLC_NUM_WORKER=3",
        &format!("DMLC_ROLE={role}"),
        "DMLC_USE_KUBERNETES=1",
    ])
}

#[test]
fn mxnet_env_per_role_port_and_waits() {
    let job = mxnet_job();
    let p = weft(mxnet::build, &job, &[]);
    let s = pod(p.as_ref(), &job, "scheduler", 0);
    assert_eq!(env(&containers(&s)[0]), dmlc("scheduler"));
    assert_eq!(ports(&containers(&s)[0]), json!([{"name": "mxnet-port", "containerPort": 9000}]));
    assert!(init_containers(&s).is_empty());

    for (t, role) in [("server", "server"), ("worker", "worker")] {
        let pd = pod(p.as_ref(), &job, t, 1);
        assert_eq!(env(&containers(&pd)[0]), dmlc(role));
        assert!(containers(&pd)[0].ports.is_none());
        let [wait] = init_containers(&pd) else { panic!("one wait") };
        assert_weft_wait(wait, "scheduler", &["--timeout=600", "mx-scheduler-0.mx:9000"]);
    }
    let other = pod(p.as_ref(), &job, "eval", 0);
    let t = job.task("eval").expect("eval");
    assert_eq!(other, naming::volcano_pod(&job, t, 0), "other tasks are left alone");
    assert!(objects(p.as_ref()).is_empty());
}

#[test]
fn mxnet_custom_roles_port_and_no_wait() {
    let job = job_named("mx-job", json!([task("ps-sched", 1), task("ps-server", 1), task("trainer", 1)]));
    let p = weft(
        mxnet::build,
        &job,
        &["--scheduler=ps-sched", "--server=ps-server", "--worker=trainer", "--port=9091", "--wait=false"],
    );
    let w = pod(p.as_ref(), &job, "trainer", 0);
    assert_eq!(
        env(&containers(&w)[0]),
        strs(&[
            "DMLC_PS_ROOT_URI=mx-job-ps-sched-0.mx-job",
            "DMLC_PS_ROOT_PORT=9091",
            "DMLC_NUM_SERVER=1",
            "DMLC_NUM_WORKER=1",
            "DMLC_ROLE=worker",
            "DMLC_USE_KUBERNETES=1",
        ])
    );
    assert!(init_containers(&w).is_empty());
    let s = pod(p.as_ref(), &job, "ps-sched", 0);
    assert_eq!(ports(&containers(&s)[0]), json!([{"name": "mxnet-port", "containerPort": 9091}]));
}

#[test]
fn mxnet_is_weft_only_and_strict() {
    let job = mxnet_job();
    let e = build(mxnet::build, &job, &[], Flavor::Volcano).expect_err("no Volcano mxnet").to_string();
    assert!(e.contains("plugin mxnet") && e.contains("Volcano has no mxnet plugin"), "{e}");

    let two = job_named("mx", json!([task("scheduler", 2), task("server", 1), task("worker", 1)]));
    let e = rejected(mxnet::build, &two, &[]);
    assert!(e.contains("plugin mxnet") && e.contains("-scheduler") && e.contains("2 replicas"), "{e}");
    let e = rejected(mxnet::build, &job, &["--server=ps"]);
    assert!(e.contains("plugin mxnet") && e.contains("-server") && e.contains("\"ps\""), "{e}");
    let no_worker = job_named("mx", json!([task("scheduler", 1), task("server", 1)]));
    let e = rejected(mxnet::build, &no_worker, &[]);
    assert!(e.contains("-worker") && e.contains("\"worker\""), "{e}");
    let e = rejected(mxnet::build, &job, &["--worker=server"]);
    assert!(e.contains("-server") && e.contains("-worker") && e.contains("differ"), "{e}");
    let e = rejected(mxnet::build, &job, &["--port=0"]);
    assert!(e.contains("-port"), "{e}");
    let e = rejected(mxnet::build, &job, &["--wait-timeout=0"]);
    assert!(e.contains("-wait-timeout"), "{e}");
    assert_eq!(mxnet::DEFAULT_PORT, 9000, "DMLC_PS_ROOT_PORT in Volcano's train-mnist-cpu.yaml");
}

// ------------------------------------------------------------------------------------------------
// Through the pipeline, and the cost per pod.
// ------------------------------------------------------------------------------------------------

#[test]
fn weft_annotation_runs_the_framework_plugin() {
    let mut job = pytorch_job();
    job.metadata.annotations =
        Some([(weft_jobs::PLUGINS_ANNOTATION.to_owned(), r#"{"pytorch": ["--port=29500"]}"#.to_owned())].into());
    let plugins = JobPlugins::weft(&job, &options()).expect("builds");
    let t = job.task("worker").expect("worker");
    let mut w = naming::volcano_pod(&job, t, 0);
    plugins.mutate_pod(&mut w).expect("mutates");
    assert_eq!(
        env(&containers(&w)[0])[..4],
        strs(&["MASTER_ADDR=j-master-0.j", "MASTER_PORT=29500", "WORLD_SIZE=4", "RANK=1"])
    );

    job.metadata.annotations =
        Some([(weft_jobs::PLUGINS_ANNOTATION.to_owned(), r#"{"pytorch": ["--master=boss"]}"#.to_owned())].into());
    let errors = JobPlugins::weft(&job, &options()).expect_err("rejected");
    assert!(errors[0].to_string().contains("-master"), "{errors:?}");
}
