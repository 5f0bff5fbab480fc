//! The admission webhook served over real HTTPS on loopback for the integration tests: a CA and a
//! serving certificate made by rcgen, a client that trusts only that CA, and helpers that decode
//! and apply the patches answered.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair};
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use weft_admission::webhook::{self, JobSource, TlsFiles, WebhookState};
use weft_jobs::admission::AdmissionOptions;
use weft_kube::ops::{self, Ops};

pub const HANG_GUARD: Duration = Duration::from_secs(30);

// ----- certificates -----

/// A CA and a serving certificate it signed for 127.0.0.1 and localhost.
pub struct Pki {
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
}

pub fn pki(ca_name: &str) -> Pki {
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(DnType::CommonName, ca_name);
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let mut leaf = CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()]).unwrap();
    leaf.distinguished_name.push(DnType::CommonName, "weft-webhook.weft-system.svc");
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let key = KeyPair::generate().unwrap();
    let cert = leaf.signed_by(&key, &ca).unwrap();
    Pki { ca_pem: ca.pem(), cert_pem: cert.pem(), key_pem: key.serialize_pem() }
}

/// An HTTPS client that trusts only `ca_pem` (no built-in roots), with no connection reuse across
/// clients: each call makes its own handshake.
pub fn client(ca_pem: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(ca_pem.as_bytes()).unwrap())
        .timeout(HANG_GUARD)
        .build()
        .unwrap()
}

// ----- the server -----

pub struct Webhook {
    pub base: String,
    pub tls: Arc<TlsFiles>,
    pub ops: Arc<Ops>,
    pub pki: Pki,
    pub dir: tempfile::TempDir,
    shutdown: Option<oneshot::Sender<()>>,
    handle: Option<JoinHandle<std::io::Result<()>>>,
}

impl Webhook {
    pub async fn start(jobs: Arc<dyn JobSource>) -> Webhook {
        Webhook::start_with(WebhookState::new(jobs, AdmissionOptions::default())).await
    }

    /// Serves `state` (a Job source and, for the Pipeline webhooks, a NumaNetwork source).
    pub async fn start_with(state: WebhookState) -> Webhook {
        let pki = pki("weft test CA");
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tls.crt"), &pki.cert_pem).unwrap();
        std::fs::write(dir.path().join("tls.key"), &pki.key_pem).unwrap();
        let tls = Arc::new(TlsFiles::load(dir.path().join("tls.crt"), dir.path().join("tls.key")).unwrap());
        let state = Arc::new(state);
        let mut registry = ops::registry();
        state.register_metrics(&mut registry);
        tls.register_metrics(&mut registry, "webhook");
        let ops = Ops::new(registry);
        state.add_readiness_check(&ops);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("https://{}", listener.local_addr().unwrap());
        let (tx, rx) = oneshot::channel::<()>();
        let handle = tokio::spawn(webhook::serve(listener, state, tls.config(), Default::default(), async move {
            let _ = rx.await;
        }));
        Webhook { base, tls, ops, pki, dir, shutdown: Some(tx), handle: Some(handle) }
    }

    /// POST `body` to `path` with a client trusting the test CA: status and body.
    pub async fn post(&self, path: &str, body: impl Into<reqwest::Body>) -> (u16, String) {
        let resp = client(&self.pki.ca_pem)
            .post(format!("{}{path}", self.base))
            .header("Content-Type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        (status, resp.text().await.unwrap())
    }

    /// POST an AdmissionReview and return the AdmissionReview answered (HTTP 200 expected).
    pub async fn review(&self, path: &str, review: &Value) -> Value {
        let (status, text) = self.post(path, serde_json::to_vec(review).unwrap()).await;
        assert_eq!(status, 200, "{text}");
        let answer: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(answer["kind"], "AdmissionReview");
        assert_eq!(answer["apiVersion"], review["apiVersion"], "apiVersion echoed");
        assert_eq!(answer["response"]["uid"], review["request"]["uid"], "uid echoed");
        answer
    }

    pub async fn stop(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        let handle = self.handle.take().unwrap();
        tokio::time::timeout(HANG_GUARD, handle).await.expect("stops").unwrap().unwrap();
    }
}

/// The object after the response's patch: base64-decoded, parsed as RFC 6902 and applied.
pub fn patched(object: &Value, answer: &Value) -> Value {
    let response = &answer["response"];
    assert_eq!(response["allowed"], true, "{answer}");
    assert_eq!(response["patchType"], "JSONPatch", "{answer}");
    let text = base64::engine::general_purpose::STANDARD
        .decode(response["patch"].as_str().expect("patch is a base64 string"))
        .unwrap();
    let patch: json_patch::Patch = serde_json::from_slice(&text).unwrap();
    let mut out = object.clone();
    json_patch::patch(&mut out, &patch).expect("the patch applies to the object it was made for");
    out
}

pub fn assert_unchanged(answer: &Value) {
    let response = &answer["response"];
    assert_eq!(response["allowed"], true, "{answer}");
    assert!(response.get("patch").is_none() && response.get("patchType").is_none(), "no patch, no patchType: {answer}");
}
