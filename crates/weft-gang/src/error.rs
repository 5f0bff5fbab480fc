//! Typed errors: what was wrong and where (the node, label, HyperNode and field).

use thiserror::Error;

/// A cluster network description weft cannot turn into a tree of domains.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ModelError {
    /// Two nodes with one name.
    #[error("node `{name}` is listed twice")]
    DuplicateNode {
        /// The node.
        name: String,
    },
    /// A label key named by two levels.
    #[error("label key `{key}` names two tiers; each tier needs its own key")]
    DuplicateLevel {
        /// The key.
        key: String,
    },
    /// A level without any label key.
    #[error("tier level {index} (top first) has no label key")]
    EmptyLevel {
        /// Position in the configured list, top first.
        index: usize,
    },
    /// A node without a required level's label.
    #[error("node `{node}` has no label `{key}`, which every node needs (a required tier level)")]
    MissingLabel {
        /// The node.
        node: String,
        /// The level's label key.
        key: String,
    },
    /// A domain seen under two different parents.
    #[error(
        "{tier} domain `{domain}` is under two parents: {first} and {second}; a tier's domain must sit inside one domain of each tier above it"
    )]
    TwoParents {
        /// The tier (label key).
        tier: String,
        /// The domain's name (label value).
        domain: String,
        /// The first parent seen and the node it was seen on: `` `s1` (node `n5`) ``.
        first: String,
        /// The second, likewise.
        second: String,
    },
    /// A `nvidia.com/gpu.clique` value not in GFD's `<clusterUUID>.<cliqueId>` form.
    #[error(
        "node `{node}`: label `{key}` = `{value}` is not a GPU clique (`<clusterUUID>.<cliqueId>`, e.g. `7b968a6d-c8aa-45e1-9e07-e1e51be99c31.1`)"
    )]
    BadClique {
        /// The node.
        node: String,
        /// The label key.
        key: String,
        /// The value.
        value: String,
    },
    /// A HyperNode that Volcano (or weft's tree) rejects.
    #[error("HyperNode `{name}`: {field}: {message}")]
    HyperNode {
        /// The HyperNode (`(unnamed)` when it has no name).
        name: String,
        /// The field (`spec.members[2].selector`).
        field: String,
        /// What is wrong.
        message: String,
    },
    /// A HyperNode listed as a member of two HyperNodes (Volcano's `addChild` refuses a second parent).
    #[error("HyperNode `{child}` is a member of both `{first}` and `{second}`; a HyperNode has one parent")]
    HyperNodeTwoParents {
        /// The member.
        child: String,
        /// The first parent.
        first: String,
        /// The second parent.
        second: String,
    },
    /// HyperNodes that contain each other.
    #[error("HyperNodes form a cycle (each a member of the next): {chain}")]
    HyperNodeCycle {
        /// The cycle, `a -> b -> a`.
        chain: String,
    },
    /// A node in two HyperNodes that are not nested.
    #[error(
        "node `{node}` is a member of HyperNode `{first}` (tier {first_tier}) and of `{second}` (tier {second_tier}), which do not contain one another; weft needs each node on one path of the tree"
    )]
    NodeInTwoHyperNodes {
        /// The node.
        node: String,
        /// One HyperNode.
        first: String,
        /// Its tier.
        first_tier: u32,
        /// The other HyperNode.
        second: String,
        /// Its tier.
        second_tier: u32,
    },
    /// A text that does not parse.
    #[error("{source_name}: {message}")]
    Parse {
        /// File name or `<input>`.
        source_name: String,
        /// What and where.
        message: String,
    },
    /// A rail for a node the model does not have, or a bad rail entry.
    #[error("rails: node `{node}`: {message}")]
    Rail {
        /// The node.
        node: String,
        /// What is wrong.
        message: String,
    },
}

/// A gang weft cannot plan, or a plan it cannot make.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PlanError {
    /// A gang of no members.
    #[error("the gang has no members")]
    EmptyGang,
    /// More GPUs per member than a node can have.
    #[error("{gpus} GPUs per member: a node has at most {max}")]
    TooManyGpus {
        /// Asked.
        gpus: usize,
        /// The most a node has.
        max: usize,
    },
    /// Free capacity not given for every node of the model.
    #[error("free capacity lists {got} nodes; the network model has {nodes}")]
    FreeLength {
        /// Entries given.
        got: usize,
        /// Nodes in the model.
        nodes: usize,
    },
    /// A tier constraint naming a tier the model does not have.
    #[error("highest tier `{tier}` is not a tier of this cluster's network (tiers: {known})")]
    UnknownTier {
        /// As written.
        tier: String,
        /// The model's tiers, innermost first.
        known: String,
    },
    /// No domain within the allowed tiers holds every member.
    #[error("a gang of {members} × {gpus} GPU(s) does not fit within tier {tier}: {best}")]
    NoFit {
        /// Members asked.
        members: usize,
        /// GPUs per member.
        gpus: usize,
        /// The highest tier allowed, as `<number> (<name>)`.
        tier: String,
        /// The most members one domain of that tier could hold, and which.
        best: String,
    },
    /// The caller's GPU set choice refused a node the capacity said could take a member.
    #[error("node `{node}`: no GPU set for a member: {reason}")]
    Sets {
        /// The node.
        node: String,
        /// The chooser's reason.
        reason: String,
    },
    /// A node type the set chooser cannot use.
    #[error("node type {index}: {message}")]
    NodeType {
        /// Index in the types given.
        index: usize,
        /// What is wrong.
        message: String,
    },
    /// A gang annotation or Volcano `networkTopology` that does not parse.
    #[error("{field}: {message}")]
    Constraint {
        /// The annotation key or field.
        field: String,
        /// What is wrong.
        message: String,
    },
}
