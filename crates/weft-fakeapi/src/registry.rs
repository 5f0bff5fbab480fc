//! The resource registry: which `group/version/plural` paths exist, their kind and scope.

use std::collections::BTreeMap;

use serde_json::Value;

/// One served resource (a group/version/plural triple), as `register` takes it.
///
/// Objects are stored per group and plural, so several versions of one resource share their
/// objects (without conversion: a read through another version only rewrites `apiVersion`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceSpec {
    /// API group, `""` for the core group.
    pub group: String,
    /// API version, e.g. `v1`.
    pub version: String,
    /// Plural resource name used in paths, e.g. `pods`.
    pub plural: String,
    /// Kind, e.g. `Pod`.
    pub kind: String,
    /// Namespaced (`true`) or cluster-scoped.
    pub namespaced: bool,
    /// Whether the resource has a `status` subresource (then writes to the main resource keep
    /// `.status` and writes to `/status` change only `.status`).
    pub status_subresource: bool,
}

impl ResourceSpec {
    /// A namespaced resource without a status subresource.
    pub fn namespaced(group: &str, version: &str, plural: &str, kind: &str) -> Self {
        Self {
            group: group.to_owned(),
            version: version.to_owned(),
            plural: plural.to_owned(),
            kind: kind.to_owned(),
            namespaced: true,
            status_subresource: false,
        }
    }

    /// A cluster-scoped resource without a status subresource.
    pub fn cluster(group: &str, version: &str, plural: &str, kind: &str) -> Self {
        Self { namespaced: false, ..Self::namespaced(group, version, plural, kind) }
    }

    /// The same resource with a `status` subresource.
    #[must_use]
    pub fn with_status(mut self) -> Self {
        self.status_subresource = true;
        self
    }

    /// `v1` for the core group, else `group/version`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() { self.version.clone() } else { format!("{}/{}", self.group, self.version) }
    }

    /// The kind of a list, `<Kind>List`.
    pub fn list_kind(&self) -> String {
        format!("{}List", self.kind)
    }

    pub(crate) fn group_resource(&self) -> GroupResource {
        GroupResource { group: self.group.clone(), resource: self.plural.clone() }
    }
}

/// Storage key of a resource: group and plural (versions share storage).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct GroupResource {
    pub(crate) group: String,
    pub(crate) resource: String,
}

/// Splits an `apiVersion` into group and version (`v1` → `("", "v1")`).
pub(crate) fn split_api_version(api_version: &str) -> (&str, &str) {
    match api_version.split_once('/') {
        Some((group, version)) => (group, version),
        None => ("", api_version),
    }
}

/// All served resources.
#[derive(Debug, Clone, Default)]
pub(crate) struct Registry {
    by_path: BTreeMap<(String, String, String), ResourceSpec>,
}

impl Registry {
    /// The built-in resources listed in the crate documentation.
    pub(crate) fn builtin() -> Self {
        let mut r = Self::default();
        let core = [
            ResourceSpec::cluster("", "v1", "nodes", "Node").with_status(),
            ResourceSpec::namespaced("", "v1", "pods", "Pod").with_status(),
            ResourceSpec::namespaced("", "v1", "configmaps", "ConfigMap"),
            ResourceSpec::namespaced("", "v1", "secrets", "Secret"),
            ResourceSpec::namespaced("", "v1", "services", "Service").with_status(),
            ResourceSpec::cluster("", "v1", "namespaces", "Namespace").with_status(),
            ResourceSpec::namespaced("", "v1", "events", "Event"),
            ResourceSpec::namespaced("", "v1", "serviceaccounts", "ServiceAccount"),
            ResourceSpec::namespaced("events.k8s.io", "v1", "events", "Event"),
            ResourceSpec::namespaced("apps", "v1", "deployments", "Deployment").with_status(),
            ResourceSpec::namespaced("apps", "v1", "daemonsets", "DaemonSet").with_status(),
            ResourceSpec::namespaced("apps", "v1", "statefulsets", "StatefulSet").with_status(),
            ResourceSpec::namespaced("apps", "v1", "replicasets", "ReplicaSet").with_status(),
            ResourceSpec::namespaced("coordination.k8s.io", "v1", "leases", "Lease"),
            ResourceSpec::namespaced("resource.k8s.io", "v1", "resourceclaims", "ResourceClaim").with_status(),
            ResourceSpec::namespaced("resource.k8s.io", "v1", "resourceclaimtemplates", "ResourceClaimTemplate"),
            ResourceSpec::cluster("resource.k8s.io", "v1", "deviceclasses", "DeviceClass"),
            ResourceSpec::cluster("resource.k8s.io", "v1", "resourceslices", "ResourceSlice"),
            ResourceSpec::cluster(
                "apiextensions.k8s.io",
                "v1",
                "customresourcedefinitions",
                "CustomResourceDefinition",
            )
            .with_status(),
        ];
        for spec in core {
            r.register(spec);
        }
        r
    }

    /// Adds or replaces a resource.
    pub(crate) fn register(&mut self, spec: ResourceSpec) {
        self.by_path.insert((spec.group.clone(), spec.version.clone(), spec.plural.clone()), spec);
    }

    /// Removes every version of a group/plural; returns whether something was removed.
    pub(crate) fn unregister(&mut self, group: &str, plural: &str) -> bool {
        let before = self.by_path.len();
        self.by_path.retain(|(g, _, p), _| !(g == group && p == plural));
        before != self.by_path.len()
    }

    pub(crate) fn lookup(&self, group: &str, version: &str, plural: &str) -> Option<&ResourceSpec> {
        self.by_path.get(&(group.to_owned(), version.to_owned(), plural.to_owned()))
    }

    /// The resource serving `kind` in `apiVersion`.
    pub(crate) fn by_kind(&self, api_version: &str, kind: &str) -> Option<&ResourceSpec> {
        let (group, version) = split_api_version(api_version);
        self.by_path.values().find(|s| s.group == group && s.version == version && s.kind == kind)
    }

    /// A resource by `plural` (core group first, else the only group that has it) or
    /// `plural.group` (kubectl's spelling, e.g. `leases.coordination.k8s.io`).
    pub(crate) fn by_name(&self, name: &str) -> Option<&ResourceSpec> {
        if let Some(spec) = self.by_path.values().find(|s| s.group.is_empty() && s.plural == name) {
            return Some(spec);
        }
        if let Some((plural, group)) = name.split_once('.')
            && let Some(spec) = self.by_path.values().find(|s| s.group == group && s.plural == plural)
        {
            return Some(spec);
        }
        let mut matches = self.by_path.values().filter(|s| s.plural == name);
        let first = matches.next()?;
        // Ambiguous across groups unless every match is the same group (several versions).
        if matches.all(|s| s.group == first.group) { Some(first) } else { None }
    }

    /// Every served resource, ordered by group, version and plural.
    pub(crate) fn all(&self) -> impl Iterator<Item = &ResourceSpec> {
        self.by_path.values()
    }
}

/// The resources a `CustomResourceDefinition` object serves, or why it is invalid.
pub(crate) fn crd_resources(crd: &Value) -> Result<Vec<ResourceSpec>, String> {
    let spec = crd.get("spec").ok_or("spec: Required value")?;
    let group =
        spec.get("group").and_then(Value::as_str).filter(|s| !s.is_empty()).ok_or("spec.group: Required value")?;
    let names = spec.get("names").ok_or("spec.names: Required value")?;
    let plural = names
        .get("plural")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .ok_or("spec.names.plural: Required value")?;
    let kind =
        names.get("kind").and_then(Value::as_str).filter(|s| !s.is_empty()).ok_or("spec.names.kind: Required value")?;
    let namespaced = match spec.get("scope").and_then(Value::as_str) {
        Some("Namespaced") => true,
        Some("Cluster") => false,
        other => {
            return Err(format!(
                "spec.scope: Unsupported value: {other:?}: supported values: \"Cluster\", \"Namespaced\""
            ));
        }
    };
    let expected_name = format!("{plural}.{group}");
    if crate::meta::name(crd) != Some(expected_name.as_str()) {
        return Err(format!(
            "metadata.name: Invalid value: must be spec.names.plural+\".\"+spec.group ({expected_name})"
        ));
    }
    let versions = spec.get("versions").and_then(Value::as_array).ok_or("spec.versions: Required value")?;
    let mut out = Vec::new();
    for (i, v) in versions.iter().enumerate() {
        let name = v
            .get("name")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .ok_or_else(|| format!("spec.versions[{i}].name: Required value"))?;
        let served = v.get("served").and_then(Value::as_bool).unwrap_or(false);
        if !served {
            continue;
        }
        let status = v.pointer("/subresources/status").is_some();
        out.push(ResourceSpec {
            group: group.to_owned(),
            version: name.to_owned(),
            plural: plural.to_owned(),
            kind: kind.to_owned(),
            namespaced,
            status_subresource: status,
        });
    }
    Ok(out)
}

/// The `status` the apiserver gives an accepted CRD (names accepted, established).
pub(crate) fn crd_status(crd: &Value) -> Value {
    let now = crate::meta::now_rfc3339();
    let names = crd.pointer("/spec/names").cloned().unwrap_or_else(|| serde_json::json!({}));
    let mut accepted = names;
    if accepted.get("listKind").is_none()
        && let Some(kind) = accepted.get("kind").and_then(Value::as_str)
    {
        accepted["listKind"] = Value::String(format!("{kind}List"));
    }
    if accepted.get("singular").is_none()
        && let Some(kind) = accepted.get("kind").and_then(Value::as_str)
    {
        accepted["singular"] = Value::String(kind.to_lowercase());
    }
    let stored: Vec<Value> = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .map(|vs| {
            vs.iter()
                .filter(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
                .filter_map(|v| v.get("name").cloned())
                .collect()
        })
        .unwrap_or_default();
    serde_json::json!({
        "acceptedNames": accepted,
        "conditions": [
            { "type": "NamesAccepted", "status": "True", "reason": "NoConflicts",
              "message": "no conflicts found", "lastTransitionTime": now },
            { "type": "Established", "status": "True", "reason": "InitialNamesAccepted",
              "message": "the initial names have been accepted", "lastTransitionTime": now },
        ],
        "storedVersions": stored,
    })
}
