//! Errors: the `Status` bodies the fake server answers with, and the crate's own error type.

use serde_json::{Value, json};

/// An API failure as the server reports it: an HTTP code plus a `meta/v1 Status` body.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ApiError {
    pub(crate) code: u16,
    pub(crate) reason: String,
    pub(crate) message: String,
    pub(crate) details: Option<Value>,
}

/// Identifies an object in error messages: the resource (plural, with group) and the name.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ObjRef<'a> {
    pub(crate) group: &'a str,
    pub(crate) plural: &'a str,
    pub(crate) name: &'a str,
}

impl ObjRef<'_> {
    fn qualified(&self) -> String {
        if self.group.is_empty() { self.plural.to_owned() } else { format!("{}.{}", self.plural, self.group) }
    }

    fn details(&self) -> Value {
        let mut d = json!({ "name": self.name, "kind": self.plural });
        if !self.group.is_empty() {
            d["group"] = json!(self.group);
        }
        d
    }
}

impl ApiError {
    pub(crate) fn new(code: u16, reason: &str, message: impl Into<String>) -> Self {
        Self { code, reason: reason.to_owned(), message: message.into(), details: None }
    }

    fn with_details(mut self, details: Value) -> Self {
        self.details = Some(details);
        self
    }

    /// The `reason` the apiserver uses for an HTTP code (used by fault injection).
    pub(crate) fn reason_for(code: u16) -> &'static str {
        match code {
            400 => "BadRequest",
            401 => "Unauthorized",
            403 => "Forbidden",
            404 => "NotFound",
            405 => "MethodNotAllowed",
            406 => "NotAcceptable",
            409 => "Conflict",
            410 => "Gone",
            413 => "RequestEntityTooLarge",
            415 => "UnsupportedMediaType",
            422 => "Invalid",
            429 => "TooManyRequests",
            500 => "InternalError",
            503 => "ServiceUnavailable",
            504 => "Timeout",
            _ => "",
        }
    }

    /// An injected failure with the usual reason for its code.
    pub(crate) fn injected(code: u16, verb: &str, resource: &str) -> Self {
        Self::new(code, Self::reason_for(code), format!("injected failure: {verb} {resource} answered {code}"))
    }

    pub(crate) fn not_found(obj: ObjRef<'_>) -> Self {
        Self::new(404, "NotFound", format!("{} \"{}\" not found", obj.qualified(), obj.name))
            .with_details(obj.details())
    }

    pub(crate) fn no_route() -> Self {
        Self::new(404, "NotFound", "the server could not find the requested resource").with_details(json!({}))
    }

    pub(crate) fn already_exists(obj: ObjRef<'_>) -> Self {
        Self::new(409, "AlreadyExists", format!("{} \"{}\" already exists", obj.qualified(), obj.name))
            .with_details(obj.details())
    }

    pub(crate) fn conflict(obj: ObjRef<'_>, why: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!("Operation cannot be fulfilled on {} \"{}\": {why}", obj.qualified(), obj.name),
        )
        .with_details(obj.details())
    }

    pub(crate) fn stale(obj: ObjRef<'_>) -> Self {
        Self::conflict(
            obj,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// A server-side apply conflict between field managers.
    pub(crate) fn apply_conflict(obj: ObjRef<'_>, conflicts: &[(String, String)]) -> Self {
        let list: Vec<String> = conflicts.iter().map(|(m, f)| format!("conflict with \"{m}\": {f}")).collect();
        let noun = if conflicts.len() == 1 { "conflict" } else { "conflicts" };
        let message = format!("Apply failed with {} {noun}: {}", conflicts.len(), list.join(", "));
        let causes: Vec<Value> = conflicts
            .iter()
            .map(|(m, f)| json!({ "reason": "FieldManagerConflict", "message": format!("conflict with \"{m}\""), "field": f }))
            .collect();
        let mut details = obj.details();
        details["causes"] = Value::Array(causes);
        Self::new(409, "Conflict", message).with_details(details)
    }

    pub(crate) fn invalid(obj: ObjRef<'_>, kind: &str, why: &str) -> Self {
        let mut details = obj.details();
        details["kind"] = json!(kind);
        Self::new(422, "Invalid", format!("{kind} \"{}\" is invalid: {why}", obj.name)).with_details(details)
    }

    pub(crate) fn unprocessable(message: impl Into<String>) -> Self {
        Self::new(422, "Invalid", message)
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    pub(crate) fn expired(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    pub(crate) fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", message)
    }

    pub(crate) fn unsupported_media_type(content_type: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json (got {content_type:?})"
            ),
        )
    }

    pub(crate) fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", message)
    }

    /// The `Status` body.
    pub(crate) fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(details) = &self.details {
            status["details"] = details.clone();
        }
        status
    }
}

/// Errors of the test-control API.
#[derive(Debug, thiserror::Error)]
pub enum FakeError {
    /// The listener could not be bound.
    #[error("cannot bind the fake API server: {0}")]
    Bind(#[source] std::io::Error),
    /// No registered resource matches the name, or the `apiVersion`/`kind` of an object.
    #[error("unknown resource {0}")]
    UnknownResource(String),
    /// An object handed to a control method is not usable (not a map, no name, bad JSON).
    #[error("invalid object: {0}")]
    InvalidObject(String),
    /// The object named does not exist.
    #[error("object {0} not found")]
    NotFound(String),
    /// (De)serialising a typed object failed.
    #[error("JSON conversion failed: {0}")]
    Json(#[from] serde_json::Error),
    /// Writing a file (the kubeconfig) failed.
    #[error("cannot write {path}: {source}")]
    Io {
        /// The file.
        path: std::path::PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The server URL is not a valid URI (should not happen).
    #[error("invalid server URL: {0}")]
    Url(#[from] http::uri::InvalidUri),
    /// kube could not build a client for the server.
    #[error("cannot build a kube client: {0}")]
    Client(#[from] kube::Error),
}
