//! The kubelet pod source against real HTTP and HTTPS servers on loopback: the read-only port
//! (plain HTTP, no token), the secure port (TLS with a CA-signed or self-signed serving
//! certificate, bearer token from a file that is rotated between requests), and the failures
//! (HTTP 500, malformed bodies, connection refused, untrusted certificate, missing token).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use serde_json::json;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use weft_agent::kubelet::{
    KubeletClient, KubeletConfig, KubeletError, PodSource, RequestFailure, StatusKind, container_id, container_status,
};

/// Bounds every request, so a broken test fails instead of hanging; never reached when passing.
const HANG_GUARD: Duration = Duration::from_secs(30);

fn pod_list() -> serde_json::Value {
    json!({
        "kind": "PodList",
        "apiVersion": "v1",
        "metadata": {},
        "items": [
            {
                "metadata": {"name": "trainer-0", "namespace": "ml", "uid": "1f2e3d4c-0000-1111-2222-333344445555"},
                "spec": {
                    "initContainers": [{"name": "setup", "image": "busybox"}],
                    "containers": [{
                        "name": "main", "image": "pytorch",
                        "resources": {"requests": {"cpu": "4", "memory": "8Gi"}, "limits": {"cpu": "4", "memory": "8Gi"}}
                    }]
                },
                "status": {
                    "phase": "Running",
                    "qosClass": "Guaranteed",
                    "initContainerStatuses": [{
                        "name": "setup", "image": "busybox", "imageID": "", "ready": false, "restartCount": 0,
                        "containerID": "containerd://aaaa1111",
                        "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}
                    }],
                    "containerStatuses": [{
                        "name": "main", "image": "pytorch", "imageID": "", "ready": true, "restartCount": 0,
                        "containerID": "containerd://bbbb2222",
                        "state": {"running": {"startedAt": "2025-01-01T00:00:00Z"}}
                    }]
                }
            },
            {
                "metadata": {"name": "web", "namespace": "default", "uid": "u-2"},
                "spec": {"containers": [{"name": "nginx", "image": "nginx"}]},
                "status": {"phase": "Pending"}
            }
        ]
    })
}

/// What a test server answers, and the `Authorization` headers it saw.
#[derive(Clone)]
struct Canned {
    status: StatusCode,
    body: String,
    seen: Arc<Mutex<Vec<Option<String>>>>,
}

impl Canned {
    fn new(status: StatusCode, body: impl Into<String>) -> Canned {
        Canned { status, body: body.into(), seen: Arc::default() }
    }
    fn ok() -> Canned {
        Canned::new(StatusCode::OK, pod_list().to_string())
    }
    fn seen(&self) -> Vec<Option<String>> {
        self.seen.lock().unwrap().clone()
    }
    fn router(&self) -> Router {
        let me = self.clone();
        Router::new().route(
            "/pods",
            get(move |headers: HeaderMap| {
                let me = me.clone();
                async move {
                    let auth = headers.get("authorization").map(|v| v.to_str().unwrap().to_owned());
                    me.seen.lock().unwrap().push(auth);
                    (me.status, [("content-type", "application/json")], me.body.clone()).into_response()
                }
            }),
        )
    }
}

/// A server task, aborted on drop.
struct Server {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve_http(canned: &Canned) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = canned.router();
    let task = tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    Server { addr, task }
}

/// A serving certificate for 127.0.0.1: signed by a fresh CA (returned as PEM) or self-signed.
struct ServingCert {
    ca_pem: Option<String>,
    chain: Vec<CertificateDer<'static>>,
    key_der: Vec<u8>,
}

fn ca_signed_cert() -> ServingCert {
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(DnType::CommonName, "test kubelet CA");
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let mut leaf = CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()]).unwrap();
    leaf.distinguished_name.push(DnType::CommonName, "node-1");
    let key = KeyPair::generate().unwrap();
    let cert = leaf.signed_by(&key, &ca).unwrap();
    ServingCert { ca_pem: Some(ca.pem()), chain: vec![cert.der().clone()], key_der: key.serialize_der() }
}

/// Like the kubelet's own default: self-signed, for the node's hostname only (not 127.0.0.1).
fn self_signed_cert() -> ServingCert {
    let mut params = CertificateParams::new(vec!["node-1".to_owned()]).unwrap();
    params.distinguished_name.push(DnType::CommonName, "node-1@1700000000");
    let key = KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    ServingCert { ca_pem: None, chain: vec![cert.der().clone()], key_der: key.serialize_der() }
}

async fn serve_https(canned: &Canned, cert: &ServingCert) -> Server {
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(cert.key_der.clone()));
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(cert.chain.clone(), key)
        .unwrap();
    let tls = axum_server::tls_rustls::RustlsConfig::from_config(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = canned.router();
    let task = tokio::spawn(async move {
        axum_server::Server::<SocketAddr>::from_listener(listener)
            .acceptor(axum_server::tls_rustls::RustlsAcceptor::new(tls))
            .serve(app.into_make_service())
            .await
            .unwrap();
    });
    Server { addr, task }
}

fn http_config(addr: SocketAddr) -> KubeletConfig {
    KubeletConfig { endpoint: format!("http://{addr}"), timeout: HANG_GUARD, ..KubeletConfig::default() }
}

fn https_config(addr: SocketAddr) -> KubeletConfig {
    KubeletConfig { endpoint: format!("https://{addr}"), timeout: HANG_GUARD, ..KubeletConfig::default() }
}

/// Replace `path` the way the kubelet's atomic writer does: write aside, rename over.
fn rotate(path: &Path, contents: &str) {
    let aside = path.with_extension("tmp");
    std::fs::write(&aside, contents).unwrap();
    std::fs::rename(&aside, path).unwrap();
}

#[tokio::test]
async fn read_only_port_lists_pods_over_plain_http_without_a_token() {
    let canned = Canned::ok();
    let server = serve_http(&canned).await;
    let client = KubeletClient::new(&http_config(server.addr)).unwrap();
    assert_eq!(client.url(), format!("http://{}/pods", server.addr));
    let source: &dyn PodSource = &client;
    let pods = source.pods().await.unwrap();
    let names: Vec<_> = pods.iter().map(|p| p.metadata.name.clone().unwrap()).collect();
    assert_eq!(names, ["trainer-0", "web"]);
    assert_eq!(canned.seen(), [None]);

    // The runtime ids come out of what was fetched.
    assert_eq!(container_id(&pods[0], "main"), Some(("containerd".to_owned(), "bbbb2222".to_owned())));
    let setup = container_status(&pods[0], "setup").unwrap();
    assert_eq!((setup.id.as_str(), setup.running, setup.kind), ("aaaa1111", false, StatusKind::Init));
    assert!(container_status(&pods[0], "main").unwrap().running);
    assert_eq!(container_id(&pods[1], "nginx"), None);
}

#[tokio::test]
async fn secure_port_sends_the_bearer_token_and_picks_up_a_rotated_one() {
    let cert = ca_signed_cert();
    let canned = Canned::ok();
    let server = serve_https(&canned, &cert).await;
    let dir = tempfile::tempdir().unwrap();
    let (ca, token) = (dir.path().join("ca.crt"), dir.path().join("token"));
    std::fs::write(&ca, cert.ca_pem.as_deref().unwrap()).unwrap();
    std::fs::write(&token, "token-one\n").unwrap();
    let client = KubeletClient::new(&KubeletConfig {
        token_file: Some(token.clone()),
        ca_file: Some(ca),
        ..https_config(server.addr)
    })
    .unwrap();

    assert_eq!(client.pods().await.unwrap().len(), 2);
    rotate(&token, "token-two");
    assert_eq!(client.pods().await.unwrap().len(), 2);
    assert_eq!(canned.seen(), [Some("Bearer token-one".to_owned()), Some("Bearer token-two".to_owned())]);
}

#[tokio::test]
async fn insecure_skip_verify_accepts_the_kubelets_self_signed_certificate() {
    let canned = Canned::ok();
    let server = serve_https(&canned, &self_signed_cert()).await;
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "t").unwrap();
    let client = KubeletClient::new(&KubeletConfig {
        token_file: Some(token),
        insecure_skip_verify: true,
        ..https_config(server.addr)
    })
    .unwrap();
    assert_eq!(client.pods().await.unwrap().len(), 2);
    assert_eq!(canned.seen(), [Some("Bearer t".to_owned())]);
}

#[tokio::test]
async fn a_certificate_from_another_ca_is_refused_before_the_token_is_sent() {
    let canned = Canned::ok();
    let server = serve_https(&canned, &ca_signed_cert()).await;
    let other = ca_signed_cert();
    let dir = tempfile::tempdir().unwrap();
    let (ca, token) = (dir.path().join("ca.crt"), dir.path().join("token"));
    std::fs::write(&ca, other.ca_pem.as_deref().unwrap()).unwrap();
    std::fs::write(&token, "secret").unwrap();
    let client =
        KubeletClient::new(&KubeletConfig { token_file: Some(token), ca_file: Some(ca), ..https_config(server.addr) })
            .unwrap();
    let err = client.pods().await.unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, KubeletError::Request { kind: RequestFailure::Connect, .. }), "{err:?}");
    assert!(text.contains(&format!("https://{}/pods", server.addr)), "{text}");
    assert!(text.to_lowercase().contains("certificate"), "{text}");
    assert!(canned.seen().is_empty());
}

#[tokio::test]
async fn http_500_names_the_endpoint_the_status_and_the_body() {
    let canned = Canned::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "runtime service unavailable:\n  dial unix /run/containerd.sock",
    );
    let server = serve_http(&canned).await;
    let err = KubeletClient::new(&http_config(server.addr)).unwrap().pods().await.unwrap_err();
    match &err {
        KubeletError::Status { url, status, body } => {
            assert_eq!(url, &format!("http://{}/pods", server.addr));
            assert_eq!(*status, 500);
            assert_eq!(body, "runtime service unavailable: dial unix /run/containerd.sock");
        }
        other => panic!("expected a status error, got {other:?}"),
    }
    assert!(err.to_string().contains("HTTP 500"), "{err}");
}

#[tokio::test]
async fn a_body_that_is_not_json_names_the_endpoint_and_the_position() {
    let server = serve_http(&Canned::new(StatusCode::OK, "{\"items\": [ oops")).await;
    let err = KubeletClient::new(&http_config(server.addr)).unwrap().pods().await.unwrap_err();
    let KubeletError::Decode { url, path, why } = &err else { panic!("expected a decode error, got {err:?}") };
    assert_eq!(url, &format!("http://{}/pods", server.addr));
    assert_eq!(path, "$");
    assert!(why.contains("line 1 column"), "{why}");
}

#[tokio::test]
async fn a_malformed_pod_is_named_by_index_and_name() {
    let mut list = pod_list();
    list["items"][1]["spec"]["containers"][0]["resources"] = json!({"limits": {"cpu": ["4"]}});
    let server = serve_http(&Canned::new(StatusCode::OK, list.to_string())).await;
    let err = KubeletClient::new(&http_config(server.addr)).unwrap().pods().await.unwrap_err();
    let text = err.to_string();
    assert!(text.contains("$.items[1] (default/web)"), "{text}");
    assert!(text.contains(&format!("http://{}/pods", server.addr)), "{text}");
}

#[tokio::test]
async fn connection_refused_is_a_connect_error_naming_the_endpoint() {
    // A port that was just free: bind, note it, close it.
    let addr = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let err = KubeletClient::new(&http_config(addr)).unwrap().pods().await.unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, KubeletError::Request { kind: RequestFailure::Connect, .. }), "{err:?}");
    assert!(text.contains(&format!("http://{addr}/pods")), "{text}");
    assert!(text.to_lowercase().contains("refused"), "{text}");
}

#[tokio::test]
async fn a_missing_or_empty_token_fails_before_anything_is_sent() {
    let canned = Canned::ok();
    let server = serve_https(&canned, &self_signed_cert()).await;
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    let client = KubeletClient::new(&KubeletConfig {
        token_file: Some(token.clone()),
        insecure_skip_verify: true,
        ..https_config(server.addr)
    })
    .unwrap();
    let err = client.pods().await.unwrap_err();
    assert!(matches!(&err, KubeletError::TokenRead { path, .. } if *path == token), "{err:?}");
    assert!(err.to_string().contains(&token.display().to_string()), "{err}");
    std::fs::write(&token, "  \n").unwrap();
    assert!(matches!(client.pods().await.unwrap_err(), KubeletError::BadToken { .. }));
    assert!(canned.seen().is_empty());
    // Once the token appears, the same client works.
    std::fs::write(&token, "late").unwrap();
    assert_eq!(client.pods().await.unwrap().len(), 2);
    assert_eq!(canned.seen(), [Some("Bearer late".to_owned())]);
}

#[test]
fn a_ca_file_without_certificates_is_refused_at_construction() {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.crt");
    std::fs::write(&ca, "not a certificate\n").unwrap();
    let err = KubeletClient::new(&KubeletConfig {
        ca_file: Some(ca.clone()),
        ..https_config("127.0.0.1:10250".parse().unwrap())
    })
    .unwrap_err();
    assert!(matches!(&err, KubeletError::CaFile { path, .. } if *path == ca), "{err:?}");
    let missing = dir.path().join("missing.crt");
    let err = KubeletClient::new(&KubeletConfig {
        ca_file: Some(missing.clone()),
        ..https_config("127.0.0.1:10250".parse().unwrap())
    })
    .unwrap_err();
    assert!(err.to_string().contains(&missing.display().to_string()), "{err}");
}
