//! The Pipeline and NumaNetwork webhooks: Numaflow Pipelines wired to the NumaNetworks their edges
//! are bound to ([`weft_pipeline::wire`]), and NumaNetworks checked as the API server would and
//! counted against the cap.
//!
//! - `POST /pipelines/mutate` (CREATE, UPDATE): the JSON Patch that gives every vertex on a bound
//!   edge its claim, `VERTEX_DOMAIN`/`VERTEX_DOMAIN_TARGETS` and the domains annotation. A Pipeline
//!   that does not validate is allowed unchanged here: the validating webhook denies it with every
//!   problem (and ratchets on UPDATE), so the user sees one message, not two.
//! - `POST /pipelines/validate` (CREATE, UPDATE): denied with 422 `Invalid` and every problem, each
//!   naming its field; warnings (e.g. a `VERTEX_DOMAIN` the user set) go back either way. On UPDATE
//!   a problem the stored Pipeline already had is a warning, so a Pipeline whose NumaNetwork was
//!   deleted can still be paused, relabelled or have its finalizers removed.
//! - `POST /numanetworks/validate` (CREATE, UPDATE): the CRD's schema and CEL rules
//!   ([`NumaNetworkValidator`]; on UPDATE the transition rules, with unchanged problems ratcheted
//!   as the API server does) and, on CREATE, the cap on how many NumaNetworks may exist (403
//!   `Forbidden`, naming the cap and the count).
//!
//! A Pipeline being deleted (with `metadata.deletionTimestamp`) is always allowed unchanged.

use std::collections::HashSet;
use std::sync::Arc;

use serde_json::Value;
use tokio::time::Instant;
use weft_pipeline::{EdgeField, WiringOptions, referenced_networks, wire};

use super::networks::{NumaNetworkSource, NumaNetworkValidator};
use super::pipeline_crd::PipelineCrdSource;
use super::{AdmissionRequest, Decision, Denial, Operation, WebhookState};

/// Most distinct NumaNetworks one Pipeline may name: each one the cache does not hold costs a GET.
pub const MAX_NETWORKS_PER_PIPELINE: usize = 256;

/// How the Pipeline and NumaNetwork webhooks decide.
#[derive(Clone, Default)]
pub struct NetworkOptions {
    /// The vertex domains' zone.
    pub wiring: WiringOptions,
    /// Most NumaNetworks that may exist; 0: no cap.
    pub max_numa_networks: u32,
    /// The CRD's rules in Rust (`weft_crds::NumaNetwork::validate`); `None` checks only the cap.
    pub validator: Option<NumaNetworkValidator>,
}

impl std::fmt::Debug for NetworkOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetworkOptions")
            .field("wiring", &self.wiring)
            .field("max_numa_networks", &self.max_numa_networks)
            .field("validator", &self.validator.is_some())
            .finish()
    }
}

/// The NumaNetwork source and options the Pipeline and NumaNetwork webhooks use.
pub(super) struct Networks {
    pub(super) source: Arc<dyn NumaNetworkSource>,
    pub(super) opts: NetworkOptions,
    /// What the served Pipeline CRD does with `spec.edges[].numaNetwork`, when known.
    pub(super) crd: Option<Arc<dyn PipelineCrdSource>>,
}

/// The validating webhook's warning for a Pipeline that binds no edge while the served Pipeline
/// CRD drops `spec.edges[].numaNetwork`: the field form cannot have reached weft.
pub const FULL_CRD_WARNING: &str = "no edge of this Pipeline is bound to a NumaNetwork, and this cluster serves \
     Numaflow's full Pipeline CRD, which has no spec.edges[].numaNetwork (the API server refuses or drops that \
     field before weft sees it); bind edges in the annotation weft.io/numa-network-edges (docs/pipelines.md)";

fn is_deleting(object: &Value) -> bool {
    object.pointer("/metadata/deletionTimestamp").is_some_and(|t| !t.is_null())
}

fn pipeline_ref(request: &AdmissionRequest) -> String {
    format!("Pipeline {}", request.object_ref())
}

impl WebhookState {
    /// The same state telling the Pipeline webhook which Pipeline CRD the cluster serves (only
    /// after [`WebhookState::with_numa_networks`]): a Pipeline that binds no edge while the CRD
    /// drops `spec.edges[].numaNetwork` is admitted with [`FULL_CRD_WARNING`].
    #[must_use]
    pub fn with_pipeline_crd(mut self, crd: Arc<dyn PipelineCrdSource>) -> WebhookState {
        if let Some(n) = self.networks.as_mut() {
            n.crd = Some(crd);
        }
        self
    }

    fn networks(&self) -> Result<&Networks, Denial> {
        self.networks.as_ref().ok_or_else(|| {
            Denial::internal(
                "this weft webhook was started without a NumaNetwork source, so it cannot admit Pipelines or \
                 NumaNetworks; check the webhook configuration",
            )
        })
    }

    /// The NumaNetworks among `names` that exist: from the cache, else a GET, all within the
    /// lookup timeout.
    async fn existing_networks(&self, names: Vec<String>) -> Result<HashSet<String>, Denial> {
        let networks = self.networks()?;
        if names.len() > MAX_NETWORKS_PER_PIPELINE {
            return Err(Denial::invalid(format!(
                "the Pipeline names {} NumaNetworks; weft wires at most {MAX_NETWORKS_PER_PIPELINE} per Pipeline",
                names.len()
            )));
        }
        let deadline = Instant::now() + self.lookup_timeout;
        let mut found = HashSet::new();
        for name in names {
            if networks.source.cached(&name) {
                self.metrics.network_lookup("cache", "found");
                found.insert(name);
                continue;
            }
            self.metrics.network_lookup("cache", "miss");
            match tokio::time::timeout_at(deadline, networks.source.fetch(&name)).await {
                Ok(Ok(true)) => {
                    self.metrics.network_lookup("api", "found");
                    found.insert(name);
                }
                Ok(Ok(false)) => self.metrics.network_lookup("api", "not_found"),
                Ok(Err(e)) => {
                    self.metrics.network_lookup("api", "error");
                    return Err(Denial::internal(format!("reading NumaNetwork '{name}': {e}")));
                }
                Err(_) => {
                    self.metrics.network_lookup("api", "error");
                    return Err(Denial::timeout(format!(
                        "reading the Pipeline's NumaNetworks took longer than {:?} (at NumaNetwork '{name}')",
                        self.lookup_timeout
                    )));
                }
            }
        }
        Ok(found)
    }

    /// Runs `f` on a blocking thread, a few at a time (large Pipelines cannot starve the workers).
    async fn blocking<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> Result<T, Denial> {
        let Ok(slot) = self.mutating.clone().acquire_owned().await else {
            return Err(Denial::internal("the webhook is shutting down"));
        };
        tokio::task::spawn_blocking(move || {
            let _slot = slot;
            f()
        })
        .await
        .map_err(|e| Denial::internal(format!("wiring the Pipeline: {e}")))
    }

    pub(super) async fn mutate_pipeline(&self, request: &AdmissionRequest) -> Decision {
        if !matches!(request.operation, Operation::Create | Operation::Update) {
            return Decision::allow();
        }
        let Some(object) = &request.object else {
            return Decision::deny(Denial::bad_request("the request has no object"));
        };
        if is_deleting(object) {
            return Decision::allow();
        }
        let wiring = match self.networks() {
            Ok(n) => n.opts.wiring.clone(),
            Err(d) => return Decision::deny(d),
        };
        let exists = match self.existing_networks(referenced_networks(object)).await {
            Ok(e) => e,
            Err(d) => return Decision::deny(d),
        };
        let (object, namespace) = (object.clone(), request.namespace.clone());
        let wired = self
            .blocking(move || wire(&object, namespace.as_deref(), &wiring, &|n| exists.contains(n)).map(|w| w.ops))
            .await;
        match wired {
            Ok(Ok(ops)) => Decision::patch(ops),
            // The validating webhook denies it, with every problem.
            Ok(Err(_)) => Decision::allow(),
            Err(d) => Decision::deny(d),
        }
    }

    pub(super) async fn validate_pipeline(&self, request: &AdmissionRequest) -> Decision {
        if !matches!(request.operation, Operation::Create | Operation::Update) {
            return Decision::allow();
        }
        let Some(object) = &request.object else {
            return Decision::deny(Denial::bad_request("the request has no object"));
        };
        if is_deleting(object) {
            return Decision::allow();
        }
        let old = match (request.operation, &request.old_object) {
            (Operation::Update, Some(old)) => Some(old.clone()),
            (Operation::Update, None) => {
                return Decision::deny(Denial::bad_request("the UPDATE request has no oldObject"));
            }
            _ => None,
        };
        let (wiring, edge_field) = match self.networks() {
            Ok(n) => (n.opts.wiring.clone(), n.crd.as_ref().and_then(|c| c.edge_field())),
            Err(d) => return Decision::deny(d),
        };
        let mut names = referenced_networks(object);
        if let Some(old) = &old {
            names.extend(referenced_networks(old));
            names.sort_unstable();
            names.dedup();
        }
        let exists = match self.existing_networks(names).await {
            Ok(e) => e,
            Err(d) => return Decision::deny(d),
        };
        let (object, namespace) = (object.clone(), request.namespace.clone());
        let checked = self
            .blocking(move || {
                let lookup = |n: &str| exists.contains(n);
                let new = wire(&object, namespace.as_deref(), &wiring, &lookup);
                let before = old.map(|o| wire(&o, namespace.as_deref(), &wiring, &lookup).err());
                (new, before)
            })
            .await;
        let (new, before) = match checked {
            Ok(c) => c,
            Err(d) => return Decision::deny(d),
        };
        match new {
            Ok(w) => {
                let mut warnings = w.warnings;
                if w.bindings.is_empty() && edge_field == Some(EdgeField::Pruned) {
                    warnings.push(FULL_CRD_WARNING.to_string());
                }
                Decision::allow().with_warnings(warnings)
            }
            Err(problems) => {
                let mut warnings = Vec::new();
                let mut errors = Vec::new();
                let known = before.flatten().map(|p| p.messages()).unwrap_or_default();
                for p in problems.messages() {
                    if known.contains(&p) {
                        warnings.push(format!("{p} (the stored Pipeline has this problem too)"));
                    } else {
                        errors.push(p);
                    }
                }
                if errors.is_empty() {
                    Decision::allow().with_warnings(warnings)
                } else {
                    Decision::deny(Denial::invalid(format!(
                        "{} cannot run on its NumaNetworks: {}",
                        pipeline_ref(request),
                        errors.join("; ")
                    )))
                    .with_warnings(warnings)
                }
            }
        }
    }

    pub(super) async fn validate_numa_network(&self, request: &AdmissionRequest) -> Decision {
        if !matches!(request.operation, Operation::Create | Operation::Update) {
            return Decision::allow();
        }
        let Some(object) = &request.object else {
            return Decision::deny(Denial::bad_request("the request has no object"));
        };
        let networks = match self.networks() {
            Ok(n) => n,
            Err(d) => return Decision::deny(d),
        };
        let name = object
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .or(request.name.as_deref().filter(|n| !n.is_empty()));
        let shown = name.map_or_else(|| "(generated name)".to_owned(), |n| format!("'{n}'"));
        let mut warnings = Vec::new();
        if let Some(validate) = &networks.opts.validator {
            let old = match (request.operation, &request.old_object) {
                (Operation::Update, Some(old)) => Some(old),
                (Operation::Update, None) => {
                    return Decision::deny(Denial::bad_request("the UPDATE request has no oldObject"));
                }
                _ => None,
            };
            let mut errors = validate(object, old);
            if let Some(old) = old {
                // As the API server ratchets CRD validation: a field that was already invalid and
                // did not change does not block the update.
                let before = validate(old, None);
                let (known, new): (Vec<String>, Vec<String>) = errors.into_iter().partition(|e| before.contains(e));
                warnings
                    .extend(known.into_iter().map(|e| format!("{e} (the stored NumaNetwork has this problem too)")));
                errors = new;
            }
            if !errors.is_empty() {
                return Decision::deny(Denial::invalid(format!(
                    "NumaNetwork {shown} is invalid: {}",
                    errors.join("; ")
                )))
                .with_warnings(warnings);
            }
        }
        let cap = networks.opts.max_numa_networks;
        if request.operation == Operation::Create && cap > 0 {
            let listed = tokio::time::timeout(self.lookup_timeout, networks.source.list()).await;
            let names = match listed {
                Ok(Ok(names)) => {
                    self.metrics.network_lookup("list", "found");
                    names
                }
                Ok(Err(e)) => {
                    self.metrics.network_lookup("list", "error");
                    return Decision::deny(Denial::internal(format!(
                        "counting NumaNetworks for the cap of {cap}: {e}"
                    )));
                }
                Err(_) => {
                    self.metrics.network_lookup("list", "error");
                    return Decision::deny(Denial::timeout(format!(
                        "counting NumaNetworks for the cap of {cap} took longer than {:?}",
                        self.lookup_timeout
                    )));
                }
            };
            let count = names.iter().filter(|n| Some(n.as_str()) != name).count();
            if count >= cap as usize {
                return Decision::deny(Denial::forbidden(format!(
                    "NumaNetwork {shown} cannot be created: {count} NumaNetworks exist and at most {cap} may \
                     (weft webhook --max-numa-networks={cap}); delete one that is no longer used, or raise the cap"
                )))
                .with_warnings(warnings);
            }
        }
        Decision::allow().with_warnings(warnings)
    }
}
