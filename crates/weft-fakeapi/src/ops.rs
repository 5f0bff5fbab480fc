//! Request semantics: create, read, list, update, patch, delete, as the apiserver applies them.

use serde_json::{Value, json};

use crate::error::{ApiError, FakeError, ObjRef};
use crate::managed::{self, Scope, Writer};
use crate::meta;
use crate::patch::{self, PatchKind};
use crate::registry::{self, ResourceSpec};
use crate::selectors::Filter;
use crate::store::{EventType, State};

/// Who writes and how.
#[derive(Debug, Clone)]
pub(crate) struct WriteCtx {
    /// The `fieldManager` query parameter.
    pub(crate) field_manager: Option<String>,
    /// The manager recorded for updates: `fieldManager`, else the user agent up to its first `/`.
    pub(crate) manager: String,
    pub(crate) force: bool,
    pub(crate) dry_run: bool,
}

/// Options of a DELETE (from the `DeleteOptions` body and query).
#[derive(Debug, Clone, Default)]
pub(crate) struct DeleteOpts {
    pub(crate) uid: Option<String>,
    pub(crate) resource_version: Option<String>,
    pub(crate) grace_period_seconds: Option<i64>,
    pub(crate) dry_run: bool,
}

impl DeleteOpts {
    /// Reads a `DeleteOptions` body (empty bodies are fine).
    pub(crate) fn from_body(body: &[u8]) -> Result<Self, ApiError> {
        if body.iter().all(u8::is_ascii_whitespace) {
            return Ok(Self::default());
        }
        let v = patch::parse_object(body, "DeleteOptions")?;
        let s = |p: &str| v.pointer(p).and_then(Value::as_str).filter(|s| !s.is_empty()).map(str::to_owned);
        Ok(Self {
            uid: s("/preconditions/uid"),
            resource_version: s("/preconditions/resourceVersion"),
            grace_period_seconds: v.get("gracePeriodSeconds").and_then(Value::as_i64),
            dry_run: v
                .get("dryRun")
                .and_then(Value::as_array)
                .is_some_and(|a| a.iter().any(|x| x.as_str() == Some("All"))),
        })
    }
}

fn obj_ref<'a>(spec: &'a ResourceSpec, name: &'a str) -> ObjRef<'a> {
    ObjRef { group: &spec.group, plural: &spec.plural, name }
}

fn is_crd(spec: &ResourceSpec) -> bool {
    spec.group == "apiextensions.k8s.io" && spec.plural == "customresourcedefinitions"
}

/// The object as served through `spec`'s version: `apiVersion` and `kind` set.
pub(crate) fn present(spec: &ResourceSpec, obj: &Value) -> Value {
    let mut out = obj.clone();
    let root = meta::root_mut(&mut out);
    root.insert("apiVersion".to_owned(), Value::String(spec.api_version()));
    root.insert("kind".to_owned(), Value::String(spec.kind.clone()));
    out
}

/// Checks a body's `kind`/`apiVersion` against the endpoint and fills them in.
fn check_type(spec: &ResourceSpec, body: &mut Value) -> Result<(), ApiError> {
    if let Some(kind) = body.get("kind").and_then(Value::as_str).filter(|k| !k.is_empty())
        && kind != spec.kind
    {
        return Err(ApiError::bad_request(format!(
            "the kind of the provided object ({kind}) does not match the endpoint ({})",
            spec.kind
        )));
    }
    if let Some(av) = body.get("apiVersion").and_then(Value::as_str).filter(|k| !k.is_empty())
        && registry::split_api_version(av).0 != spec.group
    {
        return Err(ApiError::bad_request(format!(
            "the apiVersion of the provided object ({av}) does not match the endpoint ({})",
            spec.api_version()
        )));
    }
    let root = meta::root_mut(body);
    root.insert("apiVersion".to_owned(), Value::String(spec.api_version()));
    root.insert("kind".to_owned(), Value::String(spec.kind.clone()));
    Ok(())
}

/// Checks that the body names the object of the URL (filling the namespace in when absent).
fn check_identity(spec: &ResourceSpec, ns: Option<&str>, name: &str, body: &mut Value) -> Result<(), ApiError> {
    match meta::name(body) {
        Some(n) if n == name => {}
        other => {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({}) does not match the name on the URL ({name})",
                other.unwrap_or_default()
            )));
        }
    }
    check_namespace(spec, ns, body)
}

fn check_namespace(spec: &ResourceSpec, ns: Option<&str>, body: &mut Value) -> Result<(), ApiError> {
    if spec.namespaced {
        let url_ns = ns.unwrap_or_default();
        if let Some(body_ns) = meta::namespace(body)
            && body_ns != url_ns
        {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        meta::set_meta(body, "namespace", meta::string(url_ns));
    } else {
        meta::remove_meta(body, "namespace");
    }
    Ok(())
}

/// What the apiserver's create strategies do to `.status` of resources with a status subresource.
fn prepare_create(spec: &ResourceSpec, obj: &mut Value) {
    if !spec.status_subresource {
        return;
    }
    let root = meta::root_mut(obj);
    match (spec.group.as_str(), spec.kind.as_str()) {
        ("", "Node") => {}
        ("", "Pod") => {
            root.insert("status".to_owned(), json!({ "phase": "Pending" }));
        }
        ("", "Namespace") => {
            root.insert("status".to_owned(), json!({ "phase": "Active" }));
        }
        _ => {
            root.remove("status");
        }
    }
}

/// Sets the metadata the server owns on a new object.
fn stamp_new(st: &mut State, obj: &mut Value) {
    let uid = st.next_uid();
    let m = meta::meta_mut(obj);
    m.insert("uid".to_owned(), Value::String(uid));
    m.insert("creationTimestamp".to_owned(), Value::String(meta::now_rfc3339()));
    m.insert("generation".to_owned(), json!(1));
    for k in ["deletionTimestamp", "deletionGracePeriodSeconds", "selfLink", "resourceVersion"] {
        m.remove(k);
    }
}

fn writer<'a>(spec: &ResourceSpec, ctx: &'a WriteCtx, api_version: &'a str, sub: Option<&'a str>) -> Writer<'a> {
    let scope =
        if sub == Some("status") { Scope::Status } else { Scope::Main { with_status: !spec.status_subresource } };
    Writer { manager: &ctx.manager, api_version, subresource: sub, scope }
}

/// Whether anything outside `metadata` (and `status`, with a status subresource) differs.
fn spec_changed(spec: &ResourceSpec, old: &Value, new: &Value) -> bool {
    let strip = |v: &Value| {
        let mut v = v.clone();
        let root = meta::root_mut(&mut v);
        root.remove("metadata");
        root.remove("apiVersion");
        root.remove("kind");
        if spec.status_subresource {
            root.remove("status");
        }
        v
    };
    strip(old) != strip(new)
}

fn same_ignoring_rv(a: &Value, b: &Value) -> bool {
    let strip = |v: &Value| {
        let mut v = v.clone();
        meta::remove_meta(&mut v, "resourceVersion");
        let root = meta::root_mut(&mut v);
        root.remove("apiVersion");
        root.remove("kind");
        v
    };
    strip(a) == strip(b)
}

/// Hooks run after a committed write of a CRD: (re)register or unregister its resources.
fn crd_hook(st: &mut State, spec: &ResourceSpec, obj: &Value, kind: EventType) {
    if !is_crd(spec) {
        return;
    }
    let group = obj.pointer("/spec/group").and_then(Value::as_str).unwrap_or_default().to_owned();
    let plural = obj.pointer("/spec/names/plural").and_then(Value::as_str).unwrap_or_default().to_owned();
    st.registry.unregister(&group, &plural);
    match kind {
        EventType::Deleted => st.drop_resource(&registry::GroupResource { group, resource: plural }),
        EventType::Added | EventType::Modified => {
            for r in registry::crd_resources(obj).unwrap_or_default() {
                st.registry.register(r);
            }
        }
    }
}

fn validate_crd(spec: &ResourceSpec, obj: &Value) -> Result<(), ApiError> {
    if is_crd(spec) {
        let name = meta::name(obj).unwrap_or_default();
        registry::crd_resources(obj).map_err(|why| ApiError::invalid(obj_ref(spec, name), &spec.kind, &why))?;
    }
    Ok(())
}

pub(crate) fn get(st: &State, spec: &ResourceSpec, ns: Option<&str>, name: &str) -> Result<Value, ApiError> {
    st.get(&spec.group_resource(), ns, name)
        .map(|o| present(spec, o))
        .ok_or_else(|| ApiError::not_found(obj_ref(spec, name)))
}

/// A page of a list.
pub(crate) fn list(
    st: &State,
    spec: &ResourceSpec,
    filter: &Filter,
    limit: Option<usize>,
    continue_token: Option<&str>,
) -> Result<Value, ApiError> {
    let (list_rv, after) = match continue_token.filter(|t| !t.is_empty()) {
        None => (st.rv(), None),
        Some(token) => {
            let mut parts = token.splitn(3, '/');
            let (Some(rv), Some(ns), Some(name)) = (parts.next(), parts.next(), parts.next()) else {
                return Err(ApiError::bad_request(format!("continue key is not valid: {token:?}")));
            };
            let rv = rv
                .parse::<u64>()
                .map_err(|_| ApiError::bad_request(format!("continue key is not valid: {token:?}")))?;
            (rv, Some((ns.to_owned(), name.to_owned())))
        }
    };
    let items = st.list(&spec.group_resource(), filter, after.as_ref());
    let mut metadata = json!({ "resourceVersion": list_rv.to_string() });
    let shown = match limit.filter(|l| *l > 0) {
        Some(l) if items.len() > l => {
            let last = items[l - 1];
            metadata["continue"] = json!(format!(
                "{list_rv}/{}/{}",
                meta::namespace(last).unwrap_or_default(),
                meta::name(last).unwrap_or_default()
            ));
            metadata["remainingItemCount"] = json!(items.len() - l);
            &items[..l]
        }
        _ => &items[..],
    };
    Ok(json!({
        "kind": spec.list_kind(),
        "apiVersion": spec.api_version(),
        "metadata": metadata,
        "items": shown.iter().map(|o| present(spec, o)).collect::<Vec<_>>(),
    }))
}

/// POST.
pub(crate) fn create(
    st: &mut State,
    spec: &ResourceSpec,
    ns: Option<&str>,
    mut body: Value,
    ctx: &WriteCtx,
) -> Result<Value, ApiError> {
    check_type(spec, &mut body)?;
    if spec.namespaced && ns.is_none() {
        return Err(ApiError::method_not_allowed("create needs a namespaced path for a namespaced resource"));
    }
    check_namespace(spec, ns, &mut body)?;
    if meta::name(&body).is_none() {
        let Some(prefix) = body.pointer("/metadata/generateName").and_then(Value::as_str).map(str::to_owned) else {
            return Err(ApiError::invalid(
                obj_ref(spec, ""),
                &spec.kind,
                "metadata.name: Required value: name or generateName is required",
            ));
        };
        let name = loop {
            let candidate = format!("{prefix}{}", st.next_suffix());
            if st.get(&spec.group_resource(), ns, &candidate).is_none() {
                break candidate;
            }
        };
        meta::set_meta(&mut body, "name", Value::String(name));
    }
    let name = meta::name(&body).unwrap_or_default().to_owned();
    if name.contains('/') || name == "." || name == ".." {
        return Err(ApiError::invalid(
            obj_ref(spec, &name),
            &spec.kind,
            "metadata.name: Invalid value: may not contain '/'",
        ));
    }
    if st.get(&spec.group_resource(), ns, &name).is_some() {
        return Err(ApiError::already_exists(obj_ref(spec, &name)));
    }
    if meta::resource_version(&body).is_some() {
        return Err(ApiError::internal("resourceVersion should not be set on objects to be created"));
    }
    prepare_create(spec, &mut body);
    stamp_new(st, &mut body);
    meta::remove_meta(&mut body, "managedFields");
    let api_version = spec.api_version();
    let w = Writer { scope: Scope::Main { with_status: true }, ..writer(spec, ctx, &api_version, None) };
    managed::record_update(None, &mut body, w);
    validate_crd(spec, &body)?;
    if is_crd(spec) {
        let status = registry::crd_status(&body);
        meta::root_mut(&mut body).insert("status".to_owned(), status);
    }
    if ctx.dry_run {
        return Ok(present(spec, &body));
    }
    let stored = st.commit(spec, EventType::Added, body, None);
    crd_hook(st, spec, &stored, EventType::Added);
    Ok(present(spec, &stored))
}

/// How `finish_write` treats `managedFields`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ownership {
    /// Record an `Update` by the writer.
    RecordUpdate,
    /// Already computed (server-side apply).
    Computed,
}

/// The common tail of every update: server-owned metadata, finalizer rules, generation, field
/// ownership, no-op detection, and deletion once the last finalizer is gone.
fn finish_write(
    st: &mut State,
    spec: &ResourceSpec,
    existing: &Value,
    mut new: Value,
    ctx: &WriteCtx,
    sub: Option<&str>,
    ownership: Ownership,
) -> Result<Value, ApiError> {
    let name = meta::name(existing).unwrap_or_default().to_owned();
    // A write without a UID keeps the stored one (`rest.BeforeUpdate`); one with another UID is
    // invalid (`ValidateObjectMetaUpdate`: the field is immutable).
    if let Some(uid) = meta::uid(&new).filter(|u| !u.is_empty())
        && Some(uid) != meta::uid(existing)
    {
        return Err(ApiError::invalid(
            obj_ref(spec, &name),
            &spec.kind,
            &format!("metadata.uid: Invalid value: \"{uid}\": field is immutable"),
        ));
    }
    for key in [
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "generation",
        "name",
        "namespace",
    ] {
        match existing.pointer(&format!("/metadata/{key}")) {
            Some(v) => meta::set_meta(&mut new, key, v.clone()),
            None => {
                meta::remove_meta(&mut new, key);
            }
        }
    }
    meta::remove_meta(&mut new, "selfLink");
    if meta::is_deleting(existing) {
        let old = meta::finalizers(existing);
        if let Some(added) = meta::finalizers(&new).into_iter().find(|f| !old.contains(f)) {
            return Err(ApiError::invalid(
                obj_ref(spec, &name),
                &spec.kind,
                &format!(
                    "metadata.finalizers: Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers [{added}]"
                ),
            ));
        }
    }
    if spec_changed(spec, existing, &new) {
        let generation = meta::generation(existing).unwrap_or(0) + 1;
        meta::set_meta(&mut new, "generation", json!(generation));
    }
    if is_crd(spec) {
        validate_crd(spec, &new)?;
    }
    let api_version = spec.api_version();
    if ownership == Ownership::RecordUpdate {
        managed::record_update(Some(existing), &mut new, writer(spec, ctx, &api_version, sub));
    }
    if same_ignoring_rv(existing, &new) {
        return Ok(present(spec, existing));
    }
    if ctx.dry_run {
        return Ok(present(spec, &new));
    }
    let kind = if meta::is_deleting(&new) && meta::finalizers(&new).is_empty() {
        EventType::Deleted
    } else {
        EventType::Modified
    };
    let prev = (kind == EventType::Modified).then(|| existing.clone());
    let stored = st.commit(spec, kind, new, prev);
    crd_hook(st, spec, &stored, kind);
    Ok(present(spec, &stored))
}

/// Keeps the part of `patched` a write through `sub` may change, the rest from `existing`.
fn isolate_status(spec: &ResourceSpec, sub: Option<&str>, existing: &Value, patched: Value) -> Value {
    let status_of = |v: &Value| v.get("status").cloned();
    let with_status = |mut v: Value, status: Option<Value>| {
        let root = meta::root_mut(&mut v);
        match status {
            Some(s) => root.insert("status".to_owned(), s),
            None => root.remove("status"),
        };
        v
    };
    match sub {
        Some(_) => with_status(existing.clone(), status_of(&patched)),
        None if spec.status_subresource => with_status(patched, status_of(existing)),
        None => patched,
    }
}

fn check_subresource(spec: &ResourceSpec, sub: Option<&str>, name: &str) -> Result<(), ApiError> {
    match sub {
        None => Ok(()),
        Some("status") if spec.status_subresource => Ok(()),
        Some(other) => Err(ApiError::new(
            404,
            "NotFound",
            format!("{}/{other} \"{name}\": the server could not find the requested resource", spec.plural),
        )),
    }
}

/// PUT.
pub(crate) fn update(
    st: &mut State,
    spec: &ResourceSpec,
    ns: Option<&str>,
    name: &str,
    sub: Option<&str>,
    mut body: Value,
    ctx: &WriteCtx,
) -> Result<Value, ApiError> {
    check_subresource(spec, sub, name)?;
    check_type(spec, &mut body)?;
    check_identity(spec, ns, name, &mut body)?;
    let existing =
        st.get(&spec.group_resource(), ns, name).cloned().ok_or_else(|| ApiError::not_found(obj_ref(spec, name)))?;
    if let Some(rv) = meta::resource_version(&body)
        && Some(rv) != meta::resource_version(&existing)
    {
        return Err(ApiError::stale(obj_ref(spec, name)));
    }
    let new = isolate_status(spec, sub, &existing, body);
    finish_write(st, spec, &existing, new, ctx, sub, Ownership::RecordUpdate)
}

/// POST `pods/{name}/binding`, as the API server's `BindingREST.Create`: the Binding's name must be
/// the pod's, its target a Node by name; then, atomically, the pod must still match the Binding's
/// uid (and resourceVersion, when given), not be terminating, not be bound already and have no
/// scheduling gates; it gets `spec.nodeName`, the Binding's annotations and `PodScheduled=True`.
/// Refusals of the pod's state are 409 Conflicts on `pods/binding`, with upstream's messages.
pub(crate) fn bind_pod(
    st: &mut State,
    spec: &ResourceSpec,
    ns: Option<&str>,
    name: &str,
    binding: Value,
    ctx: &WriteCtx,
) -> Result<Value, ApiError> {
    let binding_ref = ObjRef { group: "", plural: "bindings", name };
    if binding.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("") != name {
        return Err(ApiError::bad_request("name in URL does not match name in Binding object"));
    }
    let target_kind = binding.pointer("/target/kind").and_then(Value::as_str).unwrap_or("");
    if !target_kind.is_empty() && target_kind != "Node" {
        return Err(ApiError::invalid(
            binding_ref,
            "Binding",
            &format!("target.kind: Unsupported value: \"{target_kind}\": supported values: \"Node\""),
        ));
    }
    let node = binding.pointer("/target/name").and_then(Value::as_str).unwrap_or("").to_owned();
    if node.is_empty() {
        return Err(ApiError::invalid(binding_ref, "Binding", "target.name: Required value"));
    }
    let existing =
        st.get(&spec.group_resource(), ns, name).cloned().ok_or_else(|| ApiError::not_found(obj_ref(spec, name)))?;
    let refuse = |why: String| ApiError::conflict(ObjRef { group: "", plural: "pods/binding", name }, &why);
    let field = |v: &Value, path: &str| v.pointer(path).and_then(Value::as_str).unwrap_or("").to_owned();
    let uid = field(&binding, "/metadata/uid");
    if !uid.is_empty() && uid != field(&existing, "/metadata/uid") {
        return Err(refuse(format!(
            "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
            field(&existing, "/metadata/uid")
        )));
    }
    let rv = field(&binding, "/metadata/resourceVersion");
    if !rv.is_empty() && Some(rv.as_str()) != meta::resource_version(&existing) {
        return Err(ApiError::stale(obj_ref(spec, name)));
    }
    if existing.pointer("/metadata/deletionTimestamp").is_some_and(|t| !t.is_null()) {
        return Err(refuse(format!("pod {name} is being deleted, cannot be assigned to a host")));
    }
    let bound = field(&existing, "/spec/nodeName");
    if !bound.is_empty() {
        return Err(refuse(format!("pod {name} is already assigned to node \"{bound}\"")));
    }
    if existing.pointer("/spec/schedulingGates").and_then(Value::as_array).is_some_and(|g| !g.is_empty()) {
        return Err(refuse(format!("pod {name} has non-empty .spec.schedulingGates")));
    }
    let mut pod = existing.clone();
    pod["spec"]["nodeName"] = Value::String(node);
    if let Some(annotations) = binding.pointer("/metadata/annotations").and_then(Value::as_object) {
        let target = pod["metadata"]
            .as_object_mut()
            .ok_or_else(|| ApiError::internal("stored pod has no metadata"))?
            .entry("annotations")
            .or_insert_with(|| json!({}));
        if !target.is_object() {
            *target = json!({});
        }
        for (k, v) in annotations {
            target[k] = v.clone();
        }
    }
    set_pod_scheduled(&mut pod);
    finish_write(st, spec, &existing, pod, ctx, None, Ownership::RecordUpdate)?;
    Ok(json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}))
}

/// The `PodScheduled` condition set to True (added, or its status changed with a new transition time).
fn set_pod_scheduled(pod: &mut Value) {
    let now = meta::now_rfc3339();
    if !pod["status"].is_object() {
        pod["status"] = json!({});
    }
    if !pod["status"]["conditions"].is_array() {
        pod["status"]["conditions"] = json!([]);
    }
    if let Some(conditions) = pod["status"]["conditions"].as_array_mut() {
        match conditions.iter_mut().find(|c| c["type"] == "PodScheduled") {
            Some(c) if c["status"] == "True" => {}
            Some(c) => {
                c["status"] = json!("True");
                c["lastTransitionTime"] = json!(now);
                if let Some(o) = c.as_object_mut() {
                    o.remove("reason");
                    o.remove("message");
                }
            }
            None => conditions.push(json!({"type": "PodScheduled", "status": "True", "lastTransitionTime": now})),
        }
    }
}

/// PATCH; returns the object and the HTTP code (201 when an apply created it).
#[allow(clippy::too_many_arguments)]
pub(crate) fn patch(
    st: &mut State,
    spec: &ResourceSpec,
    ns: Option<&str>,
    name: &str,
    sub: Option<&str>,
    kind: PatchKind,
    body: &[u8],
    ctx: &WriteCtx,
) -> Result<(Value, u16), ApiError> {
    check_subresource(spec, sub, name)?;
    if kind == PatchKind::Apply {
        return apply(st, spec, ns, name, sub, body, ctx);
    }
    let existing =
        st.get(&spec.group_resource(), ns, name).cloned().ok_or_else(|| ApiError::not_found(obj_ref(spec, name)))?;
    let mut patched = match kind {
        PatchKind::Merge | PatchKind::Strategic => {
            let mut p = patch::parse_object(body, "merge patch")?;
            if kind == PatchKind::Strategic {
                patch::strip_strategic_directives(&mut p);
            }
            let mut doc = existing.clone();
            patch::merge(&mut doc, &p);
            doc
        }
        PatchKind::Json | PatchKind::Apply => patch::json_patch(&existing, body)?,
    };
    if !patched.is_object() {
        return Err(ApiError::unprocessable("the patched object is not a JSON object"));
    }
    if let Some(rv) = meta::resource_version(&patched)
        && Some(rv) != meta::resource_version(&existing)
    {
        return Err(ApiError::stale(obj_ref(spec, name)));
    }
    check_type(spec, &mut patched)?;
    check_identity(spec, ns, name, &mut patched)?;
    let new = isolate_status(spec, sub, &existing, patched);
    Ok((finish_write(st, spec, &existing, new, ctx, sub, Ownership::RecordUpdate)?, 200))
}

/// Server-side apply (a merge with field ownership; see `managed`).
fn apply(
    st: &mut State,
    spec: &ResourceSpec,
    ns: Option<&str>,
    name: &str,
    sub: Option<&str>,
    body: &[u8],
    ctx: &WriteCtx,
) -> Result<(Value, u16), ApiError> {
    let Some(manager) = ctx.field_manager.as_deref().filter(|m| !m.is_empty()) else {
        return Err(ApiError::unprocessable(
            "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch",
        ));
    };
    let mut applied = patch::parse_apply(body)?;
    for field in ["apiVersion", "kind"] {
        if applied.get(field).and_then(Value::as_str).is_none_or(str::is_empty) {
            return Err(ApiError::bad_request(format!(
                "Object '{}' is missing in the apply patch",
                field_title(field)
            )));
        }
    }
    check_type(spec, &mut applied)?;
    if meta::name(&applied).is_none() {
        meta::set_meta(&mut applied, "name", meta::string(name));
    }
    check_identity(spec, ns, name, &mut applied)?;
    let api_version = spec.api_version();
    let ctx = WriteCtx { manager: manager.to_owned(), ..ctx.clone() };
    let w = writer(spec, &ctx, &api_version, sub);
    let existing = st.get(&spec.group_resource(), ns, name).cloned();
    match existing {
        None => {
            if sub.is_some() {
                return Err(ApiError::not_found(obj_ref(spec, name)));
            }
            let mut base = json!({ "apiVersion": api_version, "kind": spec.kind, "metadata": { "name": name } });
            if spec.namespaced {
                meta::set_meta(&mut base, "namespace", meta::string(ns.unwrap_or_default()));
            }
            let mut obj = managed::apply(&base, &applied, ctx.force, w)
                .map_err(|c| ApiError::apply_conflict(obj_ref(spec, name), &c))?;
            prepare_create(spec, &mut obj);
            stamp_new(st, &mut obj);
            validate_crd(spec, &obj)?;
            if is_crd(spec) {
                let status = registry::crd_status(&obj);
                meta::root_mut(&mut obj).insert("status".to_owned(), status);
            }
            if ctx.dry_run {
                return Ok((present(spec, &obj), 201));
            }
            let stored = st.commit(spec, EventType::Added, obj, None);
            crd_hook(st, spec, &stored, EventType::Added);
            Ok((present(spec, &stored), 201))
        }
        Some(existing) => {
            if let Some(rv) = meta::resource_version(&applied)
                && Some(rv) != meta::resource_version(&existing)
            {
                return Err(ApiError::stale(obj_ref(spec, name)));
            }
            let new = managed::apply(&existing, &applied, ctx.force, w)
                .map_err(|c| ApiError::apply_conflict(obj_ref(spec, name), &c))?;
            Ok((finish_write(st, spec, &existing, new, &ctx, sub, Ownership::Computed)?, 200))
        }
    }
}

fn field_title(field: &str) -> &'static str {
    if field == "kind" { "Kind" } else { "apiVersion" }
}

/// DELETE of one object.
pub(crate) fn delete(
    st: &mut State,
    spec: &ResourceSpec,
    ns: Option<&str>,
    name: &str,
    opts: &DeleteOpts,
) -> Result<Value, ApiError> {
    let existing =
        st.get(&spec.group_resource(), ns, name).cloned().ok_or_else(|| ApiError::not_found(obj_ref(spec, name)))?;
    if let Some(uid) = &opts.uid
        && Some(uid.as_str()) != meta::uid(&existing)
    {
        return Err(ApiError::conflict(
            obj_ref(spec, name),
            &format!(
                "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                meta::uid(&existing).unwrap_or_default()
            ),
        ));
    }
    if let Some(rv) = &opts.resource_version
        && Some(rv.as_str()) != meta::resource_version(&existing)
    {
        return Err(ApiError::conflict(
            obj_ref(spec, name),
            &format!(
                "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                meta::resource_version(&existing).unwrap_or_default()
            ),
        ));
    }
    if !meta::finalizers(&existing).is_empty() {
        if meta::is_deleting(&existing) {
            return Ok(present(spec, &existing));
        }
        let mut new = existing.clone();
        meta::set_meta(&mut new, "deletionTimestamp", Value::String(meta::now_rfc3339()));
        meta::set_meta(&mut new, "deletionGracePeriodSeconds", json!(opts.grace_period_seconds.unwrap_or(0)));
        if let Some(g) = meta::generation(&existing).filter(|g| *g > 0) {
            meta::set_meta(&mut new, "generation", json!(g + 1));
        }
        if opts.dry_run {
            return Ok(present(spec, &new));
        }
        let stored = st.commit(spec, EventType::Modified, new, Some(existing));
        return Ok(present(spec, &stored));
    }
    if opts.dry_run {
        return Ok(present(spec, &existing));
    }
    let stored = st.commit(spec, EventType::Deleted, existing, None);
    crd_hook(st, spec, &stored, EventType::Deleted);
    Ok(present(spec, &stored))
}

/// DELETE on a collection: deletes (or marks for deletion) every matching object.
pub(crate) fn delete_collection(
    st: &mut State,
    spec: &ResourceSpec,
    filter: &Filter,
    opts: &DeleteOpts,
) -> Result<Value, ApiError> {
    let targets: Vec<(Option<String>, String)> = st
        .list(&spec.group_resource(), filter, None)
        .into_iter()
        .map(|o| (meta::namespace(o).map(str::to_owned), meta::name(o).unwrap_or_default().to_owned()))
        .collect();
    let mut items = Vec::new();
    for (ns, name) in targets {
        items.push(delete(st, spec, ns.as_deref(), &name, opts)?);
    }
    Ok(json!({
        "kind": spec.list_kind(),
        "apiVersion": spec.api_version(),
        "metadata": { "resourceVersion": st.rv().to_string() },
        "items": items,
    }))
}

// ----- test controls -----

/// Resolves a resource name (`pods`, `leases.coordination.k8s.io`) for the control API.
pub(crate) fn resolve(st: &State, resource: &str) -> Result<ResourceSpec, FakeError> {
    st.registry.by_name(resource).cloned().ok_or_else(|| FakeError::UnknownResource(resource.to_owned()))
}

/// Stores an object as given (status included), creating or replacing it. Server-owned metadata
/// the object lacks is filled in; namespaced objects without a namespace go to `default`.
pub(crate) fn insert(st: &mut State, mut obj: Value) -> Result<Value, FakeError> {
    if !obj.is_object() {
        return Err(FakeError::InvalidObject("not a JSON object".to_owned()));
    }
    let api_version = obj.get("apiVersion").and_then(Value::as_str).unwrap_or_default().to_owned();
    let kind = obj.get("kind").and_then(Value::as_str).unwrap_or_default().to_owned();
    let spec = st
        .registry
        .by_kind(&api_version, &kind)
        .cloned()
        .ok_or_else(|| FakeError::UnknownResource(format!("{api_version} {kind}")))?;
    let ns = if spec.namespaced { Some(meta::namespace(&obj).unwrap_or("default").to_owned()) } else { None };
    match &ns {
        Some(ns) => meta::set_meta(&mut obj, "namespace", meta::string(ns.as_str())),
        None => {
            meta::remove_meta(&mut obj, "namespace");
        }
    }
    if meta::name(&obj).is_none() {
        let Some(prefix) = obj.pointer("/metadata/generateName").and_then(Value::as_str).map(str::to_owned) else {
            return Err(FakeError::InvalidObject(format!("{kind} without metadata.name")));
        };
        let suffix = st.next_suffix();
        meta::set_meta(&mut obj, "name", Value::String(format!("{prefix}{suffix}")));
    }
    let name = meta::name(&obj).unwrap_or_default().to_owned();
    let existing = st.get(&spec.group_resource(), ns.as_deref(), &name).cloned();
    let fallback_uid = st.next_uid();
    let m = meta::meta_mut(&mut obj);
    m.remove("resourceVersion");
    if m.get("uid").and_then(Value::as_str).is_none_or(str::is_empty) {
        let uid = existing.as_ref().and_then(|e| meta::uid(e)).map_or(fallback_uid, str::to_owned);
        m.insert("uid".to_owned(), Value::String(uid));
    }
    if !m.contains_key("creationTimestamp") {
        m.insert("creationTimestamp".to_owned(), Value::String(meta::now_rfc3339()));
    }
    if !m.contains_key("generation") {
        let g = existing.as_ref().and_then(meta::generation).unwrap_or(1);
        m.insert("generation".to_owned(), json!(g));
    }
    if is_crd(&spec) {
        registry::crd_resources(&obj).map_err(FakeError::InvalidObject)?;
        if obj.get("status").is_none() {
            let status = registry::crd_status(&obj);
            meta::root_mut(&mut obj).insert("status".to_owned(), status);
        }
    }
    let kind = if existing.is_some() { EventType::Modified } else { EventType::Added };
    let stored = st.commit(&spec, kind, obj, existing);
    crd_hook(st, &spec, &stored, kind);
    Ok(present(&spec, &stored))
}

/// A raw write by "someone else": runs `f` on the stored object and commits it (always bumping
/// the resourceVersion). Generation and finalizer rules apply; field ownership is not recorded.
pub(crate) fn modify(
    st: &mut State,
    spec: &ResourceSpec,
    ns: Option<&str>,
    name: &str,
    f: impl FnOnce(&mut Value),
) -> Result<Value, FakeError> {
    let ns = if spec.namespaced { ns } else { None };
    let existing = st
        .get(&spec.group_resource(), ns, name)
        .cloned()
        .ok_or_else(|| FakeError::NotFound(format!("{} {}/{name}", spec.plural, ns.unwrap_or_default())))?;
    let mut new = existing.clone();
    f(&mut new);
    if !new.is_object() {
        return Err(FakeError::InvalidObject("the closure left a non-object".to_owned()));
    }
    for key in ["name", "namespace", "uid"] {
        match existing.pointer(&format!("/metadata/{key}")) {
            Some(v) => meta::set_meta(&mut new, key, v.clone()),
            None => {
                meta::remove_meta(&mut new, key);
            }
        }
    }
    if spec_changed(spec, &existing, &new) && meta::generation(&new) == meta::generation(&existing) {
        let generation = meta::generation(&existing).unwrap_or(0) + 1;
        meta::set_meta(&mut new, "generation", json!(generation));
    }
    let kind = if meta::is_deleting(&new) && meta::finalizers(&new).is_empty() {
        EventType::Deleted
    } else {
        EventType::Modified
    };
    let prev = (kind == EventType::Modified).then_some(existing);
    let stored = st.commit(spec, kind, new, prev);
    crd_hook(st, spec, &stored, kind);
    Ok(present(spec, &stored))
}

/// Deletes an object at once, finalizers or not.
pub(crate) fn remove(st: &mut State, spec: &ResourceSpec, ns: Option<&str>, name: &str) -> Option<Value> {
    let ns = if spec.namespaced { ns } else { None };
    let existing = st.get(&spec.group_resource(), ns, name).cloned()?;
    let stored = st.commit(spec, EventType::Deleted, existing, None);
    crd_hook(st, spec, &stored, EventType::Deleted);
    Some(present(spec, &stored))
}
