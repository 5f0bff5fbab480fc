//! A fake Kubernetes API server for tests.
//!
//! [`FakeApiServer`] serves the Kubernetes REST API over real HTTP on `127.0.0.1` (an ephemeral
//! port), backed by an in-memory store of `serde_json::Value` objects. kube-rs talks to it like
//! to a cluster, so a kube-runtime `Controller`, `watcher`/reflectors, the `finalizer` helper,
//! the events `Recorder`, server-side apply and Lease-based leader election all run against it
//! inside `#[tokio::test]`.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube::api::{Api, PostParams};
//! use weft_fakeapi::{FakeApiServer, RequestMatcher, Verb};
//!
//! let server = FakeApiServer::start().await;
//! let cms: Api<ConfigMap> = Api::namespaced(server.client(), "default");
//! let mut cm = ConfigMap::default();
//! cm.metadata.name = Some("a".into());
//! cms.create(&PostParams::default(), &cm).await?;
//! assert!(server.get("configmaps", Some("default"), "a").is_some());
//! server.fail_next(RequestMatcher::new(Verb::Patch, "configmaps"), 409, 1);
//! assert_eq!(server.requests()[0].verb, Verb::Create);
//! # Ok(()) }
//! ```
//!
//! # What it serves
//!
//! * Paths `/api/v1/[namespaces/{ns}/]{plural}[/{name}[/{subresource}]]` and
//!   `/apis/{group}/{version}/[namespaces/{ns}/]{plural}[/{name}[/status]]`, the cluster-wide
//!   list/watch of namespaced resources, and minimal discovery (`/version`, `/api`, `/api/v1`,
//!   `/apis`, `/apis/{g}`, `/apis/{g}/{v}`).
//! * Built-in resources: core v1 nodes, pods, configmaps, secrets, services, namespaces, events,
//!   serviceaccounts; events.k8s.io/v1 events; apps/v1 deployments, daemonsets, statefulsets,
//!   replicasets; coordination.k8s.io/v1 leases; resource.k8s.io/v1 resourceclaims,
//!   resourceclaimtemplates, deviceclasses, resourceslices; apiextensions.k8s.io/v1
//!   customresourcedefinitions. Creating a CRD serves its versions (and marks it Established);
//!   [`FakeApiServer::register`] adds a resource directly. Unknown paths answer 404 `Status`.
//! * GET, LIST (label and field selectors, `limit`/`continue`), WATCH (history replay from a
//!   resourceVersion, 410 after compaction, bookmarks, `timeoutSeconds`, selector transitions,
//!   streaming lists), CREATE (`generateName`), UPDATE (optimistic concurrency, generation,
//!   status subresource isolation), PATCH (merge, JSON patch, strategic merge as merge, server-side
//!   apply with field-ownership conflicts), DELETE (finalizers, preconditions), DELETECOLLECTION,
//!   `dryRun=All`, and `PartialObjectMetadata` responses for kube's metadata API.
//! * Errors are `Status` bodies with `code` and `reason`, so kube returns `Error::Api(status)`.
//! * One global, increasing resourceVersion, like etcd.
//!
//! # Approximations
//!
//! * Strategic merge patch is applied as a JSON merge patch: lists are replaced, not merged by
//!   key, and `$patch`-style directives are dropped.
//! * Server-side apply is a merge of the applied configuration with field ownership tracked
//!   per leaf path (lists are atomic). Conflicts between managers are detected (409, or moved
//!   with `force=true`) and fields a manager stops applying are removed when nobody else owns
//!   them; list-map merging by key and schema-driven semantics are not modelled.
//! * No validation or defaulting beyond metadata (names, namespaces, `kind`); no admission, no
//!   RBAC, no garbage collector (ownerReferences are stored but not followed), no namespace
//!   lifecycle: namespaced objects may be created in a namespace that does not exist, and deleting
//!   a namespace does not delete its contents. Pods are deleted at once (no graceful termination).
//! * Create strategies: for resources with a status subresource, POST drops `.status` (pods get
//!   `phase: Pending`, namespaces `phase: Active`; nodes keep their status). Use
//!   [`FakeApiServer::insert`] to seed objects with a status.
//! * Lists serve the current state on every page; the continue token carries the first page's
//!   resourceVersion, so a watch started from it replays whatever changed meanwhile.
//!   `resourceVersionMatch=Exact` is not honoured (current state is served).
//! * Versions of one resource share storage without conversion (only `apiVersion` is rewritten).
//!   core/v1 and events.k8s.io/v1 events are stored separately.
//!
//! See `docs/fake-apiserver.md` in the workspace for a guide.

mod controls;
mod discovery;
mod error;
mod http;
mod managed;
mod meta;
mod ops;
mod patch;
mod registry;
mod selectors;
mod server;
mod store;
mod watch;

pub use controls::{RecordedRequest, RequestMatcher, Verb};
pub use error::FakeError;
pub use registry::ResourceSpec;
pub use server::{FakeApiConfig, FakeApiServer};
