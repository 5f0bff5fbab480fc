//! The scheduler extender: request handling ([`ExtenderState`]) and its HTTP server (axum).
//!
//! Routes: `POST {prefix}/filter`, `POST {prefix}/prioritize`, `POST {prefix}/bind`
//! ([`crate::bind`]). Health, readiness and metrics are on the ops endpoint ([`weft_kube::ops`]);
//! [`ExtenderState::register_metrics`] and [`ExtenderState::add_readiness_check`] hook the
//! extender into it.
//!
//! Status codes (kube-scheduler treats any non-200 answer as an error of this extender):
//! - 200 for every well-formed request. A filter that cannot be answered (no pod, no nodes, an
//!   unreadable GPU quantity) sets `Error`, which the scheduler reports; it fails the pod's
//!   scheduling attempt unless the extender is `ignorable`.
//! - 400 for a body that is not extender JSON, and for a prioritize request that cannot be answered
//!   (kube-scheduler ignores prioritize errors, so the node ranking proceeds without weft).
//! - 413 for a body over `max_body_bytes`, or keeping more than `max_decoded_bytes` of JSON; 503
//!   when a request runs past `request_timeout` (filter: 200 with `Error` instead).
//!
//! Never 500: internal failures are reported the same way as bad input.
//!
//! Bounds (so that no caller can exhaust the process): bodies are decoded as they arrive and never
//! held whole ([`crate::stream`]); at most `max_nodes_per_request` candidates per request, counted
//! while decoding (the first one over ends the request, the rest unread); at most
//! `max_concurrent_decisions` requests reading their body or deciding at once (the others wait for
//! a slot inside their own time limit); reading and decisions stop at the request's deadline
//! instead of running on after the answer was given up; the topology cache is bounded in names and
//! bytes ([`TopologyCache`]); connection limits are [`weft_kube::http`]'s.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use k8s_openapi::api::core::v1::Node;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use thiserror::Error;
use tokio::net::TcpListener;
use weft_alloc::ScoreCache;

use crate::bind::PodBinder;
use crate::cache::{PreparedTopology, Resolved, TopologyCache};
use crate::config::ExtenderConfig;
use crate::decision::{self, Deadline, Expired, NodeState, NodeVfs, PodAsk, Verdict};
use crate::gang::{self, Gangs, GroupKey, Member, MembershipError, Steer};
use crate::reservations::{Reservations, shown_in};
use crate::stream::{self, BodyReader, JsonStream, StreamError, StreamLimits};
use crate::view::ClusterView;
use crate::volcano;
use crate::wire::{
    self, ExtenderArgs, ExtenderBindingArgs, ExtenderFilterResult, HostPriority, HostPriorityList,
    MAX_EXTENDER_PRIORITY, NodeList,
};
use weft_kube::http::ServeOptions;
use weft_record::usage::{PodRef, gpus_in_use};
use weft_record::vf_usage::vfs_in_use;

/// Header that asks prioritize to include each node's `Reason`.
pub const DEBUG_HEADER: &str = "x-weft-debug";

/// Why an extender request could not be answered.
#[derive(Debug, Error)]
pub enum ExtenderError {
    /// The request has no `Pod`.
    #[error("request has no Pod")]
    NoPod,
    /// The request has neither `Nodes` nor `NodeNames`.
    #[error("request has neither Nodes nor NodeNames")]
    NoNodes,
    /// More candidate nodes than `max_nodes_per_request`.
    #[error("request names {nodes} nodes; at most {max} are accepted (--max-nodes-per-request)")]
    TooManyNodes {
        /// Nodes in the request.
        nodes: usize,
        /// The limit.
        max: usize,
    },
    /// The request's deadline passed while deciding.
    #[error(transparent)]
    Expired(#[from] Expired),
    /// The pod's GPU request cannot be read.
    #[error("pod {pod}: {error}")]
    BadRequest {
        /// The pod.
        pod: Box<PodRef>,
        /// Why.
        error: Box<weft_resources::RequestError>,
    },
}

/// Everything a request needs: the cluster view, the settings and the topology cache.
pub struct ExtenderState {
    view: Arc<dyn ClusterView>,
    binder: Option<Arc<dyn PodBinder>>,
    reservations: Reservations,
    cfg: ExtenderConfig,
    cache: TopologyCache,
    scores: Mutex<ScoreCache>,
    /// Per node, the GPUs its pods hold, as of a pods revision ([`ExtenderState::devices_used`]).
    accounting: Mutex<Accounting>,
    deciding: Arc<tokio::sync::Semaphore>,
    metrics: ExtenderMetrics,
    /// The empty VF set that nodes without VFs in use share.
    no_vfs: Arc<BTreeSet<String>>,
    /// Gang plans held by this process ([`crate::gang`]).
    gangs: Gangs,
    /// The network gang plans read, as of a network revision of the view ([`ExtenderState::network`]).
    network: Mutex<Option<(u64, Arc<gang::Network>)>>,
}

/// Candidates handled between two looks at the request's deadline (a look reads the clock).
const DEADLINE_EVERY: usize = 64;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VerbLabels {
    verb: &'static str,
    code: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VerbOnly {
    verb: &'static str,
}

/// Requests served and their latency.
#[derive(Clone, Debug)]
struct ExtenderMetrics {
    requests: Family<VerbLabels, Counter>,
    duration: Family<VerbOnly, Histogram>,
}

impl Default for ExtenderMetrics {
    fn default() -> Self {
        ExtenderMetrics {
            requests: Family::default(),
            duration: Family::new_with_constructor(|| Histogram::new(exponential_buckets(0.0005, 2.0, 14))),
        }
    }
}

impl ExtenderMetrics {
    fn observe(&self, verb: &'static str, code: StatusCode, took: std::time::Duration) {
        self.requests.get_or_create(&VerbLabels { verb, code: code.as_u16() }).inc();
        self.duration.get_or_create(&VerbOnly { verb }).observe(took.as_secs_f64());
    }
}

/// Best-effort results kept across requests (topology × free GPUs × request size); cleared when full.
const SCORE_CACHE_CAPACITY: usize = 1 << 16;

impl std::fmt::Debug for ExtenderState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExtenderState").field("cfg", &self.cfg).field("cache", &self.cache).finish_non_exhaustive()
    }
}

/// One candidate node, resolved.
struct Candidate {
    name: String,
    prepared: Resolved,
    used: u128,
    vfs_used: Arc<BTreeSet<String>>,
}

impl ExtenderState {
    /// State over a cluster view.
    pub fn new(view: Arc<dyn ClusterView>, cfg: ExtenderConfig) -> ExtenderState {
        ExtenderState {
            view,
            binder: None,
            reservations: Reservations::new(cfg.reservation_ttl),
            cache: TopologyCache::with_limits(cfg.cache_limits),
            scores: Mutex::new(ScoreCache::with_capacity(SCORE_CACHE_CAPACITY)),
            accounting: Mutex::default(),
            deciding: Arc::new(tokio::sync::Semaphore::new(cfg.max_concurrent_decisions.max(1))),
            metrics: ExtenderMetrics::default(),
            no_vfs: Arc::default(),
            gangs: Gangs::new(cfg.gang_plan_ttl),
            network: Mutex::default(),
            cfg,
        }
    }

    /// Register `weft_extender_requests_total{verb,code}` and
    /// `weft_extender_request_duration_seconds{verb}` in `registry`.
    pub fn register_metrics(&self, registry: &mut Registry) {
        let sub = registry.sub_registry_with_prefix("extender");
        sub.register("requests", "Extender requests by verb and HTTP status", self.metrics.requests.clone());
        sub.register(
            "request_duration_seconds",
            "Time to read, decide and answer one extender request",
            self.metrics.duration.clone(),
        );
    }

    /// Make `ops` report not ready until the cluster view has synced.
    pub fn add_readiness_check(self: &Arc<Self>, ops: &weft_kube::ops::Ops) {
        let view = self.view.clone();
        ops.add_readiness_check("cluster-view (node and pod caches synced)", move || view.is_ready());
    }

    /// The settings.
    pub fn config(&self) -> &ExtenderConfig {
        &self.cfg
    }

    /// The cluster view.
    pub fn view(&self) -> &Arc<dyn ClusterView> {
        &self.view
    }

    /// The same state, able to bind pods through `binder` (`POST /bind`).
    pub fn with_binder(mut self, binder: Arc<dyn PodBinder>) -> ExtenderState {
        self.binder = Some(binder);
        self
    }

    /// What bind writes through, if it can write.
    pub fn binder(&self) -> Option<&Arc<dyn PodBinder>> {
        self.binder.as_ref()
    }

    /// GPU decisions made by bind and not yet visible through the watch.
    pub fn reservations(&self) -> &Reservations {
        &self.reservations
    }

    /// The gang plans this process holds.
    pub fn gangs(&self) -> &Gangs {
        &self.gangs
    }

    /// `pod`'s gang ([`crate::gang::membership`]), from its annotations and the view's PodGroups.
    pub fn member_of(&self, pod: &k8s_openapi::api::core::v1::Pod) -> Result<Option<Member>, MembershipError> {
        gang::membership(pod, |ns, name| self.view.pod_group(ns, name))
    }

    /// The topology cache.
    pub fn cache(&self) -> &TopologyCache {
        &self.cache
    }

    /// The bounds of one request body ([`crate::stream`]).
    pub fn stream_limits(&self) -> StreamLimits {
        StreamLimits { max_body_bytes: self.cfg.max_body_bytes as u64, max_decoded_bytes: self.cfg.max_decoded_bytes }
    }

    /// Answer a filter request. Problems with the request become `Error` in the result.
    ///
    /// A request with `Nodes` is answered with the passing node objects, unchanged; one with
    /// `NodeNames` with the passing names (a subset of the input, in input order).
    pub fn filter(&self, args: ExtenderArgs) -> ExtenderFilterResult {
        // Without a deadline the filter always completes.
        self.filter_until(args, Deadline::NEVER).unwrap_or_default()
    }

    /// [`ExtenderState::filter`] that gives up once `deadline` passes.
    pub fn filter_until(&self, mut args: ExtenderArgs, deadline: Deadline) -> Result<ExtenderFilterResult, Expired> {
        // The names are moved through the decision into the answer, not copied.
        let by_names = args.node_names.is_some();
        let names = if args.nodes.is_none() { args.node_names.take() } else { None };
        let member = match args.pod.as_ref().map(|p| self.member_of(p)).transpose() {
            Ok(m) => Ok(m.flatten()),
            Err(MembershipError::Bad(error)) => {
                tracing::warn!(%error, "filter request cannot be answered");
                return Ok(ExtenderFilterResult { error, ..ExtenderFilterResult::default() });
            }
            Err(MembershipError::Waiting(why)) => Err(why),
        };
        let group = member.as_ref().ok().and_then(Option::as_ref).map(|m| &m.key);
        let (request, candidates) = match self.candidates(&args, names, group, deadline) {
            Ok(c) => c,
            Err(ExtenderError::Expired(e)) => return Err(e),
            Err(e) => {
                tracing::warn!(error = %e, "filter request cannot be answered");
                return Ok(ExtenderFilterResult { error: e.to_string(), ..ExtenderFilterResult::default() });
            }
        };
        let mut verdicts = decision::filter_pod(&request, &states(&candidates), &self.cfg);
        let uid = args.pod.as_ref().and_then(|p| p.metadata.uid.as_deref()).unwrap_or_default();
        self.steer_filter(&member, uid, &request, &candidates, &mut verdicts, deadline)?;
        let mut result = ExtenderFilterResult::default();
        let mut passed = vec![false; candidates.len()];
        for (i, (c, v)) in candidates.iter().zip(&verdicts).enumerate() {
            match v {
                Verdict::Pass { note } => {
                    passed[i] = true;
                    if let Some(note) = note {
                        tracing::debug!(node = %c.name, "{note}");
                    }
                }
                Verdict::Fail(why) => {
                    result.failed_nodes.insert(c.name.clone(), why.clone());
                }
                Verdict::Unresolvable(why) => {
                    result.failed_and_unresolvable_nodes.insert(c.name.clone(), why.clone());
                }
            }
        }
        tracing::debug!(
            pod = %args.pod.as_ref().map(PodRef::of).unwrap_or_default(),
            gpus = request.gpus,
            vfs = ?request.vfs,
            candidates = candidates.len(),
            passed = passed.iter().filter(|p| **p).count(),
            "filter"
        );
        if let Some(list) = args.nodes.take() {
            let items = list.items.into_iter().zip(&passed).filter(|(_, p)| **p).map(|(n, _)| n).collect();
            result.nodes = Some(NodeList { metadata: list.metadata, items });
        }
        if by_names {
            let pass = candidates.into_iter().zip(&passed).filter(|(_, p)| **p).map(|(c, _)| c.name);
            result.node_names = Some(pass.collect());
        }
        Ok(result)
    }

    /// Answer a prioritize request: one entry per candidate, in input order. With `with_reasons`,
    /// entries that were not scored from topology carry a `Reason`.
    pub fn prioritize(&self, args: &ExtenderArgs, with_reasons: bool) -> Result<HostPriorityList, ExtenderError> {
        self.prioritize_until(args, with_reasons, Deadline::NEVER)
    }

    /// [`ExtenderState::prioritize`] that gives up once `deadline` passes.
    pub fn prioritize_until(
        &self,
        args: &ExtenderArgs,
        with_reasons: bool,
        deadline: Deadline,
    ) -> Result<HostPriorityList, ExtenderError> {
        self.prioritize_names(args, None, with_reasons, deadline)
    }

    /// [`ExtenderState::prioritize_until`] over a request whose `NodeNames` the caller took out
    /// (`names`), so that they are moved into the answer rather than copied.
    fn prioritize_names(
        &self,
        args: &ExtenderArgs,
        names: Option<Vec<String>>,
        with_reasons: bool,
        deadline: Deadline,
    ) -> Result<HostPriorityList, ExtenderError> {
        let pod = args.pod.as_ref().ok_or(ExtenderError::NoPod)?;
        // A member whose group cannot be read is not steered here: filter has said why.
        let member = self.member_of(pod).ok().flatten();
        let (request, candidates) = self.candidates(args, names, member.as_ref().map(|m| &m.key), deadline)?;
        let mut scores = {
            let mut cache = self.scores.lock().unwrap_or_else(PoisonError::into_inner);
            decision::prioritize_pod_until(&request, &states(&candidates), &self.cfg, &mut cache, deadline)?
        };
        if let Some(member) = &member {
            let uid = pod.metadata.uid.as_deref().unwrap_or_default();
            if let Some(open) = self.gangs.open_nodes(&member.key, uid, (request.gpus, &request.vfs)) {
                // The planned nodes first, whatever their own score.
                for (c, s) in candidates.iter().zip(&mut scores) {
                    s.score = if open.contains(&c.name) { MAX_EXTENDER_PRIORITY } else { 0 };
                }
            }
        }
        Ok(candidates
            .into_iter()
            .zip(scores)
            .map(|(c, s)| {
                if let Some(reason) = &s.reason {
                    tracing::debug!(node = %c.name, score = s.score, "{reason}");
                }
                HostPriority { host: c.name, score: s.score, reason: if with_reasons { s.reason } else { None } }
            })
            .collect())
    }

    /// What the pod asks for and the candidates with their topology and GPUs and VFs in use.
    /// `taken`: the request's `NodeNames`, when the caller took them out of `args`.
    /// `group`: the pod's gang, whose own plan does not count as used.
    fn candidates(
        &self,
        args: &ExtenderArgs,
        taken: Option<Vec<String>>,
        group: Option<&GroupKey>,
        deadline: Deadline,
    ) -> Result<(PodAsk, Vec<Candidate>), ExtenderError> {
        let pod = args.pod.as_ref().ok_or(ExtenderError::NoPod)?;
        let request = PodAsk::of(pod, &self.cfg.resource_name)
            .map_err(|error| ExtenderError::BadRequest { pod: Box::new(PodRef::of(pod)), error: Box::new(error) })?;
        let names: Vec<String> = match (&args.nodes, taken, &args.node_names) {
            (Some(list), _, _) => list.items.iter().map(|n| n.name().to_string()).collect(),
            (None, Some(names), _) => names,
            (None, None, Some(names)) => names.clone(),
            (None, None, None) => return Err(ExtenderError::NoNodes),
        };
        if names.len() > self.cfg.max_nodes_per_request {
            return Err(ExtenderError::TooManyNodes { nodes: names.len(), max: self.cfg.max_nodes_per_request });
        }
        if request.is_empty() {
            // Nothing weft decides: the decisions do not look at topology or usage.
            let unjudged =
                |name| Candidate { name, prepared: Err(Arc::from("")), used: 0, vfs_used: self.no_vfs.clone() };
            return Ok((request, names.into_iter().map(unjudged).collect()));
        }
        let resolved = match &args.nodes {
            Some(list) => self.cache.resolve_keys(list.items.iter().map(|n| Some(n.key()))),
            None => {
                let from_view: Vec<Option<Arc<Node>>> = self.view.nodes(&names);
                self.cache.resolve_shared(names.iter().map(String::as_str).zip(from_view.iter().map(Option::as_ref)))
            }
        };
        Ok((request, self.resolved_candidates(names, resolved, group, deadline)?))
    }

    /// The nodes `names` (with their topologies `resolved`) and the GPUs and VFs in use on each:
    /// held by pods, reserved, or kept by a gang plan other than `group`'s.
    fn resolved_candidates(
        &self,
        names: Vec<String>,
        resolved: Vec<Resolved>,
        group: Option<&GroupKey>,
        deadline: Deadline,
    ) -> Result<Vec<Candidate>, Expired> {
        let total = names.len();
        let now = std::time::Instant::now();
        let mut candidates = Vec::with_capacity(total);
        // One look at the ledger and one lock of the accounting for the whole request, not one per
        // node: a node reserved after this look counts from the next request, as one reserved after
        // its own look always did.
        let reserved = self.reservations.nodes();
        let gang_holds = self.gangs.held_by_node(group);
        let revisions = self.view.pods_revisions(&names);
        let mut accounting = self.accounting.lock().unwrap_or_else(PoisonError::into_inner);
        for (i, ((name, prepared), revision)) in names.into_iter().zip(resolved).zip(revisions).enumerate() {
            if i % DEADLINE_EVERY == 0 && deadline.passed() {
                return Err(Expired { done: i, total });
            }
            let (mut used, vfs_used) = match &prepared {
                Ok(p) => {
                    let reserved_here = reserved.contains(name.as_str());
                    self.devices_used(&mut accounting, &name, p, revision, reserved_here, now)
                }
                Err(_) => (0, self.no_vfs.clone()),
            };
            if let Some(held) = gang_holds.get(name.as_str()) {
                used |= held;
            }
            candidates.push(Candidate { name, prepared, used, vfs_used });
        }
        Ok(candidates)
    }

    /// Steers a gang member's filter verdicts to its plan ([`Gangs::steer`]); a member whose group
    /// is not known yet (`Err`) fails every node with the reason.
    fn steer_filter(
        &self,
        member: &Result<Option<Member>, String>,
        uid: &str,
        request: &PodAsk,
        candidates: &[Candidate],
        verdicts: &mut [Verdict],
        deadline: Deadline,
    ) -> Result<(), Expired> {
        // A pod that asks nothing weft places (a CPU-only launcher) is never steered nor held back.
        if request.is_empty() {
            return Ok(());
        }
        let member = match member {
            Ok(None) => return Ok(()),
            Ok(Some(m)) => m,
            Err(why) => {
                for v in verdicts.iter_mut().filter(|v| v.passes()) {
                    *v = Verdict::Fail(why.clone());
                }
                return Ok(());
            }
        };
        let passing: gang::NodeSet<'_> =
            candidates.iter().zip(verdicts.iter()).filter(|(_, v)| v.passes()).map(|(c, _)| c.name.as_str()).collect();
        let mut expired = None;
        let mut plan = |count: usize, anchors: &[String], over: Option<&gang::NodeSet<'_>>| {
            self.plan_gang(member, request, candidates, count, anchors, over, deadline).map_err(|e| match e {
                Ok(why) => why,
                Err(e) => {
                    let why = e.to_string();
                    expired = Some(e);
                    why
                }
            })
        };
        let steer =
            self.gangs.steer(member, uid, (request.gpus, &request.vfs), &passing, std::time::Instant::now(), &mut plan);
        if let Some(e) = expired {
            return Err(e);
        }
        match steer {
            Steer::Free => {}
            Steer::To { nodes, why } => {
                for (c, v) in candidates.iter().zip(verdicts.iter_mut()) {
                    if v.passes() && !nodes.contains(&c.name) {
                        *v = Verdict::Fail(why.clone());
                    }
                }
            }
            Steer::Blocked(why) => {
                tracing::info!(group = %member.key, "{why}");
                for v in verdicts.iter_mut().filter(|v| v.passes()) {
                    *v = Verdict::Fail(why.clone());
                }
            }
        }
        Ok(())
    }

    /// Plans `count` members of `member`'s gang over every node the view knows (or only `over`),
    /// beside its members on `anchors` ([`gang::plan_over`]). `Err(Ok(why))`: no plan;
    /// `Err(Err(_))`: the deadline passed.
    #[allow(clippy::too_many_arguments)] // the plan's inputs, each named where it is called
    fn plan_gang(
        &self,
        member: &Member,
        request: &PodAsk,
        offered: &[Candidate],
        count: usize,
        anchors: &[String],
        over: Option<&gang::NodeSet<'_>>,
        deadline: Deadline,
    ) -> Result<weft_gang::Plan, Result<String, Expired>> {
        // The revision before the names: a change between the two only makes the cache miss later.
        let revision = self.view.network_revision();
        let names = self.view.node_names();
        let nodes: Vec<Option<Arc<Node>>> = self.view.nodes(&names);
        let network = self.network(revision, &names, &nodes).map_err(Ok)?;
        // The request's candidates were resolved the same way (this group's plan not counted):
        // only the nodes it does not offer are resolved here.
        let by_name: rustc_hash::FxHashMap<&str, &Candidate> = offered.iter().map(|c| (c.name.as_str(), c)).collect();
        let (missing, missing_nodes): (Vec<String>, Vec<Option<&Arc<Node>>>) = names
            .iter()
            .zip(&nodes)
            .filter(|(n, _)| !by_name.contains_key(n.as_str()))
            .map(|(n, node)| (n.clone(), node.as_ref()))
            .unzip();
        let resolved = self.cache.resolve_shared(missing.iter().map(String::as_str).zip(missing_nodes));
        let extra = self.resolved_candidates(missing, resolved, Some(&member.key), deadline).map_err(Err)?;
        let extra_by_name: rustc_hash::FxHashMap<&str, &Candidate> =
            extra.iter().map(|c| (c.name.as_str(), c)).collect();
        let mut plan_nodes: Vec<gang::PlanNode<'_>> = Vec::with_capacity(names.len());
        for (name, n) in names.iter().zip(&nodes) {
            let Some(c) = by_name.get(name.as_str()).or_else(|| extra_by_name.get(name.as_str())) else {
                return Err(Ok(format!("node {name} was not resolved")));
            };
            plan_nodes.push(gang::PlanNode {
                name: &c.name,
                labels: n.as_ref().and_then(|n| n.metadata.labels.as_ref()),
                prepared: c.prepared.as_ref().ok().map(|p| &**p),
                used: c.used,
                vfs_used: &c.vfs_used,
            });
        }
        let quality = self.cfg.score_config.set_quality;
        let ask = (request.gpus, &request.vfs);
        gang::plan_over(&network, &plan_nodes, count, ask, &member.constraint, anchors, over, quality).map_err(Ok)
    }

    /// The cluster's network for gang plans over `nodes` (named `names`): the one built last while
    /// the view's network revision and the node names are the same, else built now and kept.
    fn network(
        &self,
        revision: Option<u64>,
        names: &[String],
        nodes: &[Option<Arc<Node>>],
    ) -> Result<Arc<gang::Network>, String> {
        let mut cached = self.network.lock().unwrap_or_else(PoisonError::into_inner);
        if let (Some(r), Some((at, network))) = (revision, cached.as_ref())
            && *at == r
            && network.is_for(names)
        {
            return Ok(network.clone());
        }
        let hypernodes: Vec<weft_gang::HyperNode> = match self.cfg.network_levels {
            gang::NetworkLevels::Auto => self.view.hypernodes().iter().map(|h| (**h).clone()).collect(),
            gang::NetworkLevels::Levels(_) => Vec::new(),
        };
        let labelled: Vec<(&str, Option<&BTreeMap<String, String>>)> = names
            .iter()
            .zip(nodes)
            .map(|(name, n)| (name.as_str(), n.as_ref().and_then(|n| n.metadata.labels.as_ref())))
            .collect();
        let network = Arc::new(gang::Network::build((&self.cfg.network_levels, &hypernodes), &labelled)?);
        *cached = revision.map(|r| (r, network.clone()));
        Ok(network)
    }
}

impl ExtenderState {
    /// vc-scheduler's PredicateFn: the filter decision for one node, as Volcano's status code and
    /// reason ([`crate::volcano`]).
    pub fn volcano_predicate(
        &self,
        request: volcano::PredicateRequest,
        deadline: Deadline,
    ) -> Result<volcano::PredicateResponse, Expired> {
        let failed = |error_message: String, code| Ok(volcano::PredicateResponse { error_message, code });
        let (_, pod) = match volcano::task_pod(request.task) {
            Ok(t) => t,
            Err(e) => return failed(e, volcano::ERROR),
        };
        let node = request.node.map(|n| n.name).unwrap_or_default();
        if node.is_empty() {
            return failed("the request names no node".into(), volcano::ERROR);
        }
        let args = ExtenderArgs { pod: Some(pod), nodes: None, node_names: Some(vec![node.clone()]) };
        let result = self.filter_until(args, deadline)?;
        if !result.error.is_empty() {
            return failed(result.error, volcano::ERROR);
        }
        if let Some(why) = result.failed_and_unresolvable_nodes.get(&node) {
            return failed(why.clone(), volcano::UNSCHEDULABLE_AND_UNRESOLVABLE);
        }
        if let Some(why) = result.failed_nodes.get(&node) {
            return failed(why.clone(), volcano::UNSCHEDULABLE);
        }
        Ok(volcano::PredicateResponse { error_message: String::new(), code: volcano::SUCCESS })
    }

    /// vc-scheduler's BatchNodeOrderFn: the prioritize scores on Volcano's 0–100 scale.
    pub fn volcano_prioritize(
        &self,
        request: volcano::PrioritizeRequest,
        deadline: Deadline,
    ) -> Result<volcano::PrioritizeResponse, Expired> {
        let failed =
            |error_message: String| Ok(volcano::PrioritizeResponse { node_score: BTreeMap::new(), error_message });
        let (_, pod) = match volcano::task_pod(request.task) {
            Ok(t) => t,
            Err(e) => return failed(e),
        };
        let names = request.nodes.unwrap_or_default().into_iter().map(|n| n.name).collect();
        let args = ExtenderArgs { pod: Some(pod), nodes: None, node_names: Some(names) };
        match self.prioritize_until(&args, false, deadline) {
            Ok(list) => Ok(volcano::PrioritizeResponse {
                node_score: list.into_iter().map(|h| (h.host, (h.score * 10) as f64)).collect(),
                error_message: String::new(),
            }),
            Err(ExtenderError::Expired(e)) => Err(e),
            Err(e) => failed(e.to_string()),
        }
    }
}

impl ExtenderState {
    /// The GPUs (mask) and VFs of `node` held by its pods or reserved. The pods' part is kept per
    /// node in `accounting` while the view's [`ClusterView::pods_revision`] of the node
    /// (`revision`, read with the request's other candidates) and its topology stay the same (it
    /// changes only when the node's pods change), so a request walks only the nodes whose pods
    /// changed. The pods are read only on a miss or when the node has reservations to settle
    /// (`reserved_here`).
    fn devices_used(
        &self,
        accounting: &mut Accounting,
        node: &str,
        prepared: &PreparedTopology,
        revision: Option<u64>,
        reserved_here: bool,
        now: std::time::Instant,
    ) -> (u128, Arc<BTreeSet<String>>) {
        let fingerprint = prepared.fingerprint();
        let cached = revision.and_then(|r| {
            accounting.get(node).filter(|a| a.revision == r && a.fingerprint == fingerprint).map(|a| (a.used, &a.vfs))
        });
        if let (Some((used, vfs)), false) = (cached, reserved_here) {
            return (used, vfs.clone());
        }
        let cached = cached.map(|(used, vfs)| (used, vfs.clone()));
        let pods = self.view.pods_on_node(node);
        let (used, vfs) = cached.unwrap_or_else(|| {
            let (used, vfs) = devices_in_use(node, prepared, &pods, &self.cfg.resource_name);
            // Most nodes hold no VFs: they share one empty set.
            let vfs = if vfs.is_empty() { self.no_vfs.clone() } else { Arc::new(vfs) };
            if let Some(revision) = revision {
                if accounting.len() >= self.cfg.max_nodes_per_request.saturating_mul(2) {
                    // Nodes come and go; the map never outgrows twice the largest request.
                    accounting.clear();
                }
                accounting.insert(node.to_string(), Accounted { revision, fingerprint, used, vfs: vfs.clone() });
            }
            (used, vfs)
        });
        let reserved = self.reservations.held(node, now, shown_in(&pods));
        let vfs =
            if reserved.vfs.is_empty() { vfs } else { Arc::new(vfs.iter().cloned().chain(reserved.vfs).collect()) };
        (used | reserved.gpus, vfs)
    }
}

/// Per node, the GPUs and VFs its pods hold, as of a pods revision ([`ExtenderState::devices_used`]).
type Accounting = rustc_hash::FxHashMap<String, Accounted>;

/// The GPUs (mask) and VFs `pods` hold on `node` by weft-record's accounting; its issues are logged.
pub(crate) fn devices_in_use(
    node: &str,
    prepared: &PreparedTopology,
    pods: &[Arc<k8s_openapi::api::core::v1::Pod>],
    resource: &str,
) -> (u128, BTreeSet<String>) {
    let gpus = gpus_in_use(prepared, pods, resource);
    for issue in &gpus.issues {
        tracing::debug!(%node, "GPU accounting: {issue}");
    }
    let Some(topology) = prepared.with_vfs() else { return (gpus.used, BTreeSet::new()) };
    let vfs = vfs_in_use(topology, pods, &gpus);
    for issue in &vfs.issues {
        tracing::debug!(%node, "VF accounting: {issue}");
    }
    (gpus.used, vfs.used)
}

/// One node's GPUs and VFs held by its pods, as of a pods revision of the view.
#[derive(Clone, Debug)]
struct Accounted {
    revision: u64,
    fingerprint: u64,
    used: u128,
    vfs: Arc<BTreeSet<String>>,
}

fn states(candidates: &[Candidate]) -> Vec<NodeState<'_>> {
    candidates
        .iter()
        .map(|c| match &c.prepared {
            Ok(p) => NodeState::Known {
                prepared: p,
                used: c.used,
                vfs: p.with_vfs().map(|topology| NodeVfs { topology, used: &c.vfs_used }),
            },
            Err(reason) => NodeState::Unknown { reason },
        })
        .collect()
}

/// The extender's routes over `state`.
pub fn router(state: Arc<ExtenderState>) -> Router {
    let prefix = state.cfg.normalized_prefix();
    Router::new()
        .route(&format!("{prefix}/filter"), post(filter_handler))
        .route(&format!("{prefix}/prioritize"), post(prioritize_handler))
        .route(&format!("{prefix}/bind"), post(bind_handler))
        .route(&format!("{prefix}/volcano/predicate"), post(volcano_predicate_handler))
        .route(&format!("{prefix}/volcano/prioritize"), post(volcano_prioritize_handler))
        .route(&format!("{prefix}/volcano/allocate"), post(volcano_allocate_handler))
        .route(&format!("{prefix}/volcano/deallocate"), post(volcano_deallocate_handler))
        .with_state(state)
}

/// Serve the extender on `listener` until `shutdown` completes, then let in-flight requests
/// finish within the grace of `opts` ([`weft_kube::http`]).
pub async fn serve<F>(
    listener: TcpListener,
    state: Arc<ExtenderState>,
    opts: ServeOptions,
    shutdown: F,
) -> std::io::Result<()>
where
    F: Future<Output = ()> + Send + 'static,
{
    serve_with(listener, state, None, opts, shutdown).await
}

/// [`serve`] over HTTPS when `tls` is given (the configuration can change while serving, see
/// [`weft_kube::tls::TlsFiles`]).
pub async fn serve_with<F>(
    listener: TcpListener,
    state: Arc<ExtenderState>,
    tls: Option<axum_server::tls_rustls::RustlsConfig>,
    opts: ServeOptions,
    shutdown: F,
) -> std::io::Result<()>
where
    F: Future<Output = ()> + Send + 'static,
{
    if let Ok(addr) = listener.local_addr() {
        let https = tls.is_some();
        tracing::info!(%addr, https, prefix = %state.cfg.normalized_prefix(), "scheduler extender listening");
    }
    weft_kube::http::serve(listener, router(state), tls, opts, shutdown).await
}

/// A failed request: status and a plain-text message.
struct Failure(StatusCode, String);

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        let mut msg = self.1;
        msg.push('\n');
        (self.0, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], msg).into_response()
    }
}

fn json_response(bytes: Vec<u8>) -> Response {
    (StatusCode::OK, [(header::CONTENT_TYPE, "application/json")], bytes).into_response()
}

/// 413 at once when the declared `Content-Length` is over `limit` (set by `flag`).
fn refuse_declared_oversize(headers: &HeaderMap, (limit, flag): (usize, &str)) -> Result<(), Failure> {
    let declared =
        headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large(limit, flag));
    }
    Ok(())
}

fn too_large(limit: usize, flag: &str) -> Failure {
    Failure(StatusCode::PAYLOAD_TOO_LARGE, format!("request body is larger than the {limit}-byte limit ({flag})"))
}

/// Read a small body whole (bind, Volcano's allocate and deallocate events: one pod's worth), at
/// most `max_decoded_bytes`, holding a decision slot while it reads so that the bodies held at
/// once are bounded like the decisions.
async fn read_small_body(state: &ExtenderState, body: Body, headers: &HeaderMap) -> Result<Bytes, Failure> {
    let limit = state.cfg.max_decoded_bytes.min(state.cfg.max_body_bytes);
    let flag = if limit == state.cfg.max_decoded_bytes { "--max-decoded-bytes" } else { "--max-body-bytes" };
    refuse_declared_oversize(headers, (limit, flag))?;
    let _slot = state.deciding.acquire().await.map_err(shutting_down)?;
    axum::body::to_bytes(body, limit).await.map_err(|e| {
        let over = std::error::Error::source(&e)
            .is_some_and(|s| s.downcast_ref::<http_body_util::LengthLimitError>().is_some())
            || e.to_string().contains("length limit");
        if over {
            too_large(limit, flag)
        } else {
            Failure(StatusCode::BAD_REQUEST, format!("cannot read request body: {e}"))
        }
    })
}

fn shutting_down(e: tokio::sync::AcquireError) -> Failure {
    Failure(StatusCode::SERVICE_UNAVAILABLE, format!("weft extender is shutting down: {e}"))
}

/// What a body that could not be read or decoded gets: 413 for its size, 400 for its content, the
/// timeout's answer when the deadline passed. `what` starts the message (`filter: body is not
/// ExtenderArgs JSON`).
fn unreadable(e: StreamError, what: &str) -> Unanswered {
    match e {
        StreamError::Expired => Unanswered::TimedOut,
        e if e.is_too_large() => Failure(StatusCode::PAYLOAD_TOO_LARGE, e.to_string()).into(),
        e @ StreamError::Read(_) => Failure(StatusCode::BAD_REQUEST, e.to_string()).into(),
        e => Failure(StatusCode::BAD_REQUEST, format!("{what}: {e}")).into(),
    }
}

/// Read `ExtenderArgs`; a request naming too many nodes is `Ok(Err(message))`, for the verb to
/// answer as it answers other unanswerable requests.
fn read_extender_args(
    st: &ExtenderState,
    stream: &mut JsonStream<BodyReader>,
    verb: &str,
) -> Result<Result<ExtenderArgs, String>, Unanswered> {
    match wire::read_args(stream, st.cfg.max_nodes_per_request) {
        Ok(args) => Ok(Ok(args)),
        Err(e @ StreamError::TooManyNodes { .. }) => {
            tracing::warn!(error = %e, bytes_read = stream.read_bytes(), "{verb} request refused");
            Ok(Err(e.to_string()))
        }
        Err(e) => Err(unreadable(e, &format!("{verb}: body is not ExtenderArgs JSON"))),
    }
}

async fn filter_handler(State(state): State<Arc<ExtenderState>>, headers: HeaderMap, body: Body) -> Response {
    let (start, metrics) = (std::time::Instant::now(), state.metrics.clone());
    let response = filter_inner(state, headers, body).await;
    metrics.observe("filter", response.status(), start.elapsed());
    response
}

async fn prioritize_handler(State(state): State<Arc<ExtenderState>>, headers: HeaderMap, body: Body) -> Response {
    let (start, metrics) = (std::time::Instant::now(), state.metrics.clone());
    let response = prioritize_inner(state, headers, body).await;
    metrics.observe("prioritize", response.status(), start.elapsed());
    response
}

async fn bind_handler(State(state): State<Arc<ExtenderState>>, headers: HeaderMap, body: Body) -> Response {
    let (start, metrics) = (std::time::Instant::now(), state.metrics.clone());
    let timeout = state.cfg.request_timeout;
    let work = async {
        let bytes = read_small_body(&state, body, &headers).await?;
        let args: ExtenderBindingArgs = serde_json::from_slice(&bytes).map_err(|e| {
            Failure(StatusCode::BAD_REQUEST, format!("bind: body is not ExtenderBindingArgs JSON: {e}"))
        })?;
        Ok::<_, Failure>(state.bind(&args).await)
    };
    let response = match tokio::time::timeout(timeout, work).await {
        Ok(Ok(result)) => respond(&result),
        Ok(Err(failure)) => failure.into_response(),
        Err(_) => {
            tracing::warn!(?timeout, "bind request timed out");
            respond(&crate::wire::ExtenderBindingResult {
                error: format!("weft extender: bind did not finish within {timeout:?}"),
            })
        }
    };
    metrics.observe("bind", response.status(), start.elapsed());
    response
}

/// Aborts the task when dropped (a request given up stops feeding its body to the decoder).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Why a request got no decision.
enum Unanswered {
    /// Bad input or an internal failure, with the status and message to send.
    Failed(Failure),
    /// The request's time ran out (waiting for a slot or deciding).
    TimedOut,
}

impl From<Failure> for Unanswered {
    fn from(f: Failure) -> Unanswered {
        Unanswered::Failed(f)
    }
}

/// Waits for a decision slot, then runs `decide` on a blocking thread over the body as it arrives
/// ([`crate::stream`]: the body is read only as fast as `decide` decodes it, and never held
/// whole), all within the request timeout; `decide` gets the deadline so it stops when the time
/// is up, and the body stops reaching it when the answer was given up. The slot is held until
/// `decide` returns.
async fn decide<F>(state: Arc<ExtenderState>, headers: HeaderMap, body: Body, decide: F) -> Result<Vec<u8>, Unanswered>
where
    F: FnOnce(&ExtenderState, &mut JsonStream<BodyReader>, Deadline) -> Result<Vec<u8>, Unanswered> + Send + 'static,
{
    let timeout = state.cfg.request_timeout;
    let deadline = Deadline::at(std::time::Instant::now() + timeout);
    let work = async move {
        refuse_declared_oversize(&headers, (state.cfg.max_body_bytes, "--max-body-bytes"))?;
        let slot = state.deciding.clone().acquire_owned().await.map_err(shutting_down)?;
        let (reader, feed) = stream::body_reader(body);
        let _feed = AbortOnDrop(tokio::spawn(feed));
        let st = state.clone();
        let job = tokio::task::spawn_blocking(move || {
            let _slot = slot;
            let mut body = JsonStream::new(reader, st.stream_limits()).with_deadline(deadline);
            decide(&st, &mut body, deadline)
        });
        job.await.unwrap_or_else(|e| {
            Err(Failure(StatusCode::SERVICE_UNAVAILABLE, format!("weft extender internal error: {e}")).into())
        })
    };
    match tokio::time::timeout(timeout, work).await {
        Ok(r) => r,
        Err(_) => Err(Unanswered::TimedOut),
    }
}

async fn filter_inner(state: Arc<ExtenderState>, headers: HeaderMap, body: Body) -> Response {
    let timeout = state.cfg.request_timeout;
    let decided = decide(state, headers, body, |st, body, deadline| {
        let args = match read_extender_args(st, body, "filter")? {
            Ok(args) => args,
            Err(error) => return Ok(encode(&ExtenderFilterResult { error, ..ExtenderFilterResult::default() })?),
        };
        let result = st.filter_until(args, deadline).map_err(|_| Unanswered::TimedOut)?;
        Ok(encode(&result)?)
    })
    .await;
    match decided {
        Ok(bytes) => json_response(bytes),
        Err(Unanswered::Failed(failure)) => failure.into_response(),
        Err(Unanswered::TimedOut) => {
            tracing::warn!(?timeout, "filter request timed out");
            respond(&ExtenderFilterResult {
                error: format!("weft extender: filter did not finish within {timeout:?}"),
                ..ExtenderFilterResult::default()
            })
        }
    }
}

async fn prioritize_inner(state: Arc<ExtenderState>, headers: HeaderMap, body: Body) -> Response {
    let timeout = state.cfg.request_timeout;
    let with_reasons = state.cfg.debug_reasons
        && headers
            .get(DEBUG_HEADER)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.eq_ignore_ascii_case("true") || v == "1");
    let decided = decide(state, headers, body, move |st, body, deadline| {
        let args = read_extender_args(st, body, "prioritize")?
            .map_err(|e| Failure(StatusCode::BAD_REQUEST, format!("prioritize: {e}")))?;
        let mut args = args;
        let names = if args.nodes.is_none() { args.node_names.take() } else { None };
        match st.prioritize_names(&args, names, with_reasons, deadline) {
            Ok(list) => Ok(encode(&list)?),
            Err(ExtenderError::Expired(_)) => Err(Unanswered::TimedOut),
            Err(e) => {
                tracing::warn!(error = %e, "prioritize request cannot be answered");
                Err(Failure(StatusCode::BAD_REQUEST, format!("prioritize: {e}")).into())
            }
        }
    })
    .await;
    match decided {
        Ok(bytes) => json_response(bytes),
        Err(Unanswered::Failed(failure)) => failure.into_response(),
        Err(Unanswered::TimedOut) => {
            tracing::warn!(?timeout, "prioritize request timed out");
            Failure(StatusCode::SERVICE_UNAVAILABLE, format!("prioritize did not finish within {timeout:?}"))
                .into_response()
        }
    }
}

/// A 200 JSON answer of `value`, or the failure to encode it.
fn respond<T: serde::Serialize>(value: &T) -> Response {
    match encode(value) {
        Ok(bytes) => json_response(bytes),
        Err(f) => f.into_response(),
    }
}

fn encode<T: serde::Serialize>(value: &T) -> Result<Vec<u8>, Failure> {
    serde_json::to_vec(value)
        .map_err(|e| Failure(StatusCode::SERVICE_UNAVAILABLE, format!("cannot encode the response: {e}")))
}

fn decode_volcano<T: serde::de::DeserializeOwned>(bytes: &[u8], what: &str) -> Result<T, Failure> {
    serde_json::from_slice(bytes).map_err(|e| {
        Failure(
            StatusCode::BAD_REQUEST,
            format!(
                "volcano {what}: body is not vc-scheduler's request JSON (line {}, column {}): {e}",
                e.line(),
                e.column()
            ),
        )
    })
}

/// How a vc-scheduler verb reads its body: the stream and the node limit.
type VolcanoReader<R> = fn(&mut JsonStream<BodyReader>, usize) -> Result<R, StreamError>;
/// How a vc-scheduler verb answers what it read, within the deadline.
type VolcanoAnswer<R, A> = fn(&ExtenderState, R, Deadline) -> Result<A, Expired>;

/// A vc-scheduler verb answered by a decision (predicate, prioritize): the body read by `read`,
/// `answer` run under the decision slots and the request deadline, `refused` sent with the reason
/// when time ran out or the request names too many nodes. `(verb, metric)`: the route's verb and
/// the verb label of the request metrics.
async fn volcano_decision<R, A>(
    state: Arc<ExtenderState>,
    headers: HeaderMap,
    body: Body,
    (verb, metric): (&'static str, &'static str),
    (read, answer): (VolcanoReader<R>, VolcanoAnswer<R, A>),
    refused: fn(String) -> A,
) -> Response
where
    R: 'static,
    A: serde::Serialize + 'static,
{
    let (start, metrics, timeout) = (std::time::Instant::now(), state.metrics.clone(), state.cfg.request_timeout);
    let decided = decide(state, headers, body, move |st, body, deadline| {
        let request = match read(body, st.cfg.max_nodes_per_request) {
            Ok(request) => request,
            Err(e @ StreamError::TooManyNodes { .. }) => {
                tracing::warn!(error = %e, bytes_read = body.read_bytes(), "volcano {verb} request refused");
                return Ok(encode(&refused(e.to_string()))?);
            }
            Err(e) => return Err(unreadable(e, &format!("volcano {verb}: body is not vc-scheduler's request JSON"))),
        };
        Ok(encode(&answer(st, request, deadline).map_err(|_| Unanswered::TimedOut)?)?)
    })
    .await;
    let response = match decided {
        Ok(bytes) => json_response(bytes),
        Err(Unanswered::Failed(failure)) => failure.into_response(),
        Err(Unanswered::TimedOut) => {
            respond(&refused(format!("weft extender: {verb} did not finish within {timeout:?}")))
        }
    };
    metrics.observe(metric, response.status(), start.elapsed());
    response
}

async fn volcano_predicate_handler(
    State(state): State<Arc<ExtenderState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    volcano_decision(
        state,
        headers,
        body,
        ("predicate", "volcano_predicate"),
        (|body, _| volcano::read_predicate(body), ExtenderState::volcano_predicate),
        |error_message| volcano::PredicateResponse { error_message, code: volcano::ERROR },
    )
    .await
}

async fn volcano_prioritize_handler(
    State(state): State<Arc<ExtenderState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    volcano_decision(
        state,
        headers,
        body,
        ("prioritize", "volcano_prioritize"),
        (volcano::read_prioritize, ExtenderState::volcano_prioritize),
        |error_message| volcano::PrioritizeResponse { node_score: BTreeMap::new(), error_message },
    )
    .await
}

/// AllocateFunc and DeallocateFunc: an API write each, like bind, under the request timeout.
async fn volcano_event(state: Arc<ExtenderState>, headers: HeaderMap, body: Body, event: volcano::Event) -> Response {
    let (start, metrics, timeout) = (std::time::Instant::now(), state.metrics.clone(), state.cfg.request_timeout);
    let what = event.verb();
    let work = async {
        let bytes = read_small_body(&state, body, &headers).await?;
        let request = decode_volcano(&bytes, what)?;
        Ok::<_, Failure>(match event {
            volcano::Event::Allocate => state.volcano_allocate(request).await,
            volcano::Event::Deallocate => state.volcano_deallocate(request).await,
        })
    };
    let response = match tokio::time::timeout(timeout, work).await {
        Ok(Ok(answer)) => {
            if !answer.error_message.is_empty() {
                tracing::warn!("vc-scheduler {what}: {}", answer.error_message);
            }
            respond(&answer)
        }
        Ok(Err(failure)) => failure.into_response(),
        Err(_) => respond(&volcano::EventHandlerResponse {
            error_message: format!("weft extender: {what} did not finish within {timeout:?}"),
        }),
    };
    metrics.observe(event.metric(), response.status(), start.elapsed());
    response
}

async fn volcano_allocate_handler(State(state): State<Arc<ExtenderState>>, headers: HeaderMap, body: Body) -> Response {
    volcano_event(state, headers, body, volcano::Event::Allocate).await
}

async fn volcano_deallocate_handler(
    State(state): State<Arc<ExtenderState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    volcano_event(state, headers, body, volcano::Event::Deallocate).await
}
