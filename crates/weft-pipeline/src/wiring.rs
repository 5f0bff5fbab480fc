//! Wiring a Pipeline's vertices to the NumaNetworks its edges are bound to: validation and the
//! JSON Patch (RFC 6902) the mutating webhook answers with.
//!
//! For every vertex at either end of a bound edge, on each of its networks `N`:
//!
//! - `spec.vertices[i].resourceClaims` gets `{name: N-rct, resourceClaimTemplateName: N-rct}`
//!   ([`claim_name`]; the template the NumaNetwork controller makes in the namespace);
//! - the vertex's user container (`udf.container`, `sink.udsink.container` or
//!   `source.udsource.container`) gets `{name: N-rct}` in `resources.claims`;
//! - that container gets `VERTEX_DOMAIN` (the vertex's domains, sorted, comma-separated) and, on
//!   the from-side of `direct` edges, `VERTEX_DOMAIN_TARGETS` (the to-vertices' domains);
//! - `spec.vertices[i].metadata.annotations` gets `weft.io/vertex-domains` (a JSON array of
//!   [`VertexDomainEntry`]), which Numaflow copies to every pod of the vertex and the DNS
//!   registrar reads.
//!
//! Numaflow's pipeline controller copies a vertex's `resourceClaims`, `metadata` and user
//! container into the Vertex object, and its vertex controller copies them into each pod, so the
//! pods end up with the claims, the environment and the annotation.
//!
//! **Idempotent.** Wiring a wired pipeline yields no operations. **What weft owns.** The claim
//! entries of the networks listed in the vertex's `weft.io/vertex-domains` (removed when the
//! vertex leaves a network), the annotation itself, and the environment variables named in the
//! vertex annotation [`MANAGED_ENV_ANNOTATION`] — weft sets that list to the variables it added.
//! A `VERTEX_DOMAIN` or `VERTEX_DOMAIN_TARGETS` the user set is never replaced: if its value
//! differs from weft's, weft leaves it and returns a warning.
//!
//! **Templates.** Numaflow merges `spec.templates.vertex.resourceClaims` into a vertex only when
//! the vertex has none of its own; a vertex weft gives a claim would lose the template's. So when
//! the vertex has none, weft copies the template's entries into the vertex first.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use json_patch::PatchOperation;
use json_patch::jsonptr::PointerBuf;
use serde_json::{Map, Value, json};

use crate::domain::{
    DEFAULT_ZONE, DomainError, VERTEX_DOMAIN_ENV, VERTEX_DOMAIN_TARGETS_ENV, VERTEX_DOMAINS_ANNOTATION,
    VertexDomainEntry, check_zone, domain_label_problem, label_problem, vertex_domain,
};
use crate::edges::{self, ConnectionType, EdgeBinding};
use crate::problem::{Collector, Problems};

/// Suffix of a NumaNetwork's ResourceClaimTemplate and of the claim entry that uses it.
pub const CLAIM_SUFFIX: &str = "-rct";

/// Vertex annotation listing the environment variables weft set on the vertex's user container,
/// comma-separated (`VERTEX_DOMAIN,VERTEX_DOMAIN_TARGETS`). weft replaces or removes only these.
pub const MANAGED_ENV_ANNOTATION: &str = "weft.io/managed-env";

/// The claim entry (and ResourceClaimTemplate) name of the NumaNetwork `network`: `<network>-rct`,
/// the same as `weft_crds::resource_claim_template_name`.
pub fn claim_name(network: &str) -> String {
    format!("{network}{CLAIM_SUFFIX}")
}

/// Where a vertex's user container is, by vertex kind, as a JSON pointer below the vertex and as
/// the path shown in messages.
const USER_CONTAINERS: [(&str, &str); 3] = [
    ("/udf/container", "udf.container"),
    ("/sink/udsink/container", "sink.udsink.container"),
    ("/source/udsource/container", "source.udsource.container"),
];

/// The vertex's user container: its pointer below the vertex and its display path.
pub fn user_container(vertex: &Value) -> Option<(&'static str, &'static str)> {
    USER_CONTAINERS.into_iter().find(|(pointer, _)| vertex.pointer(pointer).is_some_and(Value::is_object))
}

/// How to wire.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WiringOptions {
    /// The zone vertex domains end in ([`DEFAULT_ZONE`] by default).
    pub zone: String,
}

impl Default for WiringOptions {
    fn default() -> Self {
        WiringOptions { zone: DEFAULT_ZONE.to_owned() }
    }
}

/// What one vertex gets.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VertexWiring {
    /// Index in `spec.vertices`.
    pub index: usize,
    /// The vertex's name.
    pub name: String,
    /// Its domains, one per network, sorted by domain.
    pub domains: Vec<VertexDomainEntry>,
    /// The domains it sends to over `direct` edges, sorted.
    pub targets: Vec<String>,
    /// Its user container's path below the vertex (`udf.container`), if it has one.
    pub container: Option<&'static str>,
}

impl VertexWiring {
    /// `VERTEX_DOMAIN`'s value.
    pub fn domain_env(&self) -> String {
        self.domains.iter().map(|e| e.domain.as_str()).collect::<Vec<_>>().join(",")
    }

    /// `VERTEX_DOMAIN_TARGETS`'s value (`None` when the vertex sends over no `direct` edge).
    pub fn targets_env(&self) -> Option<String> {
        (!self.targets.is_empty()).then(|| self.targets.join(","))
    }
}

/// The outcome of wiring a valid Pipeline.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Wiring {
    /// The JSON Patch to apply to the Pipeline (empty when it is already wired).
    pub ops: Vec<PatchOperation>,
    /// Things the user should know, e.g. an environment variable the user set and weft left.
    pub warnings: Vec<String>,
    /// The edge bindings read.
    pub bindings: Vec<EdgeBinding>,
    /// Every vertex on a NumaNetwork, in `spec.vertices` order.
    pub vertices: Vec<VertexWiring>,
}

/// What a vertex should have: its domain entries (empty: none, unwire it) and direct targets.
#[derive(Default)]
struct Desired {
    networks: BTreeSet<String>,
    targets: BTreeSet<(String, String)>,
    entries: Vec<VertexDomainEntry>,
    target_domains: Vec<String>,
}

fn str_at<'a>(v: &'a Value, pointer: &str) -> Option<&'a str> {
    v.pointer(pointer).and_then(Value::as_str).filter(|s| !s.is_empty())
}

/// Validates `pipeline` (a `numaflow.numaproj.io/v1alpha1` Pipeline as JSON) and computes the JSON
/// Patch wiring its vertices to the NumaNetworks its edges are bound to. `namespace` is the
/// request's namespace (the object's own is used when it is `None`); `network_exists` says
/// whether a NumaNetwork of that name exists.
///
/// Returns every problem at once, each naming its field. A Pipeline that binds no edge and that
/// weft never wired is left alone, whatever else it holds.
pub fn wire(
    pipeline: &Value,
    namespace: Option<&str>,
    opts: &WiringOptions,
    network_exists: &dyn Fn(&str) -> bool,
) -> Result<Wiring, Problems> {
    let mut problems = Collector::default();
    let bindings = edges::collect(pipeline, &mut problems);
    let vertices_value = pipeline.pointer("/spec/vertices");
    let vertices: &[Value] = match vertices_value {
        Some(Value::Array(a)) => a,
        _ => &[],
    };
    let wired_before: Vec<usize> = vertices
        .iter()
        .enumerate()
        .filter(|(_, v)| v.pointer("/metadata/annotations").and_then(|a| a.get(VERTEX_DOMAINS_ANNOTATION)).is_some())
        .map(|(i, _)| i)
        .collect();
    if bindings.is_empty() && problems.is_empty() && wired_before.is_empty() {
        return Ok(Wiring::default());
    }

    let mut index: HashMap<&str, usize> = HashMap::new();
    for (i, v) in vertices.iter().enumerate() {
        if let Some(name) = v.get("name").and_then(Value::as_str) {
            index.entry(name).or_insert(i);
        }
    }

    // The names every domain is made of.
    let pipeline_name = str_at(pipeline, "/metadata/name");
    let namespace = namespace.filter(|n| !n.is_empty()).or_else(|| str_at(pipeline, "/metadata/namespace"));
    let mut can_form = true;
    if !bindings.is_empty() {
        if !matches!(vertices_value, Some(Value::Array(_))) {
            problems.push("spec.vertices", "missing or not a list; the bound edges' vertices must be in it");
        }
        match pipeline_name {
            None => {
                can_form = false;
                problems.push(
                    "metadata.name",
                    "missing; vertex domains contain the pipeline's name, so a Pipeline on a NumaNetwork cannot use generateName",
                );
            }
            Some(n) => {
                if let Some(why) = domain_label_problem(n) {
                    can_form = false;
                    problems.push("metadata.name", format!("'{n}' cannot be a DNS label of the vertex domains: {why}"));
                }
            }
        }
        match namespace {
            None => {
                can_form = false;
                problems.push("metadata.namespace", "missing; vertex domains contain the pipeline's namespace");
            }
            Some(n) => {
                if let Some(why) = domain_label_problem(n) {
                    can_form = false;
                    problems.push(
                        "metadata.namespace",
                        format!("'{n}' cannot be a DNS label of the vertex domains: {why}"),
                    );
                }
            }
        }
        if let Err(e) = check_zone(&opts.zone) {
            can_form = false;
            problems.push("(webhook configuration)", e.to_string());
        }
    }

    // Each network once, named where it is first bound.
    let mut usable: HashSet<&str> = HashSet::new();
    let mut seen: HashSet<&str> = HashSet::new();
    for b in &bindings {
        if !seen.insert(&b.network) {
            continue;
        }
        let path = b.origin().network_path();
        let n = b.network.as_str();
        let mut ok = true;
        if let Some(why) = domain_label_problem(n) {
            ok = false;
            problems.push(&path, format!("NumaNetwork '{n}' cannot be a DNS label of the vertex domains: {why}"));
        } else {
            let claim = claim_name(n);
            if let Some(why) = label_problem(&claim) {
                ok = false;
                problems.push(
                    &path,
                    format!(
                        "the claim entry '{claim}' of NumaNetwork '{n}' must be a DNS label: {why}; use a NumaNetwork name of at most {} characters",
                        crate::domain::MAX_LABEL_LEN - CLAIM_SUFFIX.len()
                    ),
                );
            }
        }
        if !network_exists(n) {
            ok = false;
            problems
                .push(&path, format!("NumaNetwork '{n}' does not exist; create it first (kubectl get numanetworks)"));
        }
        if ok {
            usable.insert(n);
        }
    }

    // What each vertex is on.
    let mut desired: BTreeMap<usize, Desired> = BTreeMap::new();
    for b in &bindings {
        let origin = b.origin();
        let from = index.get(b.from.as_str()).copied();
        let to = index.get(b.to.as_str()).copied();
        if from.is_none() {
            problems.push(origin.from_path(), format!("vertex '{}' is not in spec.vertices", b.from));
        }
        if to.is_none() {
            problems.push(origin.to_path(), format!("vertex '{}' is not in spec.vertices", b.to));
        }
        let (Some(from), Some(to)) = (from, to) else { continue };
        if b.connection == ConnectionType::Direct {
            for (i, name) in [(from, &b.from), (to, &b.to)] {
                if user_container(&vertices[i]).is_none() {
                    problems.push(
                        origin.type_path(),
                        format!(
                            "direct edges run between user containers, and vertex '{name}' has none (no udf.container, \
                             sink.udsink.container or source.udsource.container); use multi-isbsvc or give it one"
                        ),
                    );
                }
            }
        }
        if !usable.contains(b.network.as_str()) {
            continue;
        }
        desired.entry(from).or_default().networks.insert(b.network.clone());
        desired.entry(to).or_default().networks.insert(b.network.clone());
        if b.connection == ConnectionType::Direct {
            desired.entry(from).or_default().targets.insert((b.to.clone(), b.network.clone()));
        }
    }

    // The domains: problems here are the vertex's (the pipeline's and namespace's were above).
    let mut formed: HashSet<usize> = HashSet::new();
    if can_form && let (Some(p), Some(ns)) = (pipeline_name, namespace) {
        for (&i, d) in desired.iter_mut() {
            let name = vertices[i].get("name").and_then(Value::as_str).unwrap_or_default();
            let mut ok = true;
            for n in &d.networks {
                match vertex_domain(name, n, p, ns, &opts.zone) {
                    Ok(domain) => {
                        d.entries.push(VertexDomainEntry { network: n.clone(), domain, claim: claim_name(n) })
                    }
                    Err(e @ DomainError::TooLong { .. }) => {
                        ok = false;
                        problems.push(format!("spec.vertices[{i}]"), e.to_string());
                    }
                    Err(e) => {
                        ok = false;
                        problems.push(format!("spec.vertices[{i}].name"), e.to_string());
                    }
                }
            }
            // A target's own problems are reported at its vertex.
            d.target_domains =
                d.targets.iter().filter_map(|(to, n)| vertex_domain(to, n, p, ns, &opts.zone).ok()).collect();
            d.target_domains.sort_unstable();
            d.target_domains.dedup();
            d.entries.sort_by(|a, b| a.domain.cmp(&b.domain));
            if ok {
                formed.insert(i);
            }
        }
    }

    let template_claims: &[Value] = match pipeline.pointer("/spec/templates/vertex/resourceClaims") {
        Some(Value::Array(a)) => a,
        _ => &[],
    };
    let none = Desired::default();
    let mut wiring = Wiring::default();
    let mut todo: BTreeSet<usize> = formed.iter().copied().collect();
    // Vertices weft wired before and that are on no network now are unwired.
    todo.extend(wired_before.iter().copied().filter(|i| !desired.contains_key(i)));
    for i in todo {
        let d = desired.get(&i).unwrap_or(&none);
        let mut vertex = vertices[i].clone();
        wire_vertex(&mut vertex, i, d, template_claims, &mut problems, &mut wiring.warnings);
        let prefix = PointerBuf::from_tokens(["spec", "vertices", &i.to_string()]);
        wiring.ops.extend(json_patch::diff(&vertices[i], &vertex).0.into_iter().map(|op| prefixed(op, &prefix)));
        if !d.entries.is_empty() {
            wiring.vertices.push(VertexWiring {
                index: i,
                name: vertices[i].get("name").and_then(Value::as_str).unwrap_or_default().to_owned(),
                domains: d.entries.clone(),
                targets: d.target_domains.clone(),
                container: user_container(&vertices[i]).map(|(_, path)| path),
            });
        }
    }
    if !problems.is_empty() {
        return Err(Problems(problems.0));
    }
    wiring.bindings = bindings;
    Ok(wiring)
}

/// Validates `pipeline` as [`wire`] does: the warnings when it is valid.
pub fn validate(
    pipeline: &Value,
    namespace: Option<&str>,
    opts: &WiringOptions,
    network_exists: &dyn Fn(&str) -> bool,
) -> Result<Vec<String>, Problems> {
    wire(pipeline, namespace, opts, network_exists).map(|w| w.warnings)
}

fn prefixed(op: PatchOperation, prefix: &PointerBuf) -> PatchOperation {
    match op {
        PatchOperation::Add(mut o) => {
            o.path = prefix.concat(&o.path);
            PatchOperation::Add(o)
        }
        PatchOperation::Remove(mut o) => {
            o.path = prefix.concat(&o.path);
            PatchOperation::Remove(o)
        }
        PatchOperation::Replace(mut o) => {
            o.path = prefix.concat(&o.path);
            PatchOperation::Replace(o)
        }
        PatchOperation::Move(mut o) => {
            o.path = prefix.concat(&o.path);
            o.from = prefix.concat(&o.from);
            PatchOperation::Move(o)
        }
        PatchOperation::Copy(mut o) => {
            o.path = prefix.concat(&o.path);
            o.from = prefix.concat(&o.from);
            PatchOperation::Copy(o)
        }
        PatchOperation::Test(mut o) => {
            o.path = prefix.concat(&o.path);
            PatchOperation::Test(o)
        }
    }
}

fn name_of(v: &Value) -> Option<&str> {
    v.get("name").and_then(Value::as_str)
}

/// What a claim entry refers to, in words.
fn claim_source(entry: &Value) -> String {
    if let Some(t) = entry.get("resourceClaimTemplateName").and_then(Value::as_str) {
        format!("ResourceClaimTemplate '{t}'")
    } else if let Some(c) = entry.get("resourceClaimName").and_then(Value::as_str) {
        format!("ResourceClaim '{c}'")
    } else {
        "no claim".to_owned()
    }
}

/// A list field of `obj`: `Ok(None)` when absent or null, an error message when not a list.
fn list<'a>(obj: &'a Map<String, Value>, key: &str) -> Result<Option<&'a Vec<Value>>, String> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(a)) => Ok(Some(a)),
        Some(_) => Err("is not a list".to_owned()),
    }
}

/// Sets `obj[key]` to `new` if it differs from what is there, removing the key when `new` is
/// empty and weft changed it.
fn put_list(obj: &mut Map<String, Value>, key: &str, old: Option<&Vec<Value>>, new: Vec<Value>) {
    if old.map(Vec::as_slice).unwrap_or_default() == new.as_slice() {
        return;
    }
    if new.is_empty() {
        obj.remove(key);
    } else {
        obj.insert(key.to_owned(), Value::Array(new));
    }
}

/// Wires one vertex (a copy) to what `d` says; `d` without entries unwires it.
fn wire_vertex(
    vertex: &mut Value,
    i: usize,
    d: &Desired,
    template_claims: &[Value],
    problems: &mut Collector,
    warnings: &mut Vec<String>,
) {
    let at = format!("spec.vertices[{i}]");
    let container = user_container(vertex);
    let Some(obj) = vertex.as_object_mut() else {
        problems.push(at, "is not an object");
        return;
    };

    // What weft recorded last time.
    let annotations = match obj.get("metadata") {
        None | Some(Value::Null) => None,
        Some(Value::Object(m)) => match m.get("annotations") {
            None | Some(Value::Null) => None,
            Some(Value::Object(a)) => Some(a.clone()),
            Some(_) => {
                problems.push(format!("{at}.metadata.annotations"), "is not a map of strings");
                return;
            }
        },
        Some(_) => {
            problems.push(format!("{at}.metadata"), "is not an object");
            return;
        }
    };
    let annotation = |key: &str| annotations.as_ref().and_then(|a| a.get(key)).and_then(Value::as_str);
    let before: Vec<VertexDomainEntry> =
        annotation(VERTEX_DOMAINS_ANNOTATION).and_then(|t| serde_json::from_str(t).ok()).unwrap_or_default();
    let mut managed: BTreeSet<String> = annotation(MANAGED_ENV_ANNOTATION)
        .map(|t| t.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_owned).collect())
        .unwrap_or_default();
    let wanted: Vec<(&str, &str)> = d.entries.iter().map(|e| (e.network.as_str(), e.claim.as_str())).collect();
    let stale: HashSet<&str> =
        before.iter().map(|e| e.claim.as_str()).filter(|c| !wanted.iter().any(|(_, w)| w == c)).collect();

    // Pod-level claims.
    match list(obj, "resourceClaims") {
        Err(why) => problems.push(format!("{at}.resourceClaims"), why),
        Ok(old) => {
            let (mut claims, source_path) = match old {
                Some(c) if !c.is_empty() => (c.clone(), format!("{at}.resourceClaims")),
                _ if !wanted.is_empty() && !template_claims.is_empty() => {
                    (template_claims.to_vec(), "spec.templates.vertex.resourceClaims".to_owned())
                }
                _ => (Vec::new(), format!("{at}.resourceClaims")),
            };
            for (k, c) in claims.iter().enumerate() {
                if let Some((network, claim)) = wanted.iter().find(|(_, w)| name_of(c) == Some(w))
                    && c.get("resourceClaimTemplateName").and_then(Value::as_str) != Some(claim)
                {
                    problems.push(
                        format!("{source_path}[{k}]"),
                        format!(
                            "the entry '{claim}' refers to {}, but weft needs that entry for NumaNetwork '{network}' \
                             (ResourceClaimTemplate '{claim}'); rename the entry",
                            claim_source(c)
                        ),
                    );
                }
            }
            claims.retain(|c| {
                !(name_of(c).is_some_and(|n| stale.contains(n))
                    && c.get("resourceClaimTemplateName").and_then(Value::as_str) == name_of(c))
            });
            for (_, claim) in &wanted {
                if !claims.iter().any(|c| name_of(c) == Some(claim)) {
                    claims.push(json!({"name": claim, "resourceClaimTemplateName": claim}));
                }
            }
            let old = old.cloned();
            put_list(obj, "resourceClaims", old.as_ref(), claims);
        }
    }

    // The user container: its claims and environment.
    if let Some((pointer, path)) = container
        && let Some(Value::Object(c)) = vertex_container(obj, pointer)
    {
        let cpath = format!("{at}.{path}");
        wire_container(c, &cpath, &wanted, &stale, d, &mut managed, problems, warnings);
    }

    // The annotations.
    let domains = (!d.entries.is_empty()).then(|| serde_json::to_string(&d.entries).unwrap_or_default());
    let managed_text = (!managed.is_empty()).then(|| managed.iter().cloned().collect::<Vec<_>>().join(","));
    let mut new_annotations = annotations.clone().unwrap_or_default();
    for (key, value) in [(VERTEX_DOMAINS_ANNOTATION, domains), (MANAGED_ENV_ANNOTATION, managed_text)] {
        match value {
            Some(v) => {
                new_annotations.insert(key.to_owned(), Value::String(v));
            }
            None => {
                new_annotations.remove(key);
            }
        }
    }
    if annotations.as_ref().unwrap_or(&Map::new()) != &new_annotations {
        let metadata = obj.entry("metadata").or_insert_with(|| Value::Object(Map::new()));
        if !metadata.is_object() {
            // null (anything else was refused above)
            *metadata = Value::Object(Map::new());
        }
        if let Value::Object(m) = metadata {
            if new_annotations.is_empty() {
                m.remove("annotations");
            } else {
                m.insert("annotations".to_owned(), Value::Object(new_annotations));
            }
            if m.is_empty() {
                obj.remove("metadata");
            }
        }
    }
}

/// The container object at `pointer` (e.g. `/udf/container`) below the vertex object.
fn vertex_container<'a>(obj: &'a mut Map<String, Value>, pointer: &str) -> Option<&'a mut Value> {
    let mut parts = pointer.trim_start_matches('/').split('/');
    let first = parts.next()?;
    let mut at = obj.get_mut(first)?;
    for p in parts {
        at = at.get_mut(p)?;
    }
    Some(at)
}

/// Edits the list `obj[key]` in place with `f`, which says whether it changed anything: the key is
/// created when `f` adds to an absent list and removed when `f` empties it.
fn edit_list(obj: &mut Map<String, Value>, key: &str, f: impl FnOnce(&mut Vec<Value>) -> bool) -> Result<bool, String> {
    let (mut items, was_list) = match obj.get_mut(key) {
        None | Some(Value::Null) => (Vec::new(), false),
        Some(Value::Array(a)) => (std::mem::take(a), true),
        Some(_) => return Err("is not a list".to_owned()),
    };
    let changed = f(&mut items);
    if changed && items.is_empty() {
        obj.remove(key);
    } else if changed || was_list {
        obj.insert(key.to_owned(), Value::Array(items));
    }
    Ok(changed)
}

/// The claims of a container's `resources`: stale ones out, wanted ones in.
fn edit_claims(
    resources: &mut Map<String, Value>,
    wanted: &[(&str, &str)],
    stale: &HashSet<&str>,
) -> Result<bool, String> {
    edit_list(resources, "claims", |claims| {
        let before = claims.len();
        claims.retain(|x| !name_of(x).is_some_and(|n| stale.contains(n)));
        let mut changed = claims.len() != before;
        for (_, claim) in wanted {
            if !claims.iter().any(|x| name_of(x) == Some(claim)) {
                claims.push(json!({"name": claim}));
                changed = true;
            }
        }
        changed
    })
}

#[allow(clippy::too_many_arguments)]
fn wire_container(
    c: &mut Map<String, Value>,
    cpath: &str,
    wanted: &[(&str, &str)],
    stale: &HashSet<&str>,
    d: &Desired,
    managed: &mut BTreeSet<String>,
    problems: &mut Collector,
    warnings: &mut Vec<String>,
) {
    // resources.claims
    let claims_path = format!("{cpath}.resources.claims");
    match c.get_mut("resources") {
        Some(Value::Object(r)) => match edit_claims(r, wanted, stale) {
            Err(why) => problems.push(claims_path, why),
            Ok(changed) => {
                if changed && r.is_empty() {
                    c.remove("resources");
                }
            }
        },
        None | Some(Value::Null) => {
            let mut r = Map::new();
            if let Ok(true) = edit_claims(&mut r, wanted, stale) {
                c.insert("resources".to_owned(), Value::Object(r));
            }
        }
        Some(_) => problems.push(format!("{cpath}.resources"), "is not an object"),
    }

    // env
    let domain_env =
        (!d.entries.is_empty()).then(|| d.entries.iter().map(|e| e.domain.as_str()).collect::<Vec<_>>().join(","));
    let targets_env = (!d.entries.is_empty() && !d.target_domains.is_empty()).then(|| d.target_domains.join(","));
    let edited = edit_list(c, "env", |env| {
        let mut changed = false;
        for (name, value, what) in [
            (VERTEX_DOMAIN_ENV, domain_env, "this vertex's domains"),
            (VERTEX_DOMAIN_TARGETS_ENV, targets_env, "the domains of the vertices it sends to over direct edges"),
        ] {
            let owned = managed.contains(name);
            let at = env.iter().position(|e| name_of(e) == Some(name));
            match (at, value) {
                (None, Some(v)) => {
                    env.push(json!({"name": name, "value": v}));
                    managed.insert(name.to_owned());
                    changed = true;
                }
                (Some(k), Some(v)) => {
                    let current = &env[k];
                    let same = current.get("value").and_then(Value::as_str) == Some(v.as_str())
                        && current.get("valueFrom").is_none();
                    if owned {
                        let entry = json!({"name": name, "value": v});
                        if *current != entry {
                            env[k] = entry;
                            changed = true;
                        }
                    } else if !same {
                        let shown = match current.get("value").and_then(Value::as_str) {
                            Some(s) => format!("'{s}'"),
                            None => "from a reference (valueFrom)".to_owned(),
                        };
                        warnings.push(format!(
                            "{cpath}.env[{k}]: {name} is set by the user to {shown}; weft leaves it and does not set \
                             '{v}' ({what}); remove it to let weft set it"
                        ));
                    }
                }
                (Some(k), None) => {
                    if owned {
                        env.remove(k);
                        managed.remove(name);
                        changed = true;
                    }
                }
                (None, None) => {
                    managed.remove(name);
                }
            }
        }
        changed
    });
    if let Err(why) = edited {
        problems.push(format!("{cpath}.env"), why);
    }
}

#[cfg(test)]
mod tests;
