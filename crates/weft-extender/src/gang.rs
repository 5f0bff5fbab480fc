//! Gangs in the extender: a group's members are planned as one decision ([`weft_gang::plan`]) when
//! the first of them is filtered, and each member is then steered to its planned node (filter and
//! prioritize) and given its planned GPU set (bind, or vc-scheduler's AllocateFunc). Operator
//! documentation: `docs/gang.md`, "In the scheduler".
//!
//! - **Who is a member** ([`membership`]): a pod with weft's `weft.io/gang` (and `weft.io/gang-size`)
//!   annotations, or with Volcano's `scheduling.k8s.io/group-name` naming a PodGroup the view knows
//!   (its `spec.minMember` is the size, its `spec.networkTopology` the constraint). A group of one is
//!   not a gang.
//! - **The plan** is made over every node the view knows, with what each has free now (its pods,
//!   the reservations, and the other gangs' plans), and held for `gang_plan_ttl` after the last
//!   member's activity: the GPUs of members not yet placed count as used for every pod outside the
//!   group.
//! - **Re-planning**: a member whose request offers none of the plan's open nodes (taken since, or
//!   filtered out by the scheduler) re-plans the members not yet placed over the nodes its request
//!   does offer, inside the plan's domain first. When the rest cannot be placed within the
//!   constraint, every node fails with the reason: the group is never split silently.
//!
//! The registry ([`Gangs`]) is per process: replicas of the extender each plan the gangs whose
//! members they see (the node records still keep their devices apart).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};
use weft_alloc::SetQuality;
use weft_gang::{
    ClusterNode, Gang, GpuSets, HyperNode, LabelLevels, NetworkModel, NetworkTopologySpec, NodeFree, Plan,
    TierConstraint,
};
use weft_net::joint::VfAsk;

use crate::cache::PreparedTopology;

/// weft's gang annotation: the group's name (pods of one namespace with one name are one group).
pub const GANG_ANNOTATION: &str = "weft.io/gang";
/// weft's gang size annotation: how many members the group has (an integer ≥ 1). With Volcano's
/// group annotation it overrides the PodGroup's `minMember`.
pub const GANG_SIZE_ANNOTATION: &str = "weft.io/gang-size";
/// Volcano's pod annotation naming the pod's PodGroup (set by Volcano's job controller, or by hand
/// for a plain PodGroup).
pub const VOLCANO_GROUP_ANNOTATION: &str = "scheduling.k8s.io/group-name";
/// The annotation bind writes on a gang member: its place in the plan ([`GangNote`], JSON).
pub const GANG_PLAN_ANNOTATION: &str = "weft.io/gang-plan";

/// The largest gang size weft plans (a bound on what one annotation can make it hold).
pub const MAX_GANG_SIZE: usize = 100_000;

/// A group: its namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GroupKey {
    /// The members' namespace.
    pub namespace: String,
    /// The group's name.
    pub name: String,
}

impl std::fmt::Display for GroupKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// The fields of a Volcano PodGroup's `spec` (`scheduling.volcano.sh/v1beta1`) weft reads.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodGroupSpec {
    /// The gang's size: the Job's `minAvailable`.
    #[serde(default)]
    pub min_member: i64,
    /// How far apart the members may be.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_topology: Option<NetworkTopologySpec>,
}

/// A pod's group, with the group's size and constraint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// The group.
    pub key: GroupKey,
    /// How many members the group has.
    pub size: usize,
    /// How far apart they may be.
    pub constraint: TierConstraint,
}

/// Why a pod's group cannot be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MembershipError {
    /// An annotation is malformed: the pod's own error, named.
    Bad(String),
    /// The group is not known yet (a PodGroup the view has not seen): the pod waits.
    Waiting(String),
}

/// `pod`'s group, if it is in one of more than one member. `pod_group` looks up a Volcano PodGroup
/// by namespace and name.
pub fn membership(
    pod: &Pod,
    pod_group: impl Fn(&str, &str) -> Option<Arc<PodGroupSpec>>,
) -> Result<Option<Member>, MembershipError> {
    let Some(annotations) = pod.metadata.annotations.as_ref() else { return Ok(None) };
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let pod_name = format!("{namespace}/{}", pod.metadata.name.as_deref().unwrap_or_default());
    let bad = |m: String| MembershipError::Bad(format!("pod {pod_name}: {m}"));
    let size_annotation = match annotations.get(GANG_SIZE_ANNOTATION) {
        None => None,
        Some(v) => match v.trim().parse::<usize>() {
            Ok(n) if (1..=MAX_GANG_SIZE).contains(&n) => Some(n),
            _ => return Err(bad(format!("{GANG_SIZE_ANNOTATION} `{v}` is not a gang size (1 to {MAX_GANG_SIZE})"))),
        },
    };
    let from_pod = TierConstraint::from_annotations(annotations).map_err(|e| bad(e.to_string()))?;
    if let Some(name) = annotations.get(GANG_ANNOTATION) {
        let name = name.trim();
        if name.is_empty() {
            return Err(bad(format!("{GANG_ANNOTATION} is empty")));
        }
        let Some(size) = size_annotation else {
            return Err(bad(format!(
                "{GANG_ANNOTATION} `{name}` needs {GANG_SIZE_ANNOTATION} (the number of members)"
            )));
        };
        let key = GroupKey { namespace, name: name.to_string() };
        let member = Member { key, size, constraint: from_pod.unwrap_or_else(TierConstraint::soft) };
        return Ok((member.size > 1).then_some(member));
    }
    let Some(group) = annotations.get(VOLCANO_GROUP_ANNOTATION).map(|g| g.trim()).filter(|g| !g.is_empty()) else {
        return Ok(None);
    };
    let Some(spec) = pod_group(&namespace, group) else {
        return Err(MembershipError::Waiting(format!(
            "gang: PodGroup {namespace}/{group} ({VOLCANO_GROUP_ANNOTATION} of pod {pod_name}) is not known to the \
             extender yet"
        )));
    };
    let size = size_annotation.unwrap_or_else(|| usize::try_from(spec.min_member).unwrap_or(0).min(MAX_GANG_SIZE));
    // The PodGroup's networkTopology is what Volcano schedules by (its controller copies a plain
    // pod's annotations there); weft's own annotation on the pod, when present, wins.
    let constraint =
        match (&spec.network_topology, annotations.contains_key(weft_gang::constraint::GANG_TOPOLOGY_ANNOTATION)) {
            (Some(nt), false) => {
                TierConstraint::from_volcano(nt, &format!("PodGroup {namespace}/{group} spec.networkTopology"))
                    .map_err(|e| bad(e.to_string()))?
            }
            _ => from_pod.unwrap_or_else(TierConstraint::soft),
        };
    let key = GroupKey { namespace, name: group.to_string() };
    Ok((size > 1).then_some(Member { key, size, constraint }))
}

/// What a gang member records on its pod ([`GANG_PLAN_ANNOTATION`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GangNote {
    /// `<namespace>/<name>`.
    pub group: String,
    /// Members in the group.
    pub members: usize,
    /// The domain every member is planned in, and its tier's name.
    pub domain: String,
    /// The domain's tier.
    pub tier: String,
    /// The member's rank (consecutive ranks are neighbours). A member placed off the plan takes
    /// an open rank too (its `followed` is false), so the plan stops holding GPUs for it.
    pub rank: usize,
    /// Whether the member got its planned node and GPU set.
    pub followed: bool,
}

/// One member's place in a held plan.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Rank {
    node: String,
    gpus: Vec<usize>,
    /// The pod (UID) that took it.
    pod: Option<String>,
}

/// A held plan.
#[derive(Clone, Debug)]
struct Held {
    gpus: u64,
    vfs: VfAsk,
    size: usize,
    domain: String,
    tier: String,
    ranks: Vec<Rank>,
    until: Instant,
}

impl Held {
    fn open_nodes(&self, uid: &str) -> BTreeSet<String> {
        self.ranks.iter().filter(|r| r.pod.as_deref().is_none_or(|p| p == uid)).map(|r| r.node.clone()).collect()
    }

    fn untaken(&self) -> usize {
        self.ranks.iter().filter(|r| r.pod.is_none()).count()
    }
}

/// How [`Gangs::steer`] plans: `(count, anchors, over)` (see there).
pub type PlanFn<'a> = dyn FnMut(usize, &[String], Option<&NodeSet<'_>>) -> Result<Plan, String> + 'a;

/// Node names (a request's passing nodes).
pub type NodeSet<'a> = rustc_hash::FxHashSet<&'a str>;

/// What a member's filter and prioritize do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Steer {
    /// Not steered (not a member; or a member of another shape than its group's plan).
    Free,
    /// Only these nodes (its plan's open ranks) may take it.
    To {
        /// Node names.
        nodes: BTreeSet<String>,
        /// Why the others fail.
        why: String,
    },
    /// No node may take it now: the rest of the group does not fit.
    Blocked(String),
}

/// A member's rank on a node, when bind decides its devices.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedRank {
    /// Its planned GPUs.
    pub gpus: Vec<usize>,
    /// Whether the rank is on the node bind was asked for.
    pub on_node: bool,
    /// The note to record: the rank, and `followed` (whether the rank is on that node; bind clears it when the
    /// planned GPUs were not all free).
    pub note: GangNote,
}

/// The plans held by this process.
#[derive(Debug)]
pub struct Gangs {
    ttl: Duration,
    inner: Mutex<GangsInner>,
}

#[derive(Debug, Default)]
struct GangsInner {
    plans: FxHashMap<GroupKey, Held>,
    /// Per node, the GPUs of untaken ranks, per group.
    holds: FxHashMap<String, Vec<(GroupKey, u128)>>,
}

impl GangsInner {
    fn drop_expired(&mut self, now: Instant) {
        let before = self.plans.len();
        self.plans.retain(|k, h| {
            let live = h.until > now;
            if !live {
                tracing::info!(group = %k, "gang plan expired");
            }
            live
        });
        if self.plans.len() != before {
            self.rebuild_holds();
        }
    }

    fn rebuild_holds(&mut self) {
        self.holds.clear();
        for (key, held) in &self.plans {
            for r in held.ranks.iter().filter(|r| r.pod.is_none()) {
                let mask = r.gpus.iter().filter(|&&g| g < 128).fold(0u128, |m, &g| m | 1u128 << g);
                let entry = self.holds.entry(r.node.clone()).or_default();
                match entry.iter_mut().find(|(k, _)| k == key) {
                    Some((_, m)) => *m |= mask,
                    None => entry.push((key.clone(), mask)),
                }
            }
        }
    }
}

impl Gangs {
    /// A registry whose plans are held for `ttl` after their last activity.
    pub fn new(ttl: Duration) -> Gangs {
        Gangs { ttl, inner: Mutex::default() }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, GangsInner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The GPUs on `node` that held plans keep for members not yet placed, except `group`'s own.
    pub fn held(&self, node: &str, except: Option<&GroupKey>) -> u128 {
        let inner = self.lock();
        inner.holds.get(node).map_or(0, |v| held_except(v, except))
    }

    /// [`Gangs::held`] of every node where a plan holds GPUs, in one look (a request's candidates
    /// read it once, not under one lock each); empty when no plan holds any.
    pub fn held_by_node(&self, except: Option<&GroupKey>) -> FxHashMap<String, u128> {
        let inner = self.lock();
        inner.holds.iter().map(|(node, v)| (node.clone(), held_except(v, except))).filter(|(_, g)| *g != 0).collect()
    }

    /// The steering for `member` (pod `uid`, asking `gpus` and `vfs`) among `passing` (the nodes
    /// that passed the filter for it). `plan(count, anchors, over)` plans `count` members over the
    /// nodes in `over` (all nodes when None) so that the whole group, with the members already on
    /// the nodes `anchors`, stays within the constraint; it is called without the registry locked.
    pub fn steer(
        &self,
        member: &Member,
        uid: &str,
        (gpus, vfs): (u64, &VfAsk),
        passing: &NodeSet<'_>,
        now: Instant,
        plan: &mut PlanFn<'_>,
    ) -> Steer {
        // At most twice: a first plan over every node, then, when this request offers none of its
        // open nodes, a re-plan over what it offers.
        for _ in 0..2 {
            if let Some(done) = self.steer_once(member, uid, (gpus, vfs), passing, now, plan) {
                return done;
            }
        }
        let inner = self.lock();
        match inner.plans.get(&member.key) {
            Some(h) => steer_to(&member.key, h, h.open_nodes(uid)),
            None => Steer::Blocked(format!("gang {}: no plan", member.key)),
        }
    }

    /// One look (and plan, when needed); None when the plan just made offers this request nothing.
    fn steer_once(
        &self,
        member: &Member,
        uid: &str,
        (gpus, vfs): (u64, &VfAsk),
        passing: &NodeSet<'_>,
        now: Instant,
        plan: &mut PlanFn<'_>,
    ) -> Option<Steer> {
        // Look first; plan without the lock (planning reads the accounting, which takes it).
        let (need, within) = {
            let mut inner = self.lock();
            inner.drop_expired(now);
            match inner.plans.get(&member.key) {
                Some(h) if h.gpus != gpus || &h.vfs != vfs => return Some(Steer::Free),
                Some(h) => {
                    let open = h.open_nodes(uid);
                    if open.iter().any(|n| passing.contains(n.as_str())) {
                        return Some(steer_to(&member.key, h, open));
                    }
                    // The rest (or, all taken, one more member) over what this request offers,
                    // beside the members already placed.
                    let anchors: Vec<String> =
                        h.ranks.iter().filter(|r| r.pod.is_some()).map(|r| r.node.clone()).collect();
                    (h.untaken().max(1), Some(anchors))
                }
                None => (member.size, None),
            }
        };
        let over = within.as_ref().map(|_| passing);
        let made = plan(need, within.as_deref().unwrap_or_default(), over);
        let mut inner = self.lock();
        let key = member.key.clone();
        let p = match made {
            Ok(p) => p,
            Err(why) => {
                let size = member.size;
                return Some(Steer::Blocked(format!("gang {key}: {need} member(s) of {size} cannot be placed: {why}")));
            }
        };
        let ranks: Vec<Rank> =
            p.members.iter().map(|m| Rank { node: m.node.clone(), gpus: m.gpus.clone(), pod: None }).collect();
        match inner.plans.get_mut(&key) {
            Some(h) if within.is_some() => {
                // Re-plan: the taken ranks stay; the untaken ones are replaced.
                h.ranks.retain(|r| r.pod.is_some());
                h.ranks.extend(ranks);
                if p.domain != h.domain {
                    tracing::info!(group = %key, from = %h.domain, to = %p.domain, "gang re-planned outside its domain");
                    h.domain = p.domain.clone();
                    h.tier = p.tier.clone();
                }
                h.until = now + self.ttl;
            }
            Some(_) => {} // another request planned it meanwhile: keep theirs
            None => {
                tracing::info!(group = %key, domain = %p.domain, tier = %p.tier, nodes = p.nodes, "gang planned");
                let held = Held {
                    gpus,
                    vfs: vfs.clone(),
                    size: member.size,
                    domain: p.domain,
                    tier: p.tier,
                    ranks,
                    until: now + self.ttl,
                };
                inner.plans.insert(key.clone(), held);
            }
        }
        inner.rebuild_holds();
        let h = &inner.plans[&key];
        let open = h.open_nodes(uid);
        if open.iter().any(|n| passing.contains(n.as_str())) || within.is_some() {
            return Some(steer_to(&key, h, open));
        }
        None
    }

    /// The nodes `uid` of `group` is planned on (its open ranks), for prioritize; None without a
    /// held plan of that shape.
    pub fn open_nodes(&self, group: &GroupKey, uid: &str, (gpus, vfs): (u64, &VfAsk)) -> Option<BTreeSet<String>> {
        let inner = self.lock();
        inner.plans.get(group).filter(|h| h.gpus == gpus && &h.vfs == vfs).map(|h| h.open_nodes(uid))
    }

    /// The rank `uid` of `group` takes on `node`: its own there, else the first untaken one there;
    /// else (the scheduler placed it off the plan) the first untaken one anywhere, whose GPUs are
    /// not kept for it (`on_node` false). None without a held plan or an open rank.
    pub fn rank_on(&self, group: &GroupKey, uid: &str, node: &str) -> Option<PlannedRank> {
        let inner = self.lock();
        let h = inner.plans.get(group)?;
        let here = h
            .ranks
            .iter()
            .position(|r| r.node == node && r.pod.as_deref() == Some(uid))
            .or_else(|| h.ranks.iter().position(|r| r.node == node && r.pod.is_none()));
        let (pick, on_node) = match here {
            Some(i) => (i, true),
            None => (h.ranks.iter().position(|r| r.pod.is_none() || r.pod.as_deref() == Some(uid))?, false),
        };
        let note = GangNote {
            group: group.to_string(),
            members: h.size,
            domain: h.domain.clone(),
            tier: h.tier.clone(),
            rank: pick,
            followed: on_node,
        };
        Some(PlannedRank { gpus: h.ranks[pick].gpus.clone(), on_node, note })
    }

    /// `uid` takes `rank` of `group`'s plan (bind decided it): its GPUs stop being held for others,
    /// and the plan is held another ttl.
    pub fn take(&self, group: &GroupKey, uid: &str, rank: usize, now: Instant) {
        let mut inner = self.lock();
        let ttl = self.ttl;
        if let Some(h) = inner.plans.get_mut(group) {
            for r in &mut h.ranks {
                if r.pod.as_deref() == Some(uid) {
                    r.pod = None;
                }
            }
            if let Some(r) = h.ranks.get_mut(rank) {
                r.pod = Some(uid.to_string());
            }
            h.until = now + ttl;
        }
        inner.rebuild_holds();
    }

    /// `uid`'s rank is open again (its bind failed for certain, or vc-scheduler took its allocation
    /// back).
    pub fn release(&self, uid: &str) {
        let mut inner = self.lock();
        let mut changed = false;
        for h in inner.plans.values_mut() {
            for r in &mut h.ranks {
                if r.pod.as_deref() == Some(uid) {
                    r.pod = None;
                    changed = true;
                }
            }
        }
        if changed {
            inner.rebuild_holds();
        }
    }
}

/// A node's held GPUs over its plans' entries, but `except`'s.
fn held_except(entries: &[(GroupKey, u128)], except: Option<&GroupKey>) -> u128 {
    entries.iter().filter(|(k, _)| Some(k) != except).fold(0, |m, (_, g)| m | g)
}

fn steer_to(key: &GroupKey, h: &Held, open: BTreeSet<String>) -> Steer {
    // One line per failed node goes back to the scheduler: kept short (the plan's nodes are in the
    // extender's log and in each member's note).
    let why = format!("gang {key}: planned in {} ({})", h.domain, h.tier);
    Steer::To { nodes: open, why }
}

/// Where the extender reads the cluster's network from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum NetworkLevels {
    /// Volcano's HyperNodes when the cluster has any; else NVIDIA Topograph's node labels, as deep
    /// as the nodes carry them, with GFD's GPU clique innermost (when no node has Topograph labels:
    /// the cliques, else the whole cluster, are the only domains).
    #[default]
    Auto,
    /// Node labels: an ordered list of keys, top first.
    Levels(LabelLevels),
}

/// One node for a plan: its name, labels and what it has free.
pub struct PlanNode<'a> {
    /// Its name.
    pub name: &'a str,
    /// Its labels.
    pub labels: Option<&'a BTreeMap<String, String>>,
    /// Its topology, when it has one.
    pub prepared: Option<&'a PreparedTopology>,
    /// GPUs in use (pods, reservations, other gangs).
    pub used: u128,
    /// VFs in use (PCI addresses).
    pub vfs_used: &'a BTreeSet<String>,
}

/// The cluster's network as gang plans read it, for one list of nodes: built once per change of
/// the nodes' names and labels or of the HyperNodes, and reused by every plan meanwhile.
#[derive(Debug)]
pub struct Network {
    model: NetworkModel,
    /// The nodes it was built for, in the order given.
    names: Vec<String>,
    /// Model node → position in `names`.
    index: Vec<usize>,
}

impl Network {
    /// The network of `nodes` (name and labels, in the view's order), from `hypernodes` when
    /// `levels` is [`NetworkLevels::Auto`] and there are any, else from the labels.
    pub fn build(
        (levels, hypernodes): (&NetworkLevels, &[HyperNode]),
        nodes: &[(&str, Option<&BTreeMap<String, String>>)],
    ) -> Result<Network, String> {
        let cluster: Vec<ClusterNode> = nodes
            .iter()
            .map(|(name, labels)| ClusterNode { name: name.to_string(), labels: labels.cloned().unwrap_or_default() })
            .collect();
        let network = |e: weft_gang::ModelError| format!("the cluster's network: {e}");
        let mut model = match levels {
            NetworkLevels::Auto if !hypernodes.is_empty() => {
                weft_gang::from_hypernodes(hypernodes, &cluster).map_err(network)?
            }
            NetworkLevels::Auto => {
                weft_gang::from_labels(&LabelLevels::topograph_for(&cluster), &cluster).map_err(network)?
            }
            NetworkLevels::Levels(l) => weft_gang::from_labels(l, &cluster).map_err(network)?,
        };
        model.rails_from_labels(&cluster).map_err(|e| format!("the cluster's rails: {e}"))?;
        let by_name: FxHashMap<&str, usize> = nodes.iter().enumerate().map(|(i, (n, _))| (*n, i)).collect();
        let index = (0..model.node_count()).map(|m| by_name.get(model.node_name(m)).copied().unwrap_or(0)).collect();
        let names = cluster.into_iter().map(|c| c.name).collect();
        Ok(Network { model, names, index })
    }

    /// Whether it was built for exactly these nodes, in this order.
    pub fn is_for(&self, names: &[String]) -> bool {
        self.names == names
    }
}

/// Plans `count` members asking `gpus` GPUs and `vfs` VFs each over `nodes` (pure; the nodes
/// `network` was built for, in its order), with `constraint`, so that they and the members already
/// placed on `anchors` are within one domain the constraint allows: the tightest domain holding
/// the anchors first, then its ancestors. `over`: the only nodes that may be used.
#[allow(clippy::too_many_arguments)]
pub fn plan_over(
    network: &Network,
    nodes: &[PlanNode<'_>],
    count: usize,
    (gpus, vfs): (u64, &VfAsk),
    constraint: &TierConstraint,
    anchors: &[String],
    over: Option<&NodeSet<'_>>,
    quality: SetQuality,
) -> Result<Plan, String> {
    if nodes.len() != network.names.len() || nodes.iter().zip(&network.names).any(|(n, m)| n.name != m) {
        return Err("the cluster's nodes changed while planning; the next member plans again".into());
    }
    let (model, index) = (&network.model, &network.index);
    let free: Vec<NodeFree> = index
        .iter()
        .map(|&i| {
            let n = &nodes[i];
            if over.is_some_and(|o| !o.contains(n.name)) {
                return NodeFree::default();
            }
            node_free(n, vfs)
        })
        .collect();
    let gang = Gang {
        members: count,
        gpus_per_member: usize::try_from(gpus).unwrap_or(usize::MAX),
        vfs_per_member: vfs.iter().map(|(p, &n)| (p.clone(), u32::try_from(n).unwrap_or(u32::MAX))).collect(),
        constraint: constraint.clone(),
        rail_align: None,
    };
    let mut sets = PreparedSets { nodes, index, quality };
    if anchors.is_empty() {
        return weft_gang::plan(model, &free, &gang, &mut sets).map_err(|e| e.to_string());
    }
    // The whole group must share a domain: the anchors' tightest common one, then each ancestor
    // the constraint allows.
    let anchor_nodes: Vec<usize> = anchors.iter().filter_map(|a| model.node_index(a)).collect();
    let limit = allowed_tier(model, constraint)?;
    let mut domain = model.common_domain(&anchor_nodes);
    let mut last = String::new();
    while let Some(d) = domain {
        let dom = &model.domains()[d];
        if limit.is_some_and(|l| dom.tier > l) {
            break;
        }
        let inside: BTreeSet<usize> = model.domain_nodes(d).iter().copied().collect();
        let narrowed: Vec<NodeFree> = free
            .iter()
            .enumerate()
            .map(|(m, f)| if inside.contains(&m) { f.clone() } else { NodeFree::default() })
            .collect();
        match weft_gang::plan(model, &narrowed, &gang, &mut sets) {
            Ok(mut p) => {
                // The group's domain is this one (the rest may sit in a tighter one inside it).
                p.domain = dom.name.clone();
                p.tier = model.tiers()[dom.tier].name.clone();
                p.tier_number = model.tiers()[dom.tier].number;
                return Ok(p);
            }
            Err(e) => last = format!("within {} ({}): {e}", dom.name, model.tiers()[dom.tier].name),
        }
        domain = dom.parent;
    }
    Err(if last.is_empty() { "the members already placed are beyond the constraint's tier".into() } else { last })
}

/// The highest tier index `constraint` allows (None: any).
fn allowed_tier(model: &NetworkModel, constraint: &TierConstraint) -> Result<Option<usize>, String> {
    match (constraint.mode, &constraint.highest) {
        (weft_gang::Mode::Soft, _) | (weft_gang::Mode::Hard, None) => Ok(None),
        (weft_gang::Mode::Hard, Some(tier @ weft_gang::TierRef::Number(_))) => {
            Ok(Some(model.tier_index(tier).unwrap_or(0)))
        }
        (weft_gang::Mode::Hard, Some(tier @ weft_gang::TierRef::Name(name))) => {
            model.tier_index(tier).map(Some).ok_or_else(|| {
                format!("highest tier `{name}` is not a tier of this cluster's network ({})", model.tiers_text())
            })
        }
    }
}

fn node_free(n: &PlanNode<'_>, vfs: &VfAsk) -> NodeFree {
    let Some(p) = n.prepared else { return NodeFree::default() };
    let all = if p.len() >= 128 { u128::MAX } else { (1u128 << p.len()) - 1 };
    let mut free = BTreeMap::new();
    if let Some(t) = p.with_vfs() {
        for physnet in vfs.iter().filter(|(_, k)| **k > 0).map(|(p, _)| p) {
            let count = t
                .vfs()
                .iter()
                .filter(|v| v.physnet.as_deref() == Some(physnet.as_str()) && !n.vfs_used.contains(&v.pci_address))
                .count();
            free.insert(physnet.clone(), u32::try_from(count).unwrap_or(u32::MAX));
        }
    }
    NodeFree { gpus: all & !n.used, vfs: free }
}

/// weft-alloc's set choice over the extender's prepared topologies.
struct PreparedSets<'a, 'b> {
    nodes: &'a [PlanNode<'b>],
    index: &'a [usize],
    quality: SetQuality,
}

impl GpuSets for PreparedSets<'_, '_> {
    fn choose(&mut self, node: usize, available: &[usize], count: usize) -> Result<Vec<usize>, String> {
        let n = self.index.get(node).and_then(|&i| self.nodes.get(i)).ok_or_else(|| format!("no node {node}"))?;
        let p = n.prepared.ok_or_else(|| format!("node {} has no topology", n.name))?;
        weft_alloc::choose_set(p, available, count, self.quality).map(|a| a.gpus).map_err(|e| e.to_string())
    }

    fn nic(&self, node: usize, gpu: usize) -> Option<&str> {
        let n = self.nodes.get(*self.index.get(node)?)?;
        let t = n.prepared?.with_vfs()?;
        (0..t.nics.len())
            .filter_map(|k| t.nic_link(gpu, k).map(|r| (r, k)))
            .max_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)))
            .map(|(_, k)| t.nics[k].name.as_str())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn pod(annotations: &[(&str, &str)]) -> Pod {
        let mut p = Pod::default();
        p.metadata.namespace = Some("ml".into());
        p.metadata.name = Some("w-0".into());
        p.metadata.annotations = Some(annotations.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
        p
    }

    fn no_groups(_: &str, _: &str) -> Option<Arc<PodGroupSpec>> {
        None
    }

    #[test]
    fn weft_annotations_make_a_gang_with_a_soft_constraint_by_default() {
        let m =
            membership(&pod(&[(GANG_ANNOTATION, "train"), (GANG_SIZE_ANNOTATION, "4")]), no_groups).unwrap().unwrap();
        assert_eq!(m.key, GroupKey { namespace: "ml".into(), name: "train".into() });
        assert_eq!(m.size, 4);
        assert_eq!(m.constraint, TierConstraint::soft());
    }

    #[test]
    fn a_group_of_one_and_a_pod_without_annotations_are_not_gangs() {
        assert_eq!(membership(&pod(&[(GANG_ANNOTATION, "t"), (GANG_SIZE_ANNOTATION, "1")]), no_groups), Ok(None));
        assert_eq!(membership(&pod(&[]), no_groups), Ok(None));
    }

    #[test]
    fn malformed_gang_annotations_are_errors_naming_the_pod_and_the_annotation() {
        for bad in [
            vec![(GANG_ANNOTATION, "t")],
            vec![(GANG_ANNOTATION, " "), (GANG_SIZE_ANNOTATION, "2")],
            vec![(GANG_ANNOTATION, "t"), (GANG_SIZE_ANNOTATION, "0")],
            vec![(GANG_ANNOTATION, "t"), (GANG_SIZE_ANNOTATION, "many")],
            vec![(GANG_ANNOTATION, "t"), (GANG_SIZE_ANNOTATION, "2"), ("weft.io/network-topology", "tight")],
        ] {
            match membership(&pod(&bad), no_groups) {
                Err(MembershipError::Bad(m)) => assert!(m.starts_with("pod ml/w-0: "), "{m}"),
                other => panic!("{bad:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_volcano_member_takes_size_and_constraint_from_its_podgroup_and_waits_for_an_unknown_one() {
        let spec = PodGroupSpec {
            min_member: 3,
            network_topology: Some(NetworkTopologySpec {
                mode: Some("hard".into()),
                highest_tier_allowed: Some(1),
                highest_tier_name: None,
            }),
        };
        let groups = |ns: &str, name: &str| (ns == "ml" && name == "job-1").then(|| Arc::new(spec.clone()));
        let m = membership(&pod(&[(VOLCANO_GROUP_ANNOTATION, "job-1")]), groups).unwrap().unwrap();
        assert_eq!((m.key.name.as_str(), m.size), ("job-1", 3));
        assert_eq!(m.constraint, TierConstraint::hard(weft_gang::TierRef::Number(1)));
        // weft's size annotation overrides minMember.
        let m = membership(&pod(&[(VOLCANO_GROUP_ANNOTATION, "job-1"), (GANG_SIZE_ANNOTATION, "5")]), groups)
            .unwrap()
            .unwrap();
        assert_eq!(m.size, 5);
        match membership(&pod(&[(VOLCANO_GROUP_ANNOTATION, "other")]), groups) {
            Err(MembershipError::Waiting(m)) => assert!(m.contains("PodGroup ml/other"), "{m}"),
            other => panic!("{other:?}"),
        }
        // A plain pod's auto-created PodGroup (minMember 1) is not a gang.
        let one = |_: &str, _: &str| Some(Arc::new(PodGroupSpec { min_member: 1, network_topology: None }));
        assert_eq!(membership(&pod(&[(VOLCANO_GROUP_ANNOTATION, "podgroup-x")]), one), Ok(None));
    }

    #[test]
    fn a_taken_rank_stops_holding_its_gpus_and_a_release_holds_them_again() {
        let gangs = Gangs::new(Duration::from_secs(60));
        let member = Member {
            key: GroupKey { namespace: "ml".into(), name: "g".into() },
            size: 2,
            constraint: TierConstraint::soft(),
        };
        let plan = Plan {
            domain: "leaf-a".into(),
            tier: "leaf".into(),
            tier_number: 1,
            members: (0..2)
                .map(|r| weft_gang::MemberPlan {
                    rank: r,
                    node: format!("n{r}"),
                    gpus: vec![0, 1],
                    nics: vec![None, None],
                    rails: vec![None, None],
                })
                .collect(),
            nodes: 2,
            rail_aligned: None,
        };
        let now = Instant::now();
        let passing: NodeSet<'_> = ["n0", "n1"].into_iter().collect();
        let steer = gangs.steer(&member, "u0", (2, &VfAsk::new()), &passing, now, &mut |n, within, _| {
            assert_eq!((n, within), (2, &[][..]));
            Ok(plan.clone())
        });
        let both: BTreeSet<String> = ["n0".to_string(), "n1".to_string()].into();
        assert!(matches!(&steer, Steer::To { nodes, .. } if nodes == &both), "{steer:?}");
        assert_eq!(gangs.held("n0", None), 0b11);
        assert_eq!(gangs.held("n0", Some(&member.key)), 0, "a member does not count its own plan as used");
        assert_eq!(
            gangs.held_by_node(None),
            FxHashMap::from_iter([("n0".to_string(), 0b11), ("n1".to_string(), 0b11)])
        );
        assert!(gangs.held_by_node(Some(&member.key)).is_empty());
        let r = gangs.rank_on(&member.key, "u0", "n0").unwrap();
        gangs.take(&member.key, "u0", r.note.rank, now);
        assert_eq!(gangs.held("n0", None), 0);
        assert_eq!(gangs.held("n1", None), 0b11);
        gangs.release("u0");
        assert_eq!(gangs.held("n0", None), 0b11);
        // Expired plans hold nothing.
        gangs.steer(
            &member,
            "u9",
            (2, &VfAsk::new()),
            &NodeSet::default(),
            now + Duration::from_secs(61),
            &mut |_, _, _| Err("full".into()),
        );
        assert_eq!(gangs.held("n0", None), 0);
    }

    fn names_of<'a>(nodes: &'a [PlanNode<'a>]) -> Vec<(&'a str, Option<&'a BTreeMap<String, String>>)> {
        nodes.iter().map(|n| (n.name, n.labels)).collect()
    }

    fn prepared(gpus: usize) -> PreparedTopology {
        PreparedTopology::new(weft_testkit::pcie_only("n", gpus)).unwrap()
    }

    #[test]
    fn without_network_labels_the_default_levels_plan_the_whole_cluster_as_one_domain() {
        let p = prepared(8);
        let none = BTreeSet::new();
        let nodes: Vec<PlanNode<'_>> = ["n1", "n2"]
            .iter()
            .map(|name| PlanNode { name, labels: None, prepared: Some(&p), used: 0, vfs_used: &none })
            .collect();
        let soft = TierConstraint::soft();
        let network = Network::build((&NetworkLevels::Auto, &[]), &names_of(&nodes)).unwrap();
        let plan = plan_over(&network, &nodes, 4, (4, &VfAsk::new()), &soft, &[], None, SetQuality::Ring).unwrap();
        assert_eq!(plan.domain, weft_gang::network::ROOT_TIER);
        assert_eq!(plan.members.len(), 4);
        assert_eq!(plan.nodes, 2, "two 4-GPU members per 8-GPU node");
        // Built for other nodes (or another order): refused, not misread.
        let mut swapped = nodes;
        swapped.swap(0, 1);
        let e = plan_over(&network, &swapped, 1, (4, &VfAsk::new()), &soft, &[], None, SetQuality::Ring).unwrap_err();
        assert!(e.contains("nodes changed"), "{e}");
    }

    #[test]
    fn a_replan_keeps_the_group_in_the_placed_members_domain_or_fails_under_a_hard_tier() {
        let p = prepared(8);
        let none = BTreeSet::new();
        let leaf = |l: &str| BTreeMap::from([("s".to_string(), "s1".to_string()), ("l".to_string(), l.to_string())]);
        let (la, lb) = (leaf("a"), leaf("b"));
        let nodes = vec![
            PlanNode { name: "a1", labels: Some(&la), prepared: Some(&p), used: 0, vfs_used: &none },
            PlanNode { name: "b1", labels: Some(&lb), prepared: Some(&p), used: u128::MAX, vfs_used: &none },
            PlanNode { name: "b2", labels: Some(&lb), prepared: Some(&p), used: 0, vfs_used: &none },
        ];
        let levels = NetworkLevels::Levels(LabelLevels::new(&["s", "l"]));
        let hard = TierConstraint::hard(weft_gang::TierRef::Name("l".into()));
        let ask = (8, &VfAsk::new());
        let network = Network::build((&levels, &[]), &names_of(&nodes)).unwrap();
        // One member placed on b1: the next goes to b2, not to the emptier leaf a.
        let p1 = plan_over(&network, &nodes, 1, ask, &hard, &["b1".into()], None, SetQuality::Ring).unwrap();
        assert_eq!((p1.members[0].node.as_str(), p1.domain.as_str()), ("b2", "b"));
        // Two more cannot both fit in b: refused under the hard leaf tier ...
        let e = plan_over(&network, &nodes, 2, ask, &hard, &["b1".into()], None, SetQuality::Ring).unwrap_err();
        assert!(e.contains("within b"), "{e}");
        // ... and widened to the spine under a soft constraint.
        let soft = TierConstraint::soft();
        let p2 = plan_over(&network, &nodes, 2, ask, &soft, &["b1".into()], None, SetQuality::Ring).unwrap();
        assert_eq!(p2.domain, "s1");
        let placed: BTreeSet<&str> = p2.members.iter().map(|m| m.node.as_str()).collect();
        assert_eq!(placed, BTreeSet::from(["a1", "b2"]));
    }
}
