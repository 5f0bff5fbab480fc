//! AdmissionReview (`admission.k8s.io/v1`) as it travels on the wire, and the decision a handler
//! makes before it is encoded.
//!
//! weft has its own types instead of `kube::core::admission`'s because kube 5.0's
//! `AdmissionResponse.patch` is a `Vec<u8>` without a base64 serializer (kube issue #1781): serde
//! writes it as an array of numbers (`"patch":[91,123,…]`), while the API server expects the
//! base64 text of the JSON Patch document. Here `patch` is that base64 string, and `patchType:
//! "JSONPatch"` is written exactly when a patch is (the API server rejects a `patchType` without a
//! `patch`). The request side keeps `object` and `oldObject` as raw JSON, so patches are computed
//! against the object exactly as the API server holds it.

use base64::Engine as _;
use json_patch::PatchOperation;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `apiVersion` of the AdmissionReview weft's webhook configurations ask for.
pub const API_VERSION_V1: &str = "admission.k8s.io/v1";
/// The older `apiVersion` (same shape); answered in kind if an API server sends it.
pub const API_VERSION_V1BETA1: &str = "admission.k8s.io/v1beta1";
/// `kind` of an AdmissionReview.
pub const KIND: &str = "AdmissionReview";
/// Largest JSON patch weft answers with: the API server's limit on a whole request body
/// (`MaxRequestBodyBytes`, 3 MiB), which the patched object has to fit in as well. A larger patch
/// is a denial, never a response the API server would choke on.
pub const MAX_PATCH_BYTES: usize = 3 << 20;

/// The only `patchType` the API server accepts.
pub const PATCH_TYPE_JSON_PATCH: &str = "JSONPatch";

/// An AdmissionReview as the API server sends it.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReviewRequest {
    /// `admission.k8s.io/v1` (or `v1beta1`); the response must carry the same.
    pub api_version: String,
    /// `AdmissionReview`.
    pub kind: String,
    /// The request (an AdmissionReview without one cannot be answered), read once the envelope
    /// is known to be an AdmissionReview.
    #[serde(default)]
    pub request: Option<Value>,
}

/// `request` of an AdmissionReview: the parts weft reads.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionRequest {
    /// Identifies this round trip; the response echoes it.
    pub uid: String,
    /// The kind of `object` (e.g. `{"group":"batch.volcano.sh","version":"v1alpha1","kind":"Job"}`).
    #[serde(default)]
    pub kind: GroupVersionKind,
    /// The resource requested (e.g. `jobs`).
    #[serde(default)]
    pub resource: GroupVersionResource,
    /// The subresource, if any (`status`, `scale`, …).
    #[serde(default)]
    pub sub_resource: Option<String>,
    /// The object's name: empty on a CREATE with `generateName`.
    #[serde(default)]
    pub name: Option<String>,
    /// The namespace of the request (the object's `metadata.namespace` may be empty on CREATE).
    #[serde(default)]
    pub namespace: Option<String>,
    /// `CREATE`, `UPDATE`, `DELETE` or `CONNECT`.
    pub operation: Operation,
    /// The object being admitted (absent on DELETE).
    #[serde(default)]
    pub object: Option<Value>,
    /// The object before the change (UPDATE and DELETE).
    #[serde(default)]
    pub old_object: Option<Value>,
    /// Whether the change will not be persisted.
    #[serde(default)]
    pub dry_run: Option<bool>,
}

impl AdmissionRequest {
    /// `namespace/name` for logs (`name` may be empty on CREATE).
    pub fn object_ref(&self) -> String {
        let name = self
            .name
            .clone()
            .filter(|n| !n.is_empty())
            .or_else(|| str_at(self.object.as_ref(), "/metadata/name"))
            .or_else(|| str_at(self.object.as_ref(), "/metadata/generateName").map(|g| format!("{g}*")))
            .unwrap_or_default();
        match self.namespace.as_deref().filter(|n| !n.is_empty()) {
            Some(ns) => format!("{ns}/{name}"),
            None => name,
        }
    }
}

fn str_at(v: Option<&Value>, pointer: &str) -> Option<String> {
    v?.pointer(pointer)?.as_str().filter(|s| !s.is_empty()).map(str::to_owned)
}

/// `request.kind`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct GroupVersionKind {
    /// API group (`""` for core).
    #[serde(default)]
    pub group: String,
    /// Version.
    #[serde(default)]
    pub version: String,
    /// Kind.
    #[serde(default)]
    pub kind: String,
}

/// `request.resource`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct GroupVersionResource {
    /// API group (`""` for core).
    #[serde(default)]
    pub group: String,
    /// Version.
    #[serde(default)]
    pub version: String,
    /// Plural resource name.
    #[serde(default)]
    pub resource: String,
}

/// `request.operation`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Operation {
    /// CREATE.
    Create,
    /// UPDATE.
    Update,
    /// DELETE.
    Delete,
    /// CONNECT.
    Connect,
}

/// An AdmissionReview answering a request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReviewResponse {
    /// The request's `apiVersion`.
    pub api_version: String,
    /// `AdmissionReview`.
    pub kind: String,
    /// The answer.
    pub response: AdmissionResponse,
}

/// `response` of an AdmissionReview.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionResponse {
    /// The request's `uid`.
    pub uid: String,
    /// Whether the request is admitted.
    pub allowed: bool,
    /// Why it was denied (only on denial).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<Status>,
    /// base64 of the JSON Patch document (RFC 6902) to apply to the object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub patch: Option<String>,
    /// `JSONPatch`, exactly when `patch` is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub patch_type: Option<String>,
    /// Messages for the client (kubectl prints them as `Warning: …`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// `response.status` (a `metav1.Status`): the API server returns it to the client as the error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    /// Always `Failure` (only denials carry a status).
    pub status: String,
    /// The reason in words; the API server prefixes `admission webhook "<name>" denied the
    /// request: `.
    pub message: String,
    /// Machine-readable reason (`Invalid`, `NotFound`, …).
    pub reason: String,
    /// The HTTP status the client gets.
    pub code: u16,
}

/// Why a request is denied: an HTTP status and reason as Kubernetes uses them, and a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denial {
    /// HTTP status code the client sees.
    pub code: u16,
    /// `metav1.StatusReason`.
    pub reason: &'static str,
    /// The message.
    pub message: String,
}

impl Denial {
    /// 422 Invalid: the object fails validation (as the API server's own validation answers).
    pub fn invalid(message: impl Into<String>) -> Self {
        Self { code: 422, reason: "Invalid", message: message.into() }
    }

    /// 400 BadRequest: the request cannot be read (no object, wrong kind for the path).
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self { code: 400, reason: "BadRequest", message: message.into() }
    }

    /// 403 Forbidden: the request is valid but not permitted (a cap would be exceeded, as the API
    /// server answers for an exceeded ResourceQuota).
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self { code: 403, reason: "Forbidden", message: message.into() }
    }

    /// 404 NotFound: something the object refers to does not exist.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self { code: 404, reason: "NotFound", message: message.into() }
    }

    /// 409 Conflict: the object refers to something that has been replaced.
    pub fn conflict(message: impl Into<String>) -> Self {
        Self { code: 409, reason: "Conflict", message: message.into() }
    }

    /// 500 InternalError: the webhook could not decide (an API read failed).
    pub fn internal(message: impl Into<String>) -> Self {
        Self { code: 500, reason: "InternalError", message: message.into() }
    }

    /// 504 Timeout: the webhook could not decide in time.
    pub fn timeout(message: impl Into<String>) -> Self {
        Self { code: 504, reason: "Timeout", message: message.into() }
    }
}

/// What a handler decided: allowed (with an optional patch) or denied, plus warnings either way.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Decision {
    /// `Some`: denied.
    pub denial: Option<Denial>,
    /// The JSON patch (empty: none). Ignored on denial.
    pub patch: Vec<PatchOperation>,
    /// Warnings for the client.
    pub warnings: Vec<String>,
}

impl Decision {
    /// Allowed unchanged.
    pub fn allow() -> Self {
        Self::default()
    }

    /// Allowed with `patch` (unchanged when it is empty).
    pub fn patch(patch: Vec<PatchOperation>) -> Self {
        Self { patch, ..Self::default() }
    }

    /// Denied.
    pub fn deny(denial: Denial) -> Self {
        Self { denial: Some(denial), ..Self::default() }
    }

    /// The same decision with `warnings` added.
    #[must_use]
    pub fn with_warnings(mut self, warnings: Vec<String>) -> Self {
        self.warnings.extend(warnings);
        self
    }

    /// `allowed`, `patched` or `denied`: the `outcome` label of the request metrics.
    pub fn outcome(&self) -> &'static str {
        match (&self.denial, self.patch.is_empty()) {
            (Some(_), _) => "denied",
            (None, false) => "patched",
            (None, true) => "allowed",
        }
    }

    /// The AdmissionReview answering the request `uid`, sent as `api_version` (the request's).
    pub fn into_review(mut self, api_version: &str, uid: &str) -> ReviewResponse {
        let (mut patch, mut patch_type) = (None, None);
        if self.denial.is_none() && !self.patch.is_empty() {
            match serde_json::to_vec(&json_patch::Patch(std::mem::take(&mut self.patch))) {
                Ok(text) if text.len() > MAX_PATCH_BYTES => {
                    self.denial = Some(Denial::invalid(format!(
                        "weft's changes to this object are a {}-byte JSON patch; the API server accepts at most \
                         {MAX_PATCH_BYTES} bytes for a whole object, so the result could not be stored",
                        text.len()
                    )));
                }
                Ok(text) => {
                    patch = Some(base64::engine::general_purpose::STANDARD.encode(text));
                    patch_type = Some(PATCH_TYPE_JSON_PATCH.to_owned());
                }
                Err(e) => self.denial = Some(Denial::internal(format!("encoding the JSON patch: {e}"))),
            }
        }
        let status = self.denial.map(|d| Status {
            status: "Failure".to_owned(),
            message: d.message,
            reason: d.reason.to_owned(),
            code: d.code,
        });
        ReviewResponse {
            api_version: api_version.to_owned(),
            kind: KIND.to_owned(),
            response: AdmissionResponse {
                uid: uid.to_owned(),
                allowed: status.is_none(),
                status,
                patch,
                patch_type,
                warnings: self.warnings,
            },
        }
    }
}

/// Reads an AdmissionReview body: the review's `apiVersion` and its request, or why it cannot be
/// answered (the server replies 400 with that text).
pub fn parse(body: &[u8]) -> Result<(String, AdmissionRequest), String> {
    let review: ReviewRequest =
        serde_json::from_slice(body).map_err(|e| format!("the body is not an AdmissionReview: {e}"))?;
    if review.kind != KIND {
        return Err(format!("the body is a {:?}, not an AdmissionReview", review.kind));
    }
    if review.api_version != API_VERSION_V1 && review.api_version != API_VERSION_V1BETA1 {
        return Err(format!(
            "AdmissionReview apiVersion {:?} is not supported (use {API_VERSION_V1} in admissionReviewVersions)",
            review.api_version
        ));
    }
    let request = match review.request {
        None | Some(Value::Null) => return Err("the AdmissionReview has no request".to_owned()),
        Some(r) => serde_json::from_value::<AdmissionRequest>(r)
            .map_err(|e| format!("the AdmissionReview's request cannot be read: {e}"))?,
    };
    if request.uid.is_empty() {
        return Err("the AdmissionReview request has an empty uid".to_owned());
    }
    Ok((review.api_version, request))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use serde_json::json;

    fn add(path: &str, value: Value) -> PatchOperation {
        serde_json::from_value(json!({"op": "add", "path": path, "value": value})).unwrap()
    }

    #[test]
    fn a_patch_the_api_server_could_not_store_becomes_a_denial() {
        let big = |n: usize| Decision::patch(vec![add("/metadata/annotations/x", json!("y".repeat(n)))]);
        let over = big(MAX_PATCH_BYTES).into_review(API_VERSION_V1, "u1");
        assert!(!over.response.allowed);
        assert!(over.response.patch.is_none() && over.response.patch_type.is_none());
        let message = &over.response.status.as_ref().unwrap().message;
        assert!(message.contains(&MAX_PATCH_BYTES.to_string()), "{message}");
        let under = big(MAX_PATCH_BYTES - 100).into_review(API_VERSION_V1, "u1");
        assert!(under.response.allowed && under.response.patch.is_some());
    }

    #[test]
    fn kube_still_writes_the_patch_as_an_array_of_numbers() {
        // Why weft has its own response type (kube issue #1781). If this starts failing, kube
        // encodes the patch as base64 and its AdmissionResponse could be used instead.
        use kube::core::DynamicObject;
        use kube::core::admission::{
            AdmissionRequest as KubeRequest, AdmissionResponse as KubeResponse, AdmissionReview,
        };
        let review: AdmissionReview<DynamicObject> = serde_json::from_value(json!({
            "apiVersion": API_VERSION_V1, "kind": KIND,
            "request": {"uid": "u", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"}, "operation": "CREATE",
                "userInfo": {}, "object": {"metadata": {"name": "p"}}}
        }))
        .unwrap();
        let request: KubeRequest<DynamicObject> = review.try_into().unwrap();
        let response = KubeResponse::from(&request).with_patch(json_patch::Patch(vec![add("/a", json!(1))])).unwrap();
        let wire = serde_json::to_value(response.into_review()).unwrap();
        assert!(wire["response"]["patch"].is_array(), "{wire}");
        assert_eq!(wire["response"]["patch"][0], json!(b'['));
    }

    #[test]
    fn a_patch_is_base64_json_with_its_type_and_no_patch_means_no_type() {
        let review =
            Decision::patch(vec![add("/metadata/labels", json!({"a": "b"}))]).into_review(API_VERSION_V1, "u1");
        let wire = serde_json::to_value(&review).unwrap();
        assert_eq!(wire["response"]["patchType"], "JSONPatch");
        let text =
            base64::engine::general_purpose::STANDARD.decode(wire["response"]["patch"].as_str().unwrap()).unwrap();
        let ops: Value = serde_json::from_slice(&text).unwrap();
        assert_eq!(ops, json!([{"op": "add", "path": "/metadata/labels", "value": {"a": "b"}}]));
        assert_eq!(wire["response"]["uid"], "u1");
        assert!(wire["response"].get("status").is_none());

        let wire = serde_json::to_value(Decision::allow().into_review(API_VERSION_V1BETA1, "u2")).unwrap();
        assert_eq!(
            wire,
            json!({"apiVersion": API_VERSION_V1BETA1, "kind": "AdmissionReview", "response": {"uid": "u2", "allowed": true}})
        );
    }

    #[test]
    fn a_denial_drops_the_patch_and_keeps_warnings() {
        let d = Decision {
            denial: Some(Denial::invalid("no")),
            patch: vec![add("/a", json!(1))],
            warnings: vec!["w".into()],
        };
        assert_eq!(d.outcome(), "denied");
        let wire = serde_json::to_value(d.into_review(API_VERSION_V1, "u")).unwrap();
        assert_eq!(
            wire["response"],
            json!({"uid": "u", "allowed": false, "warnings": ["w"],
                "status": {"status": "Failure", "message": "no", "reason": "Invalid", "code": 422}})
        );
    }

    #[test]
    fn parse_explains_what_is_wrong() {
        assert!(parse(b"{").unwrap_err().contains("not an AdmissionReview"));
        assert!(
            parse(br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#)
                .unwrap_err()
                .contains("no request")
        );
        assert!(
            parse(br#"{"apiVersion":"v1","kind":"AdmissionReview","request":{}}"#).unwrap_err().contains("apiVersion")
        );
        assert!(parse(br#"{"apiVersion":"admission.k8s.io/v1","kind":"Pod"}"#).unwrap_err().contains("\"Pod\""));
        let bad_op = br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","operation":"PATCH"}}"#;
        assert!(parse(bad_op).unwrap_err().contains("PATCH"));
        let ok = br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","operation":"DELETE","namespace":"ns","name":"x"}}"#;
        let (v, r) = parse(ok).unwrap();
        assert_eq!((v.as_str(), r.operation, r.object_ref()), (API_VERSION_V1, Operation::Delete, "ns/x".to_owned()));
    }
}
