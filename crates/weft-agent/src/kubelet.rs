//! The pod source of bypass mode: the kubelet's `/pods` endpoint, which returns a `v1.PodList` of
//! the pods bound to this node (what Katalyst's metaserver polls, §3.3 of the ORM notes).
//!
//! Two ports serve it:
//! - the read-only port, `http://127.0.0.1:10255/pods`: plain HTTP, no authentication (disabled by
//!   default on most current distributions);
//! - the secure port, `https://127.0.0.1:10250/pods`: TLS, and a bearer token the kubelet checks
//!   with a `SubjectAccessReview` (`nodes/proxy` or `nodes/pods` get). The token is normally the
//!   pod's projected service-account token, which the kubelet rotates on disk; [`KubeletClient`]
//!   reads the token file on every request, so a rotated token is used from the next poll on.
//!
//! The kubelet's serving certificate is often self-signed (no `serverTLSBootstrap`), so it cannot
//! be verified against the cluster CA. [`KubeletConfig::insecure_skip_verify`] accepts any
//! certificate for that case; the connection then stays encrypted but is not authenticated, which
//! is acceptable only for a loopback endpoint. With a kubelet certificate signed by the cluster CA
//! (`serverTLSBootstrap: true`), point [`KubeletConfig::ca_file`] at that CA (in a pod:
//! `/var/run/secrets/kubernetes.io/serviceaccount/ca.crt`) instead.
//!
//! [`container_status`] / [`container_id`] find a container's runtime id in the pod status, which
//! is what the cgroup path is built from ([`crate::cgroup::CgroupLayout`]).

use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use reqwest::header::{AUTHORIZATION, HeaderValue};
use serde::Deserialize as _;
use thiserror::Error;

/// The read-only kubelet endpoint.
pub const DEFAULT_READ_ONLY_ENDPOINT: &str = "http://127.0.0.1:10255";
/// The secure kubelet endpoint.
pub const DEFAULT_SECURE_ENDPOINT: &str = "https://127.0.0.1:10250";
/// The path of the pod list.
pub const DEFAULT_PODS_PATH: &str = "/pods";
/// The projected service-account token inside a pod.
pub const SERVICE_ACCOUNT_TOKEN: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";
/// The cluster CA inside a pod.
pub const SERVICE_ACCOUNT_CA: &str = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt";
/// Default request timeout.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest response body accepted (a node's pod list is a few MB at most).
pub const MAX_BODY_BYTES: usize = 64 << 20;
/// How much of an error response body is quoted in [`KubeletError::Status`].
const BODY_SNIPPET: usize = 512;

/// Where the pods come from. [`KubeletClient`] is the real one; tests use a fixed list.
#[async_trait::async_trait]
pub trait PodSource: Send + Sync {
    /// All pods bound to this node, as the kubelet reports them now.
    async fn pods(&self) -> Result<Vec<Pod>, KubeletError>;
}

/// How to reach the kubelet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KubeletConfig {
    /// Scheme, host and port, optionally a path prefix: `http://127.0.0.1:10255` (read-only port)
    /// or `https://127.0.0.1:10250` (secure port).
    pub endpoint: String,
    /// Path of the pod list below `endpoint`; `/pods`.
    pub pods_path: String,
    /// File holding a bearer token, re-read on every request (so a rotated projected token is
    /// picked up). Only allowed with an `https` endpoint.
    pub token_file: Option<PathBuf>,
    /// PEM file with the CA certificate(s) that signed the kubelet's serving certificate. An
    /// `https` endpoint needs this or [`KubeletConfig::insecure_skip_verify`].
    pub ca_file: Option<PathBuf>,
    /// Accept any serving certificate (the kubelet's default one is self-signed). Encrypts but
    /// does not authenticate the kubelet: use only for a loopback endpoint.
    pub insecure_skip_verify: bool,
    /// Whole-request timeout (connect, send, read the body).
    pub timeout: Duration,
}

impl Default for KubeletConfig {
    /// The read-only port on loopback, `/pods`, no token, 10 s.
    fn default() -> Self {
        KubeletConfig {
            endpoint: DEFAULT_READ_ONLY_ENDPOINT.to_owned(),
            pods_path: DEFAULT_PODS_PATH.to_owned(),
            token_file: None,
            ca_file: None,
            insecure_skip_verify: false,
            timeout: DEFAULT_TIMEOUT,
        }
    }
}

impl KubeletConfig {
    /// The secure port on loopback with the pod's service-account token; the kubelet certificate
    /// is not verified (see the module documentation).
    pub fn secure_in_pod() -> KubeletConfig {
        KubeletConfig {
            endpoint: DEFAULT_SECURE_ENDPOINT.to_owned(),
            token_file: Some(PathBuf::from(SERVICE_ACCOUNT_TOKEN)),
            insecure_skip_verify: true,
            ..KubeletConfig::default()
        }
    }
}

/// What kind of transport failure a [`KubeletError::Request`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestFailure {
    /// The TCP connection or the TLS handshake failed (refused, unreachable, untrusted
    /// certificate).
    Connect,
    /// The request ran past [`KubeletConfig::timeout`].
    Timeout,
    /// Anything else (connection reset while reading, malformed HTTP).
    Other,
}

/// Why the pod list could not be had.
#[derive(Debug, Error)]
pub enum KubeletError {
    /// The configuration cannot work (bad URL, a token over plain HTTP, no way to trust the
    /// certificate).
    #[error("kubelet endpoint {endpoint:?}: {why}")]
    Config {
        /// The configured endpoint.
        endpoint: String,
        /// What is wrong.
        why: String,
    },
    /// The CA file could not be read or holds no certificate.
    #[error("kubelet CA file {}: {why}", path.display())]
    CaFile {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// The token file could not be read.
    #[error("reading the kubelet bearer token {}: {source}", path.display())]
    TokenRead {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The token file is empty or holds bytes an HTTP header cannot carry.
    #[error("kubelet bearer token {}: {why}", path.display())]
    BadToken {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// The request did not get an HTTP response.
    #[error("GET {url}: {cause}")]
    Request {
        /// The URL.
        url: String,
        /// Connect, timeout or other.
        kind: RequestFailure,
        /// The error and its causes, outermost first.
        cause: String,
    },
    /// The kubelet answered with a non-2xx status.
    #[error("GET {url}: HTTP {status}: {body}")]
    Status {
        /// The URL.
        url: String,
        /// The HTTP status code.
        status: u16,
        /// The start of the response body.
        body: String,
    },
    /// The body is larger than [`MAX_BODY_BYTES`].
    #[error("GET {url}: response body larger than {limit} bytes")]
    TooLarge {
        /// The URL.
        url: String,
        /// The limit.
        limit: usize,
    },
    /// The body is not a `v1.PodList`.
    #[error("GET {url}: not a v1 PodList: at {path}: {why}")]
    Decode {
        /// The URL.
        url: String,
        /// Where in the document: `$` (the whole body), `$.items`, `$.items[3] (ns/name)`.
        path: String,
        /// The JSON error (with line and column for syntax errors).
        why: String,
    },
}

/// A real kubelet client over HTTP or HTTPS (rustls).
#[derive(Clone, Debug)]
pub struct KubeletClient {
    url: reqwest::Url,
    token_file: Option<PathBuf>,
    http: reqwest::Client,
}

impl KubeletClient {
    /// Check `config` and build the client. Reads the CA file now; the token file is read per
    /// request.
    pub fn new(config: &KubeletConfig) -> Result<KubeletClient, KubeletError> {
        let config_error = |why: String| KubeletError::Config { endpoint: config.endpoint.clone(), why };
        let joined = format!("{}/{}", config.endpoint.trim_end_matches('/'), config.pods_path.trim_start_matches('/'));
        let url = reqwest::Url::parse(&joined).map_err(|e| config_error(format!("{joined:?} is not a URL: {e}")))?;
        let https = match url.scheme() {
            "https" => true,
            "http" => false,
            other => return Err(config_error(format!("scheme {other:?} is neither http nor https"))),
        };
        if url.host().is_none() {
            return Err(config_error("no host".to_owned()));
        }
        if !https && config.token_file.is_some() {
            return Err(config_error(
                "refusing to send a bearer token over plain http; use the https (10250) endpoint".to_owned(),
            ));
        }
        if config.timeout.is_zero() {
            return Err(config_error("the timeout is zero".to_owned()));
        }
        let mut builder = reqwest::Client::builder()
            .timeout(config.timeout)
            .connect_timeout(config.timeout)
            .user_agent(concat!("weft-agent/", env!("CARGO_PKG_VERSION")));
        if https {
            builder = builder.use_rustls_tls().tls_built_in_root_certs(false);
            match (&config.ca_file, config.insecure_skip_verify) {
                (_, true) => builder = builder.danger_accept_invalid_certs(true),
                (Some(path), false) => {
                    let pem = std::fs::read(path)
                        .map_err(|e| KubeletError::CaFile { path: path.clone(), why: format!("reading: {e}") })?;
                    let certs = reqwest::Certificate::from_pem_bundle(&pem)
                        .map_err(|e| KubeletError::CaFile { path: path.clone(), why: format!("not PEM: {e}") })?;
                    if certs.is_empty() {
                        return Err(KubeletError::CaFile {
                            path: path.clone(),
                            why: "no CERTIFICATE block".to_owned(),
                        });
                    }
                    for cert in certs {
                        builder = builder.add_root_certificate(cert);
                    }
                }
                (None, false) => {
                    return Err(config_error(
                        "https needs ca_file (the CA of the kubelet's serving certificate) or insecure_skip_verify"
                            .to_owned(),
                    ));
                }
            }
        }
        let http = builder.build().map_err(|e| config_error(format!("building the HTTP client: {}", chain(&e))))?;
        Ok(KubeletClient { url, token_file: config.token_file.clone(), http })
    }

    /// The URL polled.
    pub fn url(&self) -> &str {
        self.url.as_str()
    }

    /// The `Authorization` header from the token file, read now.
    fn authorization(&self) -> Result<Option<HeaderValue>, KubeletError> {
        let Some(path) = &self.token_file else { return Ok(None) };
        let raw =
            std::fs::read_to_string(path).map_err(|source| KubeletError::TokenRead { path: path.clone(), source })?;
        let token = raw.trim();
        if token.is_empty() {
            return Err(KubeletError::BadToken { path: path.clone(), why: "the file is empty".to_owned() });
        }
        let mut value = HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| KubeletError::BadToken {
            path: path.clone(),
            why: "holds characters an HTTP header cannot carry".to_owned(),
        })?;
        value.set_sensitive(true);
        Ok(Some(value))
    }

    /// GET the pod list and decode it.
    pub async fn fetch(&self) -> Result<Vec<Pod>, KubeletError> {
        let url = self.url.to_string();
        let mut request = self.http.get(self.url.clone()).header(reqwest::header::ACCEPT, "application/json");
        if let Some(auth) = self.authorization()? {
            request = request.header(AUTHORIZATION, auth);
        }
        let request_error = |e: reqwest::Error| KubeletError::Request {
            url: url.clone(),
            kind: if e.is_timeout() {
                RequestFailure::Timeout
            } else if e.is_connect() {
                RequestFailure::Connect
            } else {
                RequestFailure::Other
            },
            cause: chain(&e),
        };
        let mut response = request.send().await.map_err(request_error)?;
        let status = response.status();
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(request_error)? {
            if body.len() + chunk.len() > MAX_BODY_BYTES {
                if !status.is_success() {
                    break;
                }
                return Err(KubeletError::TooLarge { url, limit: MAX_BODY_BYTES });
            }
            body.extend_from_slice(&chunk);
        }
        if !status.is_success() {
            return Err(KubeletError::Status { url, status: status.as_u16(), body: snippet(&body) });
        }
        decode_pod_list(&body).map_err(|(path, why)| KubeletError::Decode { url, path, why })
    }
}

#[async_trait::async_trait]
impl PodSource for KubeletClient {
    async fn pods(&self) -> Result<Vec<Pod>, KubeletError> {
        self.fetch().await
    }
}

/// A fixed list of pods (tests, and a static-pods-only node).
#[derive(Clone, Debug, Default)]
pub struct StaticPods(pub Vec<Pod>);

#[async_trait::async_trait]
impl PodSource for StaticPods {
    async fn pods(&self) -> Result<Vec<Pod>, KubeletError> {
        Ok(self.0.clone())
    }
}

/// Decode a `v1.PodList` body. On failure: where (`$`, `$.items`, `$.items[i] (ns/name)`) and why.
///
/// The body is parsed as JSON first, then each item is decoded on its own, so one malformed pod
/// is reported with its index and name rather than as a byte offset into a multi-megabyte body.
pub fn decode_pod_list(body: &[u8]) -> Result<Vec<Pod>, (String, String)> {
    let value: serde_json::Value = serde_json::from_slice(body).map_err(|e| ("$".to_owned(), e.to_string()))?;
    let serde_json::Value::Object(mut object) = value else {
        return Err(("$".to_owned(), format!("expected an object, got {}", kind_of(&value))));
    };
    if let Some(kind) = object.get("kind").and_then(|k| k.as_str())
        && kind != "PodList"
    {
        return Err(("$.kind".to_owned(), format!("expected \"PodList\", got {kind:?}")));
    }
    let items = match object.remove("items") {
        None | Some(serde_json::Value::Null) => return Ok(Vec::new()),
        Some(serde_json::Value::Array(items)) => items,
        Some(other) => return Err(("$.items".to_owned(), format!("expected an array, got {}", kind_of(&other)))),
    };
    let mut pods = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let pod = Pod::deserialize(item).map_err(|e| {
            let meta = item.get("metadata");
            let field = |f: &str| meta.and_then(|m| m.get(f)).and_then(|v| v.as_str()).unwrap_or("?").to_owned();
            (format!("$.items[{i}] ({}/{})", field("namespace"), field("name")), e.to_string())
        })?;
        pods.push(pod);
    }
    Ok(pods)
}

fn kind_of(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// The error and its sources, `: `-separated (reqwest's own message alone hides the cause, e.g.
/// "connection refused").
fn chain(error: &dyn std::error::Error) -> String {
    let mut out = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        let text = e.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = e.source();
    }
    out
}

/// The start of a body, as text, on one line.
fn snippet(body: &[u8]) -> String {
    let cut = &body[..body.len().min(BODY_SNIPPET)];
    let mut text: String = String::from_utf8_lossy(cut).split_whitespace().collect::<Vec<_>>().join(" ");
    if body.len() > BODY_SNIPPET {
        text.push_str(" …");
    }
    if text.is_empty() { "(empty body)".to_owned() } else { text }
}

/// Whether a status entry belongs to an init or an app container.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatusKind {
    /// From `status.initContainerStatuses` (init and sidecar containers).
    Init,
    /// From `status.containerStatuses`.
    App,
}

/// A container as the runtime knows it, from the pod status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuntimeContainer {
    /// The scheme of `containerID`: `containerd`, `cri-o`, `docker`.
    pub runtime: String,
    /// The runtime's container id (64 hex digits for all three).
    pub id: String,
    /// Whether the container is running now (`state.running` set).
    pub running: bool,
    /// Init or app.
    pub kind: StatusKind,
}

/// Split `containerd://<id>` (also `cri-o://`, `docker://`, any `<scheme>://`) into runtime and id.
/// `None` when it is not of that form or the id has characters other than ASCII letters, digits,
/// `_`, `-` and `.` (the id becomes a path component of the cgroup).
pub fn parse_container_id(container_id: &str) -> Option<(String, String)> {
    let (runtime, id) = container_id.split_once("://")?;
    let valid =
        |s: &str, extra: &[char]| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || extra.contains(&c));
    if !valid(runtime, &['-', '.', '_']) || !valid(id, &['-', '_', '.']) || id.starts_with('.') {
        return None;
    }
    Some((runtime.to_owned(), id.to_owned()))
}

/// The runtime id of init or app container `container_name` of `pod`, from its status; `None`
/// while the container has no id yet (not created) or the name is unknown.
pub fn container_status(pod: &Pod, container_name: &str) -> Option<RuntimeContainer> {
    let status = pod.status.as_ref()?;
    fn find<'a>(list: &'a Option<Vec<ContainerStatus>>, name: &str) -> Option<&'a ContainerStatus> {
        list.as_ref()?.iter().find(|s| s.name == name)
    }
    let (entry, kind) = match find(&status.init_container_statuses, container_name) {
        Some(entry) => (entry, StatusKind::Init),
        None => (find(&status.container_statuses, container_name)?, StatusKind::App),
    };
    let (runtime, id) = parse_container_id(entry.container_id.as_deref()?)?;
    let running = entry.state.as_ref().is_some_and(|s| s.running.is_some());
    Some(RuntimeContainer { runtime, id, running, kind })
}

/// `(runtime, id)` of init or app container `container_name` of `pod` (see [`container_status`]).
pub fn container_id(pod: &Pod, container_name: &str) -> Option<(String, String)> {
    container_status(pod, container_name).map(|c| (c.runtime, c.id))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests assert by unwrapping
mod tests {
    use super::*;

    fn pod(json: serde_json::Value) -> Pod {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn parses_the_three_runtimes_and_refuses_odd_ids() {
        assert_eq!(parse_container_id("containerd://abc123"), Some(("containerd".into(), "abc123".into())));
        assert_eq!(parse_container_id("cri-o://f00"), Some(("cri-o".into(), "f00".into())));
        assert_eq!(parse_container_id("docker://d0c"), Some(("docker".into(), "d0c".into())));
        for bad in [
            "",
            "abc",
            "containerd://",
            "://abc",
            "containerd://../x",
            "containerd://a/b",
            "containerd://..",
            "c d://x",
        ] {
            assert_eq!(parse_container_id(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn finds_init_and_app_containers_and_whether_they_run() {
        let p = pod(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
            "status": {
                "initContainerStatuses": [{
                    "name": "init", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
                    "containerID": "containerd://1111",
                    "state": {"terminated": {"exitCode": 0}}
                }],
                "containerStatuses": [{
                    "name": "app", "image": "i", "imageID": "", "ready": true, "restartCount": 0,
                    "containerID": "cri-o://2222",
                    "state": {"running": {}}
                }, {
                    "name": "pending", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
                    "state": {"waiting": {"reason": "ContainerCreating"}}
                }]
            }
        }));
        assert_eq!(
            container_status(&p, "init"),
            Some(RuntimeContainer {
                runtime: "containerd".into(),
                id: "1111".into(),
                running: false,
                kind: StatusKind::Init
            })
        );
        assert_eq!(
            container_status(&p, "app"),
            Some(RuntimeContainer { runtime: "cri-o".into(), id: "2222".into(), running: true, kind: StatusKind::App })
        );
        assert_eq!(container_id(&p, "app"), Some(("cri-o".into(), "2222".into())));
        assert_eq!(container_id(&p, "pending"), None);
        assert_eq!(container_id(&p, "nope"), None);
        assert_eq!(container_id(&pod(serde_json::json!({})), "app"), None);
    }

    #[test]
    fn decode_reports_where_the_list_is_wrong() {
        assert_eq!(decode_pod_list(br#"{"kind":"PodList","items":null}"#).unwrap().len(), 0);
        assert_eq!(decode_pod_list(br#"{"apiVersion":"v1"}"#).unwrap().len(), 0);
        let (path, why) = decode_pod_list(b"{\"items\": [").unwrap_err();
        assert_eq!(path, "$");
        assert!(why.contains("line 1"), "{why}");
        assert_eq!(decode_pod_list(b"[]").unwrap_err().0, "$");
        assert_eq!(decode_pod_list(br#"{"kind":"Status"}"#).unwrap_err().0, "$.kind");
        assert_eq!(decode_pod_list(br#"{"items":{}}"#).unwrap_err().0, "$.items");
        let (path, why) = decode_pod_list(
            br#"{"items":[{"metadata":{"name":"a"}},{"metadata":{"name":"b","namespace":"n"},"spec":{"containers":7}}]}"#,
        )
        .unwrap_err();
        assert_eq!(path, "$.items[1] (n/b)");
        assert!(why.contains("invalid type"), "{why}");
    }

    #[test]
    fn config_errors_name_the_endpoint() {
        let bad = |config: KubeletConfig| KubeletClient::new(&config).unwrap_err().to_string();
        let e = bad(KubeletConfig { endpoint: "ftp://x".into(), ..KubeletConfig::default() });
        assert!(e.contains("ftp://x") && e.contains("scheme"), "{e}");
        let e = bad(KubeletConfig { token_file: Some("/t".into()), ..KubeletConfig::default() });
        assert!(e.contains("plain http"), "{e}");
        let e = bad(KubeletConfig { endpoint: DEFAULT_SECURE_ENDPOINT.into(), ..KubeletConfig::default() });
        assert!(e.contains("ca_file"), "{e}");
        let client = KubeletClient::new(&KubeletConfig {
            endpoint: "http://127.0.0.1:10255/prefix/".into(),
            ..KubeletConfig::default()
        })
        .unwrap();
        assert_eq!(client.url(), "http://127.0.0.1:10255/prefix/pods");
    }
}
