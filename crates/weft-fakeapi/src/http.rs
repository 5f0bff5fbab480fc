//! The HTTP front: routing, query parsing, verb mapping, fault injection, request logging.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use serde_json::{Value, json};

use crate::controls::{RecordedRequest, Verb};
use crate::discovery;
use crate::error::ApiError;
use crate::ops::{self, DeleteOpts, WriteCtx};
use crate::patch::{self, PatchKind};
use crate::registry::{Registry, ResourceSpec};
use crate::selectors::{FieldSelector, Filter, LabelSelector};
use crate::server::{BoxBody, Shared};
use crate::watch::{self, WatchRequest, WatchStart};

/// A parsed resource path.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ResourcePath {
    group: String,
    version: String,
    plural: String,
    namespace: Option<String>,
    name: Option<String>,
    subresource: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Route {
    Version,
    CoreVersions,
    Groups,
    Group(String),
    GroupResources(String, String),
    Resource(ResourcePath),
}

fn parse_path(path: &str, reg: &Registry) -> Option<Route> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').filter(|s| !s.is_empty()).collect();
    match segs.as_slice() {
        ["version"] => Some(Route::Version),
        ["api"] => Some(Route::CoreVersions),
        ["api", v] => Some(Route::GroupResources(String::new(), (*v).to_owned())),
        ["api", v, rest @ ..] => resource_path("", v, rest, reg),
        ["apis"] => Some(Route::Groups),
        ["apis", g] => Some(Route::Group((*g).to_owned())),
        ["apis", g, v] => Some(Route::GroupResources((*g).to_owned(), (*v).to_owned())),
        ["apis", g, v, rest @ ..] => resource_path(g, v, rest, reg),
        _ => None,
    }
}

fn resource_path(group: &str, version: &str, rest: &[&str], reg: &Registry) -> Option<Route> {
    let owned = |s: Option<&&str>| s.map(|x| (*x).to_owned());
    if let ["namespaces", ns, plural, tail @ ..] = rest
        && tail.len() <= 2
        && reg.lookup(group, version, plural).is_some_and(|s| s.namespaced)
    {
        return Some(Route::Resource(ResourcePath {
            group: group.to_owned(),
            version: version.to_owned(),
            plural: (*plural).to_owned(),
            namespace: Some((*ns).to_owned()),
            name: owned(tail.first()),
            subresource: owned(tail.get(1)),
        }));
    }
    match rest {
        [plural, tail @ ..] if tail.len() <= 2 => Some(Route::Resource(ResourcePath {
            group: group.to_owned(),
            version: version.to_owned(),
            plural: (*plural).to_owned(),
            namespace: None,
            name: owned(tail.first()),
            subresource: owned(tail.get(1)),
        })),
        _ => None,
    }
}

/// Query parameters (first occurrence wins).
struct Query(Vec<(String, String)>);

impl Query {
    fn parse(q: Option<&str>) -> Self {
        Self(form_urlencoded::parse(q.unwrap_or_default().as_bytes()).into_owned().collect())
    }

    fn get(&self, key: &str) -> Option<&str> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    fn flag(&self, key: &str) -> bool {
        matches!(self.get(key), Some("true" | "1"))
    }

    fn number<T: std::str::FromStr>(&self, key: &str) -> Result<Option<T>, ApiError> {
        match self.get(key).filter(|v| !v.is_empty()) {
            None => Ok(None),
            Some(v) => v.parse().map(Some).map_err(|_| ApiError::bad_request(format!("invalid {key}: {v:?}"))),
        }
    }
}

/// A reply body: JSON with a status code, or a watch stream.
enum Reply {
    Json(u16, Value),
    Stream(BoxBody),
    Raw(u16, Bytes),
}

fn full(bytes: Bytes) -> BoxBody {
    Full::new(bytes).map_err(|never| match never {}).boxed()
}

fn respond(reply: Reply) -> Response<BoxBody> {
    let (code, body) = match reply {
        Reply::Json(code, v) => (code, full(Bytes::from(v.to_string()))),
        Reply::Raw(code, bytes) => (code, full(bytes)),
        Reply::Stream(body) => (200, body),
    };
    let mut resp = Response::new(body);
    *resp.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

fn error_reply(e: &ApiError) -> Reply {
    Reply::Json(e.code, e.to_status())
}

/// `PartialObjectMetadata` view of an object (for `Accept: …;as=PartialObjectMetadata…`).
pub(crate) fn partial_metadata(obj: &Value) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": obj.get("metadata").cloned().unwrap_or_else(|| json!({})),
    })
}

fn partial_list(list: Value) -> Value {
    let items: Vec<Value> = list
        .get("items")
        .and_then(Value::as_array)
        .map(|a| a.iter().map(partial_metadata).collect())
        .unwrap_or_default();
    json!({
        "kind": "PartialObjectMetadataList",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": list.get("metadata").cloned().unwrap_or_else(|| json!({})),
        "items": items,
    })
}

/// The hyper service function.
pub(crate) async fn serve(shared: Arc<Shared>, req: Request<Incoming>) -> Result<Response<BoxBody>, Infallible> {
    let (parts, body) = req.into_parts();
    let body = match body.collect().await {
        Ok(c) => c.to_bytes(),
        Err(e) => {
            return Ok(respond(error_reply(&ApiError::bad_request(format!("cannot read the request body: {e}")))));
        }
    };
    let header_str =
        |name: header::HeaderName| parts.headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let ctx = RequestCtx {
        method: parts.method.clone(),
        query: Query::parse(parts.uri.query()),
        user_agent: header_str(header::USER_AGENT),
        content_type: header_str(header::CONTENT_TYPE).unwrap_or_default(),
        metadata_only: header_str(header::ACCEPT).is_some_and(|a| a.contains("as=PartialObjectMetadata")),
        body,
    };
    let route = parse_path(parts.uri.path(), &shared.lock().registry);
    let reply = match route {
        None => error_reply(&ApiError::no_route()),
        Some(Route::Resource(path)) => resource(&shared, path, ctx),
        Some(other) => discovery_reply(&shared, &other, &ctx.method),
    };
    Ok(respond(reply))
}

fn discovery_reply(shared: &Shared, route: &Route, method: &Method) -> Reply {
    if method != Method::GET {
        return error_reply(&ApiError::method_not_allowed(format!("{method} is not allowed on discovery endpoints")));
    }
    let st = shared.lock();
    let doc = match route {
        Route::Version => Some(discovery::version()),
        Route::CoreVersions => Some(discovery::core_versions(&shared.address)),
        Route::Groups => Some(discovery::groups(&st.registry)),
        Route::Group(g) => discovery::group(&st.registry, g),
        Route::GroupResources(g, v) => discovery::resources(&st.registry, g, v),
        Route::Resource(_) => None,
    };
    match doc {
        Some(d) => Reply::Json(200, d),
        None => error_reply(&ApiError::no_route()),
    }
}

struct RequestCtx {
    method: Method,
    query: Query,
    user_agent: Option<String>,
    content_type: String,
    metadata_only: bool,
    body: Bytes,
}

fn verb_of(method: &Method, path: &ResourcePath, query: &Query) -> Result<Verb, ApiError> {
    let named = path.name.is_some();
    match *method {
        Method::GET if query.flag("watch") => Ok(Verb::Watch),
        Method::GET => Ok(if named { Verb::Get } else { Verb::List }),
        Method::POST => Ok(Verb::Create),
        Method::PUT => Ok(Verb::Update),
        Method::PATCH => Ok(Verb::Patch),
        Method::DELETE => Ok(if named { Verb::Delete } else { Verb::DeleteCollection }),
        ref other => Err(ApiError::method_not_allowed(format!("method {other} is not supported"))),
    }
}

fn resource(shared: &Arc<Shared>, path: ResourcePath, ctx: RequestCtx) -> Reply {
    let verb = match verb_of(&ctx.method, &path, &ctx.query) {
        Ok(v) => v,
        Err(e) => return error_reply(&e),
    };
    let record = RecordedRequest {
        verb,
        group: path.group.clone(),
        version: path.version.clone(),
        resource: path.plural.clone(),
        subresource: path.subresource.clone(),
        namespace: path.namespace.clone(),
        name: path.name.clone(),
        user_agent: ctx.user_agent.clone(),
        field_manager: ctx.query.get("fieldManager").map(str::to_owned),
        code: 0,
    };
    // Logged before dispatch: an object stored by this request wakes waiters, and they must find
    // the request that stored it in the log. The code is filled in once answered.
    let slot = shared.write(|st| {
        st.requests.push(record.clone());
        (st.requests_epoch, st.requests.len() - 1)
    });
    let reply = shared.write(|st| {
        let injected = st.faults.iter_mut().find(|f| f.remaining > 0 && f.matcher.matches(&record)).map(|f| {
            f.remaining -= 1;
            f.code
        });
        st.faults.retain(|f| f.remaining > 0);
        injected.map(|code| error_reply(&ApiError::injected(code, verb.as_str(), &record.rbac_resource())))
    });
    let reply = match reply {
        Some(r) => r,
        None => dispatch(shared, &path, verb, &ctx).unwrap_or_else(|e| error_reply(&e)),
    };
    let code = match &reply {
        Reply::Json(code, _) | Reply::Raw(code, _) => *code,
        Reply::Stream(_) => 200,
    };
    shared.write(|st| {
        if st.requests_epoch == slot.0
            && let Some(entry) = st.requests.get_mut(slot.1)
        {
            entry.code = code;
        }
    });
    reply
}

fn filter_for(spec: &ResourceSpec, path: &ResourcePath, query: &Query) -> Result<Filter, ApiError> {
    let labels = LabelSelector::parse(query.get("labelSelector").unwrap_or_default())
        .map_err(|e| ApiError::bad_request(format!("unable to parse requirement: {e}")))?;
    let mut fields = query.get("fieldSelector").unwrap_or_default().to_owned();
    if let Some(name) = &path.name {
        // The legacy single-object watch: GET …/{name}?watch=true.
        fields =
            if fields.is_empty() { format!("metadata.name={name}") } else { format!("{fields},metadata.name={name}") };
    }
    let fields =
        FieldSelector::parse(&fields).map_err(|e| ApiError::bad_request(format!("invalid field selector: {e}")))?;
    Ok(Filter { namespace: if spec.namespaced { path.namespace.clone() } else { None }, labels, fields })
}

fn write_ctx(ctx: &RequestCtx) -> Result<WriteCtx, ApiError> {
    let field_manager = ctx.query.get("fieldManager").filter(|m| !m.is_empty()).map(str::to_owned);
    if field_manager.as_ref().is_some_and(|m| m.len() > 128) {
        return Err(ApiError::unprocessable("fieldManager: Too long: may not be longer than 128"));
    }
    let manager = field_manager.clone().unwrap_or_else(|| {
        let ua = ctx.user_agent.as_deref().unwrap_or("unknown");
        ua.split('/').next().filter(|s| !s.is_empty()).unwrap_or("unknown").chars().take(128).collect()
    });
    Ok(WriteCtx {
        field_manager,
        manager,
        force: ctx.query.flag("force"),
        dry_run: ctx.query.get("dryRun") == Some("All"),
    })
}

fn dispatch(shared: &Arc<Shared>, path: &ResourcePath, verb: Verb, ctx: &RequestCtx) -> Result<Reply, ApiError> {
    let spec = shared
        .lock()
        .registry
        .lookup(&path.group, &path.version, &path.plural)
        .cloned()
        .ok_or_else(ApiError::no_route)?;
    if spec.namespaced && path.namespace.is_none() && path.name.is_some() {
        return Err(ApiError::no_route());
    }
    let ns = path.namespace.as_deref();
    let sub = path.subresource.as_deref();
    let need_name =
        || path.name.as_deref().ok_or_else(|| ApiError::method_not_allowed(format!("{verb} needs an object name")));
    let one = |v: Value| if ctx.metadata_only { partial_metadata(&v) } else { v };
    let query = &ctx.query;
    match verb {
        Verb::Get => {
            let name = need_name()?;
            let obj = ops::get(&shared.lock(), &spec, ns, name)?;
            if let Some(s) = sub
                && !(s == "status" && spec.status_subresource)
            {
                return Err(ApiError::no_route());
            }
            Ok(Reply::Json(200, one(obj)))
        }
        Verb::List => {
            let filter = filter_for(&spec, path, query)?;
            let limit = query.number::<usize>("limit")?;
            let list = ops::list(&shared.lock(), &spec, &filter, limit, query.get("continue"))?;
            Ok(Reply::Json(200, if ctx.metadata_only { partial_list(list) } else { list }))
        }
        Verb::Watch => watch_reply(shared, spec, path, ctx),
        Verb::Create if spec.group.is_empty() && spec.plural == "pods" && sub == Some("binding") => {
            let name = need_name()?;
            let body = patch::parse_object(&ctx.body, "request body")?;
            let w = write_ctx(ctx)?;
            let status = shared.write(|st| ops::bind_pod(st, &spec, ns, name, body, &w))?;
            Ok(Reply::Json(201, status))
        }
        Verb::Create => {
            if path.name.is_some() || sub.is_some() {
                return Err(ApiError::method_not_allowed("POST is only supported on collections"));
            }
            let body = patch::parse_object(&ctx.body, "request body")?;
            let w = write_ctx(ctx)?;
            let obj = shared.write(|st| ops::create(st, &spec, ns, body, &w))?;
            Ok(Reply::Json(201, one(obj)))
        }
        Verb::Update => {
            let name = need_name()?;
            let body = patch::parse_object(&ctx.body, "request body")?;
            let w = write_ctx(ctx)?;
            let obj = shared.write(|st| ops::update(st, &spec, ns, name, sub, body, &w))?;
            Ok(Reply::Json(200, one(obj)))
        }
        Verb::Patch => {
            let name = need_name()?;
            let kind = PatchKind::from_content_type(&ctx.content_type)
                .ok_or_else(|| ApiError::unsupported_media_type(&ctx.content_type))?;
            let w = write_ctx(ctx)?;
            let (obj, code) = shared.write(|st| ops::patch(st, &spec, ns, name, sub, kind, &ctx.body, &w))?;
            Ok(Reply::Json(code, one(obj)))
        }
        Verb::Delete => {
            let name = need_name()?;
            if sub.is_some() {
                return Err(ApiError::method_not_allowed("DELETE is not supported on subresources"));
            }
            let opts = delete_opts(ctx)?;
            let obj = shared.write(|st| ops::delete(st, &spec, ns, name, &opts))?;
            Ok(Reply::Json(200, one(obj)))
        }
        Verb::DeleteCollection => {
            if spec.namespaced && ns.is_none() {
                return Err(ApiError::method_not_allowed("deletecollection needs a namespace"));
            }
            let filter = filter_for(&spec, path, query)?;
            let opts = delete_opts(ctx)?;
            let list = shared.write(|st| ops::delete_collection(st, &spec, &filter, &opts))?;
            Ok(Reply::Json(200, if ctx.metadata_only { partial_list(list) } else { list }))
        }
    }
}

fn delete_opts(ctx: &RequestCtx) -> Result<DeleteOpts, ApiError> {
    let mut opts = DeleteOpts::from_body(&ctx.body)?;
    if let Some(g) = ctx.query.number::<i64>("gracePeriodSeconds")? {
        opts.grace_period_seconds = Some(g);
    }
    opts.dry_run |= ctx.query.get("dryRun") == Some("All");
    Ok(opts)
}

fn watch_reply(
    shared: &Arc<Shared>,
    spec: ResourceSpec,
    path: &ResourcePath,
    ctx: &RequestCtx,
) -> Result<Reply, ApiError> {
    let query = &ctx.query;
    let filter = filter_for(&spec, path, query)?;
    let bookmarks = query.flag("allowWatchBookmarks");
    let initial_events = query.flag("sendInitialEvents");
    let version_match = query.get("resourceVersionMatch").filter(|s| !s.is_empty());
    if initial_events {
        if version_match != Some("NotOlderThan") {
            return Err(ApiError::unprocessable(
                "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
            ));
        }
        if !bookmarks {
            return Err(ApiError::unprocessable(
                "ListOptions.meta.k8s.io \"\" is invalid: allowWatchBookmarks: Forbidden: sendInitialEvents requires setting allowWatchBookmarks to true",
            ));
        }
    } else if version_match.is_some() {
        return Err(ApiError::unprocessable(
            "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
        ));
    }
    let rv = query.get("resourceVersion").filter(|s| !s.is_empty() && *s != "0");
    let start = match (initial_events, rv) {
        (true, _) => WatchStart::Current { end_bookmark: true },
        (false, None) => WatchStart::Current { end_bookmark: false },
        (false, Some(rv)) => WatchStart::After(
            rv.parse().map_err(|_| ApiError::bad_request(format!("invalid resource version: {rv:?}")))?,
        ),
    };
    let timeout = query.number::<u64>("timeoutSeconds")?.map(Duration::from_secs);
    let expired = shared.write(|st| {
        if st.expire_watches > 0 {
            st.expire_watches -= 1;
            Some(st.rv())
        } else {
            None
        }
    });
    if let Some(now) = expired {
        let requested = match start {
            WatchStart::After(rv) => rv,
            WatchStart::Current { .. } => now,
        };
        return Ok(Reply::Raw(200, watch::expired_line(requested, now + 1)));
    }
    let req = WatchRequest { spec, filter, start, bookmarks, timeout, metadata_only: ctx.metadata_only };
    Ok(Reply::Stream(watch::start(Arc::clone(shared), req)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res(path: &str) -> Option<ResourcePath> {
        match parse_path(path, &Registry::builtin()) {
            Some(Route::Resource(p)) => Some(p),
            _ => None,
        }
    }

    #[test]
    fn routes() {
        let p = res("/api/v1/namespaces/default/pods/p1/status").unwrap();
        assert_eq!(
            (p.plural.as_str(), p.namespace.as_deref(), p.name.as_deref()),
            ("pods", Some("default"), Some("p1"))
        );
        assert_eq!(p.subresource.as_deref(), Some("status"));
        let p = res("/api/v1/namespaces/default").unwrap();
        assert_eq!((p.plural.as_str(), p.name.as_deref(), p.namespace), ("namespaces", Some("default"), None));
        let p = res("/api/v1/namespaces/ns1/status").unwrap();
        assert_eq!(
            (p.plural.as_str(), p.name.as_deref(), p.subresource.as_deref()),
            ("namespaces", Some("ns1"), Some("status"))
        );
        let p = res("/api/v1/pods").unwrap();
        assert_eq!((p.plural.as_str(), p.namespace, p.name), ("pods", None, None));
        let p = res("/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/l").unwrap();
        assert_eq!((p.group.as_str(), p.name.as_deref()), ("coordination.k8s.io", Some("l")));
        let p = res("/apis/resource.k8s.io/v1/resourceslices/s1").unwrap();
        assert_eq!((p.plural.as_str(), p.namespace), ("resourceslices", None));
        assert!(res("/api/v1/namespaces/a/pods/b/c/d").is_none());
        assert_eq!(parse_path("/apis", &Registry::builtin()), Some(Route::Groups));
        assert_eq!(parse_path("/", &Registry::builtin()), None);
    }

    #[test]
    fn verbs() {
        let q = |s: &str| Query::parse(Some(s));
        let p = res("/api/v1/nodes").unwrap();
        let n = res("/api/v1/nodes/n1").unwrap();
        assert_eq!(verb_of(&Method::GET, &p, &q("")).unwrap(), Verb::List);
        assert_eq!(verb_of(&Method::GET, &p, &q("watch=1")).unwrap(), Verb::Watch);
        assert_eq!(verb_of(&Method::GET, &p, &q("watch=false")).unwrap(), Verb::List);
        assert_eq!(verb_of(&Method::GET, &n, &q("")).unwrap(), Verb::Get);
        assert_eq!(verb_of(&Method::DELETE, &p, &q("")).unwrap(), Verb::DeleteCollection);
        assert_eq!(verb_of(&Method::DELETE, &n, &q("")).unwrap(), Verb::Delete);
        assert_eq!(verb_of(&Method::PUT, &n, &q("")).unwrap(), Verb::Update);
        assert!(verb_of(&Method::OPTIONS, &n, &q("")).is_err());
    }
}
