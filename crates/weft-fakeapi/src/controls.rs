//! Test controls: the request log and fault injection.

use std::fmt;

/// A Kubernetes RBAC verb, as the apiserver's authorizer derives it from a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Verb {
    /// GET on one object.
    Get,
    /// GET on a collection.
    List,
    /// GET with `watch=true` (or `watch=1`).
    Watch,
    /// POST.
    Create,
    /// PUT.
    Update,
    /// PATCH (every patch type, server-side apply included).
    Patch,
    /// DELETE on one object.
    Delete,
    /// DELETE on a collection.
    DeleteCollection,
}

impl Verb {
    /// The lowercase RBAC spelling (`deletecollection`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Get => "get",
            Self::List => "list",
            Self::Watch => "watch",
            Self::Create => "create",
            Self::Update => "update",
            Self::Patch => "patch",
            Self::Delete => "delete",
            Self::DeleteCollection => "deletecollection",
        }
    }
}

impl fmt::Display for Verb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One request the server answered (resource requests only; discovery is not recorded).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedRequest {
    /// The RBAC verb.
    pub verb: Verb,
    /// API group, `""` for core.
    pub group: String,
    /// API version.
    pub version: String,
    /// Plural resource name, e.g. `nodes`.
    pub resource: String,
    /// Subresource, e.g. `status`.
    pub subresource: Option<String>,
    /// Namespace from the path, if any.
    pub namespace: Option<String>,
    /// Object name from the path, if any.
    pub name: Option<String>,
    /// The `User-Agent` header.
    pub user_agent: Option<String>,
    /// The `fieldManager` query parameter.
    pub field_manager: Option<String>,
    /// The HTTP status code answered (200 for watches that started).
    pub code: u16,
}

impl RecordedRequest {
    /// The resource as RBAC rules name it: `nodes` or `nodes/status`.
    pub fn rbac_resource(&self) -> String {
        match &self.subresource {
            Some(sub) => format!("{}/{sub}", self.resource),
            None => self.resource.clone(),
        }
    }
}

/// Selects requests for fault injection. Unset fields match anything.
///
/// `resource` uses the RBAC spelling: `"nodes"` matches requests on the main resource only,
/// `"nodes/status"` the status subresource, `"*"` (or leaving it unset) any resource.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestMatcher {
    /// The verb.
    pub verb: Option<Verb>,
    /// The API group (`""` for core).
    pub group: Option<String>,
    /// `plural` or `plural/subresource`.
    pub resource: Option<String>,
    /// The namespace.
    pub namespace: Option<String>,
    /// The object name.
    pub name: Option<String>,
}

impl RequestMatcher {
    /// Matches every request.
    pub fn any() -> Self {
        Self::default()
    }

    /// Matches requests with this verb on this resource (`plural` or `plural/subresource`).
    pub fn new(verb: Verb, resource: &str) -> Self {
        Self { verb: Some(verb), resource: Some(resource.to_owned()), ..Self::default() }
    }

    /// Restricts to a verb.
    #[must_use]
    pub fn verb(mut self, verb: Verb) -> Self {
        self.verb = Some(verb);
        self
    }

    /// Restricts to a resource (`plural` or `plural/subresource`).
    #[must_use]
    pub fn resource(mut self, resource: &str) -> Self {
        self.resource = Some(resource.to_owned());
        self
    }

    /// Restricts to an API group.
    #[must_use]
    pub fn group(mut self, group: &str) -> Self {
        self.group = Some(group.to_owned());
        self
    }

    /// Restricts to a namespace.
    #[must_use]
    pub fn namespace(mut self, namespace: &str) -> Self {
        self.namespace = Some(namespace.to_owned());
        self
    }

    /// Restricts to an object name.
    #[must_use]
    pub fn name(mut self, name: &str) -> Self {
        self.name = Some(name.to_owned());
        self
    }

    /// Whether a request matches.
    pub fn matches(&self, r: &RecordedRequest) -> bool {
        self.verb.is_none_or(|v| v == r.verb)
            && self.group.as_ref().is_none_or(|g| *g == r.group)
            && self.resource.as_ref().is_none_or(|res| res == "*" || *res == r.rbac_resource())
            && self.namespace.as_ref().is_none_or(|ns| Some(ns) == r.namespace.as_ref())
            && self.name.as_ref().is_none_or(|n| Some(n) == r.name.as_ref())
    }
}

/// A pending injected failure.
#[derive(Debug, Clone)]
pub(crate) struct Fault {
    pub(crate) matcher: RequestMatcher,
    pub(crate) code: u16,
    pub(crate) remaining: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(verb: Verb, resource: &str, sub: Option<&str>, name: Option<&str>) -> RecordedRequest {
        RecordedRequest {
            verb,
            group: String::new(),
            version: "v1".into(),
            resource: resource.into(),
            subresource: sub.map(Into::into),
            namespace: None,
            name: name.map(Into::into),
            user_agent: None,
            field_manager: None,
            code: 200,
        }
    }

    #[test]
    fn matcher_uses_rbac_resource_spelling() {
        let m = RequestMatcher::new(Verb::Patch, "nodes");
        assert!(m.matches(&req(Verb::Patch, "nodes", None, Some("n1"))));
        assert!(!m.matches(&req(Verb::Patch, "nodes", Some("status"), Some("n1"))));
        assert!(!m.matches(&req(Verb::Get, "nodes", None, Some("n1"))));
        let s = RequestMatcher::new(Verb::Patch, "nodes/status").name("n1");
        assert!(s.matches(&req(Verb::Patch, "nodes", Some("status"), Some("n1"))));
        assert!(!s.matches(&req(Verb::Patch, "nodes", Some("status"), Some("n2"))));
        assert!(RequestMatcher::any().matches(&req(Verb::List, "pods", None, None)));
    }
}
