//! The real `weft` binary as an operator runs it: a long-running component behind a log pipe
//! that goes away, slow clients, SIGTERM; and the CLI writing into a pipe that closes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, ChildStderr, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use weft_fakeapi::FakeApiServer;

/// Longest a process may take to do what a step expects (a hang guard, not a measurement).
const HANG_GUARD: Duration = Duration::from_secs(60);

fn weft() -> Command {
    Command::new(env!("CARGO_BIN_EXE_weft"))
}

/// Waits for `child` to exit, at most [`HANG_GUARD`].
fn wait_exit(child: Child) -> Option<ExitStatus> {
    weft_testkit::process::wait_exit(child, HANG_GUARD)
}

fn sigterm(pid: u32) {
    let status = Command::new("kill").args(["-TERM", &pid.to_string()]).status().expect("kill(1) runs");
    assert!(status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_extender_stops_on_sigterm_with_its_log_pipe_closed_and_a_slow_client_connected() {
    let api = FakeApiServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).unwrap();
    let mut child = weft()
        .args(["scheduler-extender", "--listen=127.0.0.1:0", "--ops-listen=127.0.0.1:0"])
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        // What the Deployment sets.
        .env("WEFT_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let (log, addr, stderr) = read_until_listening(&mut child, "scheduler-extender listening on ");
    assert!(log.contains("INFO"), "info logs are on: {log}");
    assert!(!log.contains('\u{1b}'), "no colour escapes in logs that are not a terminal: {log:?}");

    // A client that sends half a request and then nothing.
    let mut slow = tokio::net::TcpStream::connect(&addr).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(
        &mut slow,
        b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{",
    )
    .await
    .unwrap();
    // The log reader goes away (a log shipper restarts, `kubectl logs -f` ends in a pipe…).
    drop(stderr);
    sigterm(pid);
    let status = wait_exit(child).expect("the extender ignored SIGTERM");
    assert!(status.success(), "{status:?}");
}

#[test]
fn printing_into_a_closed_pipe_ends_quietly() {
    let topo = concat!(env!("CARGO_MANIFEST_DIR"), "/../weft-sim/topologies/dgx-a100-nvswitch-10nic.txt");
    for args in [vec!["topo", "show", topo], vec!["topo", "show", topo, "-o", "json"]] {
        // The pipe's reader is gone before weft writes a byte: every write fails with EPIPE.
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = weft().args(&args).stdout(writer).stderr(Stdio::piped()).spawn().unwrap();
        let mut stderr = String::new();
        let mut child = out;
        child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
        let status = wait_exit(child).expect("weft hung writing into a closed pipe");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert!(status.success(), "{args:?}: {status:?} {stderr}");
        assert_eq!(stderr, "", "{args:?}: nothing to say when the reader is gone");
    }
}

/// Starts `weft` with `args` and returns the child and the address it says it listens on
/// (the stderr line containing `marker`, then the address).
fn start_listening(args: &[&str], marker: &'static str) -> (Child, String) {
    let mut child = weft().args(args).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    let (_, addr, mut rest) = read_until_listening(&mut child, marker);
    // Keep draining so the child never blocks on a full pipe.
    std::thread::spawn(move || std::io::copy(&mut rest, &mut std::io::sink()));
    (child, addr)
}

/// Reads the child's stderr until the line containing `marker`, then the address; returns the log
/// read so far, the address (without `https://`) and the rest of stderr. Panics with the log if the
/// child ends first.
fn read_until_listening(child: &mut Child, marker: &'static str) -> (String, String, BufReader<ChildStderr>) {
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stderr);
        let mut seen = String::new();
        loop {
            let mut line = String::new();
            if lines.read_line(&mut line).unwrap_or(0) == 0 {
                let _ = tx.send(Err(seen));
                return;
            }
            seen.push_str(&line);
            if let Some(rest) = line.split(marker).nth(1) {
                let addr = rest.split_whitespace().next().unwrap_or_default();
                let addr = addr.trim_start_matches("https://").trim_start_matches("http://");
                let _ = tx.send(Ok((seen, addr.to_string(), lines)));
                return;
            }
        }
    });
    match rx.recv_timeout(HANG_GUARD).expect("the component never said where it listens") {
        Ok(found) => found,
        Err(log) => panic!("the component exited early:\n{log}"),
    }
}

fn example(name: &str) -> String {
    format!("{}/../../deploy/examples/local/{name}", env!("CARGO_MANIFEST_DIR"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_extender_can_be_tried_without_a_cluster() {
    let (child, addr) = start_listening(
        &["scheduler-extender", "--cluster-file=default", "--listen=127.0.0.1:0", "--ops-listen=127.0.0.1:0"],
        "scheduler-extender listening on ",
    );
    let body = std::fs::read(example("filter-args.json")).unwrap();
    let http = reqwest::Client::new();
    let post = |verb: &str| http.post(format!("http://{addr}/{verb}")).body(body.clone()).send();
    let filtered: serde_json::Value = post("filter").await.unwrap().json().await.unwrap();
    assert_eq!(filtered["Error"], "", "{filtered}");
    assert_eq!(
        filtered["NodeNames"],
        serde_json::json!(["dgx1-v100-0", "dgx-a100-0", "pcie-8gpu-0", "a100-pcie-4gpu-0"]),
        "every example node is in the cluster and has 4 free GPUs: {filtered}"
    );
    let scores: Vec<serde_json::Value> = post("prioritize").await.unwrap().json().await.unwrap();
    let score = |host: &str| scores.iter().find(|h| h["Host"] == host).unwrap()["Score"].as_i64().unwrap();
    assert!(score("dgx-a100-0") > score("pcie-8gpu-0"), "NVSwitch beats PCIe for 4 GPUs: {scores:?}");
    sigterm(child.id());
    assert!(wait_exit(child).expect("stops on SIGTERM").success());
}

/// A serving certificate for 127.0.0.1 signed by a fresh CA, written into `dir`: (certificate file,
/// key file, a client that trusts only that CA).
fn local_tls(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf, reqwest::Client) {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(DnType::CommonName, "local test CA");
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap().signed_by(&key, &ca).unwrap();
    let (cert_file, key_file) = (dir.join("tls.crt"), dir.join("tls.key"));
    std::fs::write(&cert_file, cert.pem()).unwrap();
    std::fs::write(&key_file, key.serialize_pem()).unwrap();
    let http = reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(ca.pem().as_bytes()).unwrap())
        .build()
        .unwrap();
    (cert_file, key_file, http)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_extender_serves_https_when_given_a_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let (cert_file, key_file, https) = local_tls(dir.path());
    let (child, addr) = start_listening(
        &[
            "scheduler-extender",
            "--cluster-file=default",
            &format!("--tls-cert-file={}", cert_file.display()),
            &format!("--tls-key-file={}", key_file.display()),
            "--listen=127.0.0.1:0",
            "--ops-listen=127.0.0.1:0",
        ],
        "scheduler-extender listening on ",
    );
    let body = std::fs::read(example("filter-args.json")).unwrap();
    let filtered: serde_json::Value =
        https.post(format!("https://{addr}/filter")).body(body.clone()).send().await.unwrap().json().await.unwrap();
    assert_eq!(filtered["Error"], "", "{filtered}");
    let plain = reqwest::Client::new().post(format!("http://{addr}/filter")).body(body).send().await;
    assert!(plain.is_err() || !plain.unwrap().status().is_success(), "plain HTTP is not served");
    // Without a cluster there is nothing to bind through: an error, not a fake success.
    let bound: serde_json::Value = https
        .post(format!("https://{addr}/bind"))
        .body(r#"{"PodName":"p","PodNamespace":"ml","PodUID":"u","Node":"dgx-a100-0"}"#)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(bound["Error"].as_str().unwrap().contains("cannot bind"), "{bound}");
    sigterm(child.id());
    assert!(wait_exit(child).expect("stops on SIGTERM").success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhook_can_be_tried_without_a_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let (cert_file, key_file, http) = local_tls(dir.path());

    let (child, addr) = start_listening(
        &[
            "webhook",
            &format!("--jobs-file={}", example("jobs.yaml")),
            &format!("--tls-cert-file={}", cert_file.display()),
            &format!("--tls-key-file={}", key_file.display()),
            "--listen=127.0.0.1:0",
            "--ops-listen=127.0.0.1:0",
        ],
        "webhook listening on ",
    );
    let review = std::fs::read(example("pod-review.json")).unwrap();
    let answer: serde_json::Value =
        http.post(format!("https://{addr}/pods/mutate")).body(review).send().await.unwrap().json().await.unwrap();
    let response = &answer["response"];
    assert_eq!(response["allowed"], true, "{answer}");
    assert_eq!(response["uid"], "9b1f0c4e-2d7a-4e3b-8c55-1a2b3c4d5e6f");
    use base64::Engine as _;
    let patch = base64::engine::general_purpose::STANDARD.decode(response["patch"].as_str().unwrap()).unwrap();
    let patch = String::from_utf8(patch).unwrap();
    assert!(patch.contains("TF_CONFIG"), "the tensorflow plugin wired the pod: {patch}");
    sigterm(child.id());
    assert!(wait_exit(child).expect("stops on SIGTERM").success());
}

/// `weft agent` with physnets publishes the node's VFs in its topology annotation, each under the
/// NIC that is its PF, so the scheduler extender can decide them with the GPUs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_publishes_the_vfs_of_its_physnets_with_the_topology() {
    use k8s_openapi::api::core::v1::Node;
    use kube::api::{Api, PostParams};
    use weft_topology::discover::FakeSriovTree;

    let api = FakeApiServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).unwrap();
    let nodes: Api<Node> = Api::all(api.client());
    let node: Node = serde_json::from_value(serde_json::json!({"metadata": {"name": "n1"}})).unwrap();
    nodes.create(&PostParams::default(), &node).await.unwrap();
    // One GPU and one NIC (PF ens1f0) under the same switch, as the inventory says; sysfs has the
    // PF's three VFs.
    let topology = dir.path().join("node.yaml");
    std::fs::write(
        &topology,
        "apiVersion: weft.io/v1alpha1\nkind: NodeTopology\ngpus:\n  - {index: 0}\n\
         nics:\n  - {name: mlx5_0, netdev: ens1f0, pciBusId: \"0000:3b:00.0\"}\n\
         nicLinks:\n  - {gpu: 0, nic: mlx5_0, pcie: PIX}\n",
    )
    .unwrap();
    let sysfs = dir.path().join("host");
    let tree = FakeSriovTree::new(&sysfs);
    tree.pf("0000:3b:00.0", &["0000:3a:00.0"], "ens1f0", 0);
    for i in 0..3 {
        tree.vf("0000:3b:00.0", i, &format!("0000:3b:00.{}", i + 2), None);
    }
    let child = weft()
        .args(["agent", "--node=n1", "--mode=off", "--ops-listen=127.0.0.1:0", "--interval=1"])
        .arg(format!("--topology={}", topology.display()))
        .arg(format!("--root={}", sysfs.display()))
        .arg("--physical-device-mappings=fabric:ens1f0#1-2")
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let published = tokio::time::timeout(HANG_GUARD, async {
        loop {
            let n = nodes.get("n1").await.unwrap();
            if let Some(text) = n.metadata.annotations.as_ref().and_then(|a| a.get(weft_record::TOPOLOGY_ANNOTATION)) {
                return text.clone();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    sigterm(child.id());
    assert!(wait_exit(child).is_some_and(|s| s.success()), "the agent stops on SIGTERM");
    let published = published.expect("the agent published the topology");
    let node = weft_topology::parse_node(&published, "annotation").unwrap();
    let vfs: Vec<(&str, &str, Option<&str>)> =
        node.vfs().iter().map(|v| (v.pci_address.as_str(), v.nic.as_str(), v.physnet.as_deref())).collect();
    assert_eq!(vfs, [("0000:3b:00.3", "mlx5_0", Some("fabric")), ("0000:3b:00.4", "mlx5_0", Some("fabric"))]);
}
