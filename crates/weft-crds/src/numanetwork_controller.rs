//! The NumaNetwork controller: a network's spec judged into `status`, its ResourceClaimTemplates
//! made in the namespaces that use it, and its `Ready` condition.
//!
//! - **Accepted**: every NumaNetwork gets an `Accepted` condition: `True` (reason `Valid`) when the
//!   spec passes [`NumaNetwork::validate`] — the same checks as the CRD schema and its CEL rules, so
//!   this catches objects created before the CRD carried a rule or on servers that skip CEL — and
//!   `False` (reason `InvalidSpec`, message naming each field) otherwise, with a Warning Event.
//!   `observedGeneration` says which spec the status describes.
//! - **Templates**: for an accepted network, the ResourceClaimTemplate `<name>-rct`
//!   ([`template`]) is applied in every namespace with a Numaflow Pipeline that names the network
//!   (in `spec.edges[].numaNetwork.name`, or in the `weft.io/numa-network-edges` annotation), owned
//!   by the NumaNetwork and labelled [`NETWORK_LABEL`]; templates in namespaces no pipeline uses
//!   any more are deleted. A template's spec is immutable in Kubernetes, so one whose spec differs
//!   from what would be applied is deleted and created again. What the template's config carries
//!   depends on the DeviceClass's driver ([`Addressing`]): weft's NIC driver gets the whole
//!   [`NicConfig`] (range, VLAN); dranet gets only `{"profile": "weft.io/<name>"}`, which dranet
//!   strictly accepts, and weft's profile provider hands out the address.
//! - **Ready**: `True` when the templates are in place in every namespace that uses the network
//!   (also when none does yet); `False` with reason `InvalidSpec`, `DeviceClassNotFound`,
//!   `WaitingForPipelines` (the Pipeline list has not been read: Numaflow not installed, or
//!   starting) or `TemplateFailed`. `status.resourceClaimTemplate` names the template and
//!   `status.namespaces` lists where it exists.
//! - **Deletion**: owner references let Kubernetes' garbage collector delete the templates; there
//!   is no finalizer.
//!
//! The status write is a read-modify-write of the status subresource with the object's
//! resourceVersion, re-read on conflict ([`update_with_retry`]); `lastTransitionTime` changes only
//! when a condition's status does. An object whose status already says what it would write is not
//! written, so a restart or resync costs no writes.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt as _, StreamExt as _};
use k8s_openapi::api::resource::v1::{
    DeviceClaim, DeviceClaimConfiguration, DeviceClass, DeviceRequest, ExactDeviceRequest, OpaqueDeviceConfiguration,
    ResourceClaim, ResourceClaimSpec, ResourceClaimTemplate, ResourceClaimTemplateSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, OwnerReference, Time};
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use k8s_openapi::jiff::Timestamp;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams,
};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::EventType;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};
use weft_net::nic_claim::{self, NicConfig};

use crate::NumaNetwork;
use crate::network_address::{self, NetworkAddress};
use crate::numanetwork::{AddressUsage, Cidr, NumaNetworkStatus, READY_CONDITION, resource_claim_template_name};
use weft_kube::controller::{Context, Reconciler, Scope, Settings};
use weft_kube::write::{Part, RetryPolicy, update_with_retry};

/// Condition type set by this controller.
pub const ACCEPTED_CONDITION: &str = "Accepted";

/// The controller's name in logs, metrics and Events.
pub const NAME: &str = "numanetwork";

/// Label on each ResourceClaimTemplate naming its NumaNetwork.
pub const NETWORK_LABEL: &str = "weft.io/numa-network";

/// dranet's driver name.
pub const DRANET_DRIVER: &str = "dra.net";

/// Prefix of the dranet profile weft's profile provider answers for: `weft.io/<network>`.
pub const PROFILE_PREFIX: &str = "weft.io/";

/// Pipeline annotation binding edges to NumaNetworks where the installed Numaflow CRD prunes
/// `edges[].numaNetwork` (a JSON array of `{from, to, numaNetwork, connectionType}`).
pub const EDGES_ANNOTATION: &str = weft_pipeline::edges::NUMA_NETWORK_EDGES_ANNOTATION;

/// How soon a network whose templates could not be written is looked at again.
pub const TEMPLATE_RETRY: Duration = Duration::from_secs(10);

/// Numaflow's Pipeline resource (`numaflow.numaproj.io/v1alpha1`).
pub fn pipeline_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("numaflow.numaproj.io", "v1alpha1", "Pipeline"),
        "pipelines",
    )
}

/// What the `Accepted` condition should say about an object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// `"True"` or `"False"`.
    pub status: &'static str,
    /// `Valid` or `InvalidSpec`.
    pub reason: &'static str,
    /// Human-readable detail.
    pub message: String,
    /// The generation judged.
    pub generation: Option<i64>,
}

/// Judge `nn`'s spec.
pub fn verdict(nn: &NumaNetwork) -> Verdict {
    let generation = nn.metadata.generation;
    match nn.validate() {
        Ok(()) => Verdict { status: "True", reason: "Valid", message: "spec is valid".into(), generation },
        Err(e) => Verdict { status: "False", reason: "InvalidSpec", message: e.to_string(), generation },
    }
}

/// What the `Ready` condition should say, and where the templates are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Readiness {
    /// The condition: `"True"` or `"False"`, reason, message.
    pub condition: Verdict,
    /// The template's name (when the spec is valid).
    pub template: Option<String>,
    /// Namespaces where the template is in place.
    pub namespaces: Vec<String>,
    /// Addresses of the range held (`None`: not counted, the status keeps what it has).
    pub addresses: Option<AddressUsage>,
}

fn same_condition(c: &Condition, type_: &str, v: &Verdict) -> bool {
    c.type_ == type_
        && c.status == v.status
        && c.reason == v.reason
        && c.message == v.message
        && c.observed_generation == v.generation
}

/// Whether `status` already records `v`.
pub fn is_current(status: Option<&NumaNetworkStatus>, v: &Verdict) -> bool {
    let Some(status) = status else { return false };
    status.observed_generation == v.generation
        && status.conditions.iter().any(|c| same_condition(c, ACCEPTED_CONDITION, v))
}

/// Whether `status` already records the verdict `v` and the readiness `r`.
pub fn is_current_with(status: Option<&NumaNetworkStatus>, v: &Verdict, r: &Readiness) -> bool {
    is_current(status, v)
        && status.is_some_and(|s| {
            s.resource_claim_template == r.template
                && s.namespaces == r.namespaces
                && (r.addresses.is_none() || s.addresses == r.addresses)
                && s.conditions.iter().any(|c| same_condition(c, READY_CONDITION, &r.condition))
        })
}

/// Set condition `type_` to `v` at time `now`; returns whether anything changed. The condition's
/// `lastTransitionTime` moves only when its status flips; other conditions are kept as they are.
fn set_condition(conditions: &mut Vec<Condition>, type_: &str, v: &Verdict, now: Timestamp) -> bool {
    let fresh = Condition {
        type_: type_.to_string(),
        status: v.status.to_string(),
        reason: v.reason.to_string(),
        message: v.message.clone(),
        observed_generation: v.generation,
        last_transition_time: Time(now),
    };
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(c) if same_condition(c, type_, v) => false,
        Some(c) => {
            let since = if c.status == fresh.status { c.last_transition_time.clone() } else { Time(now) };
            *c = Condition { last_transition_time: since, ..fresh };
            true
        }
        None => {
            conditions.push(fresh);
            true
        }
    }
}

/// Record `v` in `status` at time `now`; returns whether anything changed. The condition's
/// `lastTransitionTime` moves only when its status flips; other conditions are kept as they are.
pub fn record(status: &mut NumaNetworkStatus, v: &Verdict, now: Timestamp) -> bool {
    let mut changed = status.observed_generation != v.generation;
    status.observed_generation = v.generation;
    changed |= set_condition(&mut status.conditions, ACCEPTED_CONDITION, v, now);
    changed
}

/// Record `v` and the readiness `r` in `status` at time `now`; returns whether anything changed.
pub fn record_with(status: &mut NumaNetworkStatus, v: &Verdict, r: &Readiness, now: Timestamp) -> bool {
    let mut changed = record(status, v, now);
    if status.resource_claim_template != r.template {
        status.resource_claim_template.clone_from(&r.template);
        changed = true;
    }
    if status.namespaces != r.namespaces {
        status.namespaces.clone_from(&r.namespaces);
        changed = true;
    }
    if r.addresses.is_some() && status.addresses != r.addresses {
        status.addresses.clone_from(&r.addresses);
        changed = true;
    }
    changed |= set_condition(&mut status.conditions, READY_CONDITION, &r.condition, now);
    changed
}

/// The NIC driver a DeviceClass hands out devices from: the string compared with `device.driver`
/// in its first CEL selector that does, else the driver of its first opaque config.
pub fn class_driver(class: &DeviceClass) -> Option<String> {
    let from_selectors = class.spec.selectors.iter().flatten().find_map(|s| {
        let expr = &s.cel.as_ref()?.expression;
        driver_in_expression(expr)
    });
    from_selectors
        .or_else(|| class.spec.config.iter().flatten().find_map(|c| c.opaque.as_ref().map(|o| o.driver.clone())))
}

/// The string literal `device.driver` is compared with (`==`) in a CEL expression, either side.
fn driver_in_expression(expr: &str) -> Option<String> {
    const FIELD: &str = "device.driver";
    let at = expr.find(FIELD)?;
    let after = expr[at + FIELD.len()..].trim_start();
    if let Some(rest) = after.strip_prefix("==") {
        return string_literal(rest.trim_start()).map(|(s, _)| s);
    }
    // `"x" == device.driver`
    let before = expr[..at].trim_end().strip_suffix("==")?.trim_end();
    let quote = before.chars().last()?;
    if quote != '"' && quote != '\'' {
        return None;
    }
    let open = before[..before.len() - 1].rfind(quote)?;
    Some(before[open + 1..before.len() - 1].to_string())
}

fn string_literal(text: &str) -> Option<(String, &str)> {
    let quote = text.chars().next().filter(|c| *c == '"' || *c == '\'')?;
    let rest = &text[1..];
    let end = rest.find(quote)?;
    Some((rest[..end].to_string(), &rest[end + 1..]))
}

/// How a network's pods get their addresses, by the DeviceClass's driver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Addressing {
    /// weft's NIC DRA driver: the template carries the whole [`NicConfig`].
    Weft,
    /// dranet: the template carries only a `profile` that weft's profile provider resolves.
    Dranet,
    /// Another driver: the template carries no config; addresses and VLAN are that driver's.
    Other(String),
}

impl Addressing {
    /// The addressing for a DeviceClass whose driver is `driver` (`None`: not known).
    pub fn for_driver(driver: Option<&str>) -> Addressing {
        match driver {
            Some(nic_claim::DRIVER) => Addressing::Weft,
            Some(DRANET_DRIVER) => Addressing::Dranet,
            Some(other) => Addressing::Other(other.to_string()),
            None => Addressing::Other(String::new()),
        }
    }
}

/// dranet's profile name for `network`.
pub fn dranet_profile(network: &str) -> String {
    format!("{PROFILE_PREFIX}{network}")
}

/// The opaque config the template carries for `addressing`, if any.
pub fn claim_config(nn: &NumaNetwork, addressing: &Addressing) -> Option<OpaqueDeviceConfiguration> {
    let name = nn.name_any();
    match addressing {
        Addressing::Weft => {
            let dranet = &nn.spec.ref_resource_claim_dranet;
            let range = dranet.ip_range.parse().ok()?;
            let vlan = dranet.vlan_tag.and_then(|v| u16::try_from(v).ok());
            let parameters = serde_json::to_value(NicConfig::new(name, range, vlan)).ok()?;
            Some(OpaqueDeviceConfiguration { driver: nic_claim::DRIVER.into(), parameters: RawExtension(parameters) })
        }
        Addressing::Dranet => Some(OpaqueDeviceConfiguration {
            driver: DRANET_DRIVER.into(),
            parameters: RawExtension(json!({"profile": dranet_profile(&name)})),
        }),
        Addressing::Other(_) => None,
    }
}

/// The ResourceClaimTemplate `<name>-rct` for `nn` in `namespace` (resource.k8s.io/v1): one
/// request, [`nic_claim::REQUEST_NAME`], for exactly one device of the network's DeviceClass,
/// with [`claim_config`]; owned by the NumaNetwork and labelled [`NETWORK_LABEL`] (also on the
/// claims made from it).
pub fn template(nn: &NumaNetwork, namespace: &str, addressing: &Addressing) -> ResourceClaimTemplate {
    let name = nn.name_any();
    let labels: BTreeMap<String, String> =
        network_label_value(&name).map(|v| [(NETWORK_LABEL.to_string(), v)].into_iter().collect()).unwrap_or_default();
    let owner = OwnerReference {
        api_version: NumaNetwork::api_version(&()).into_owned(),
        kind: NumaNetwork::kind(&()).into_owned(),
        name: name.clone(),
        uid: nn.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    };
    let config = claim_config(nn, addressing).map(|opaque| {
        vec![DeviceClaimConfiguration { requests: Some(vec![nic_claim::REQUEST_NAME.into()]), opaque: Some(opaque) }]
    });
    ResourceClaimTemplate {
        metadata: ObjectMeta {
            name: Some(resource_claim_template_name(&name)),
            namespace: Some(namespace.to_string()),
            labels: Some(labels.clone()).filter(|l| !l.is_empty()),
            owner_references: Some(vec![owner]),
            ..ObjectMeta::default()
        },
        spec: ResourceClaimTemplateSpec {
            metadata: Some(ObjectMeta { labels: Some(labels).filter(|l| !l.is_empty()), ..ObjectMeta::default() }),
            spec: ResourceClaimSpec {
                devices: Some(DeviceClaim {
                    requests: Some(vec![DeviceRequest {
                        name: nic_claim::REQUEST_NAME.into(),
                        exactly: Some(ExactDeviceRequest {
                            device_class_name: nn.spec.ref_device_class.name.clone(),
                            allocation_mode: Some("ExactCount".into()),
                            count: Some(1),
                            ..ExactDeviceRequest::default()
                        }),
                        first_available: None,
                    }]),
                    config,
                    constraints: None,
                }),
            },
        },
    }
}

/// The value of [`NETWORK_LABEL`] for `network`: its name when it fits a label value (at most 63
/// characters; a longer name cannot be used by pipelines anyway, since it must be one DNS label of
/// the vertex domain).
pub fn network_label_value(network: &str) -> Option<String> {
    (network.len() <= 63).then(|| network.to_string())
}

/// The NumaNetworks a Pipeline's edges name: `spec.edges[].numaNetwork.name` and the entries of
/// the [`EDGES_ANNOTATION`] annotation (read as the Pipeline webhook reads them).
pub fn pipeline_networks(pipeline: &Value) -> BTreeSet<String> {
    weft_pipeline::edges::referenced_networks(pipeline).into_iter().collect()
}

/// The namespaces of the pipelines that name `network`.
pub fn namespaces_using<'a>(pipelines: impl IntoIterator<Item = &'a DynamicObject>, network: &str) -> BTreeSet<String> {
    pipelines
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| pipeline_networks(&pipeline_value(p)).contains(network))
        .filter_map(|p| p.metadata.namespace.clone())
        .collect()
}

fn pipeline_value(p: &DynamicObject) -> Value {
    let mut v = p.data.clone();
    if let Value::Object(map) = &mut v {
        map.insert("metadata".into(), json!({"annotations": p.metadata.annotations}));
    }
    v
}

/// Whether an existing template already is what would be applied (the spec, the label and the
/// owner); templates are immutable, so a different spec means delete and create again.
fn template_matches(existing: &ResourceClaimTemplate, desired: &ResourceClaimTemplate) -> bool {
    existing.spec == desired.spec
        && existing.metadata.labels == desired.metadata.labels
        && existing.metadata.owner_references.as_ref().is_some_and(|o| {
            o.iter().any(|r| desired.metadata.owner_references.iter().flatten().any(|d| d.uid == r.uid))
        })
}

/// The reconciler: the Pipeline cache tells which namespaces use each network.
pub struct NumaNetworkReconciler {
    pipelines: Store<DynamicObject>,
}

impl std::fmt::Debug for NumaNetworkReconciler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NumaNetworkReconciler").field("pipelines", &self.pipelines.state().len()).finish()
    }
}

/// Why making a network's templates failed.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    /// An API call failed.
    #[error("{what}: {source}")]
    Api {
        /// What was being done.
        what: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
}

impl NumaNetworkReconciler {
    /// A reconciler reading pipelines from `pipelines`.
    pub fn new(pipelines: Store<DynamicObject>) -> NumaNetworkReconciler {
        NumaNetworkReconciler { pipelines }
    }

    /// Make `nn`'s templates where they are used and remove them where not; returns the
    /// readiness, or `None` while the Pipeline list is not read yet.
    async fn reconcile_templates(&self, nn: &NumaNetwork, ctx: &Context) -> Option<Readiness> {
        let name = nn.name_any();
        let generation = nn.metadata.generation;
        let template_name = resource_claim_template_name(&name);
        let not_ready = |reason: &'static str, message: String, namespaces: Vec<String>| Readiness {
            condition: Verdict { status: "False", reason, message, generation },
            template: Some(template_name.clone()),
            namespaces,
            addresses: None,
        };
        // The Pipeline list not read yet: no namespaces are known.
        self.pipelines.wait_until_ready().now_or_never()?.ok()?;
        let wanted = namespaces_using(self.pipelines.state().iter().map(|p| p.as_ref()), &name);

        let classes: Api<DeviceClass> = Api::all(ctx.client.clone());
        let class_name = &nn.spec.ref_device_class.name;
        let class = match classes.get_opt(class_name).await {
            Ok(c) => c,
            Err(e) => {
                return Some(not_ready("TemplateFailed", format!("reading DeviceClass {class_name}: {e}"), vec![]));
            }
        };
        let addressing = Addressing::for_driver(class.as_ref().and_then(class_driver).as_deref());

        match self.apply_templates(nn, &wanted, &addressing, ctx).await {
            Ok(present) => {
                let namespaces: Vec<String> = present.into_iter().collect();
                if class.is_none() {
                    return Some(not_ready(
                        "DeviceClassNotFound",
                        format!(
                            "DeviceClass {class_name} does not exist: claims from {template_name} cannot be allocated until it does"
                        ),
                        namespaces,
                    ));
                }
                let note = match &addressing {
                    Addressing::Weft => String::new(),
                    Addressing::Dranet if nn.spec.ref_resource_claim_dranet.vlan_tag.is_some() => format!(
                        "; driver {DRANET_DRIVER}: addresses from weft's profile provider (profile {}), and dranet does not set VLANs, so vlanTag must be configured on the VFs by other means",
                        dranet_profile(&name)
                    ),
                    Addressing::Dranet => {
                        format!(
                            "; driver {DRANET_DRIVER}: addresses from weft's profile provider (profile {})",
                            dranet_profile(&name)
                        )
                    }
                    Addressing::Other(d) if d.is_empty() => {
                        format!(
                            "; DeviceClass {class_name} names no driver weft knows: the template carries no addressing config"
                        )
                    }
                    Addressing::Other(d) => {
                        format!("; driver {d} is not weft's or dranet's: the template carries no addressing config")
                    }
                };
                let message = if namespaces.is_empty() {
                    format!(
                        "no pipeline uses the network yet; {template_name} is made in each namespace whose pipelines do{note}"
                    )
                } else {
                    format!("{template_name} is in namespace(s) {}{note}", namespaces.join(", "))
                };
                Some(Readiness {
                    condition: Verdict { status: "True", reason: "TemplatesReady", message, generation },
                    template: Some(template_name),
                    namespaces,
                    addresses: None,
                })
            }
            Err((e, present)) => Some(not_ready("TemplateFailed", e.to_string(), present.into_iter().collect())),
        }
    }

    /// Apply the template in `wanted` namespaces, delete it elsewhere; returns the namespaces
    /// where it is in place (also on error, with the error).
    async fn apply_templates(
        &self,
        nn: &NumaNetwork,
        wanted: &BTreeSet<String>,
        addressing: &Addressing,
        ctx: &Context,
    ) -> Result<BTreeSet<String>, (TemplateError, BTreeSet<String>)> {
        let name = nn.name_any();
        let template_name = resource_claim_template_name(&name);
        let all: Api<ResourceClaimTemplate> = Api::all(ctx.client.clone());
        let mut present = BTreeSet::new();
        let api_err = |what: String, present: &BTreeSet<String>| {
            let present = present.clone();
            move |source| (TemplateError::Api { what, source }, present)
        };
        // Existing templates of this network, by namespace.
        let existing: BTreeMap<String, ResourceClaimTemplate> = match network_label_value(&name) {
            Some(v) => all
                .list(&ListParams::default().labels(&format!("{NETWORK_LABEL}={v}")))
                .await
                .map_err(api_err("listing ResourceClaimTemplates".into(), &present))?
                .items
                .into_iter()
                .filter(|t| t.metadata.name.as_deref() == Some(template_name.as_str()))
                .filter_map(|t| Some((t.metadata.namespace.clone()?, t)))
                .collect(),
            None => BTreeMap::new(),
        };
        for (ns, t) in &existing {
            let ours = t.metadata.owner_references.iter().flatten().any(|o| Some(&o.uid) == nn.metadata.uid.as_ref());
            if !wanted.contains(ns) && ours {
                let api: Api<ResourceClaimTemplate> = Api::namespaced(ctx.client.clone(), ns);
                match api.delete(&template_name, &DeleteParams::default()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => {
                        return Err((
                            TemplateError::Api { what: format!("deleting {ns}/{template_name}"), source: e },
                            present,
                        ));
                    }
                }
            }
        }
        for ns in wanted {
            let desired = template(nn, ns, addressing);
            let api: Api<ResourceClaimTemplate> = Api::namespaced(ctx.client.clone(), ns);
            match existing.get(ns) {
                Some(t) if template_matches(t, &desired) => {
                    present.insert(ns.clone());
                    continue;
                }
                Some(_) => {
                    // Immutable spec (or someone else's object): replace it.
                    match api.delete(&template_name, &DeleteParams::default()).await {
                        Ok(_) => {}
                        Err(kube::Error::Api(s)) if s.code == 404 => {}
                        Err(e) => {
                            return Err((
                                TemplateError::Api { what: format!("replacing {ns}/{template_name}"), source: e },
                                present,
                            ));
                        }
                    }
                }
                None => {}
            }
            let params = PatchParams::apply(&ctx.field_manager).force();
            let mut body = serde_json::to_value(&desired).unwrap_or(Value::Null);
            body["apiVersion"] = json!("resource.k8s.io/v1");
            body["kind"] = json!("ResourceClaimTemplate");
            api.patch(&template_name, &params, &Patch::Apply(body))
                .await
                .map_err(api_err(format!("applying {ns}/{template_name}"), &present))?;
            present.insert(ns.clone());
        }
        Ok(present)
    }
}

impl NumaNetworkReconciler {
    /// Count the network's NetworkAddresses, deleting those whose claim is gone first (a driver
    /// or profile provider that never released them); `None` when they cannot be read.
    async fn account_addresses(&self, nn: &NumaNetwork, ctx: &Context) -> Option<AddressUsage> {
        let name = nn.name_any();
        let range = Cidr::parse(&nn.spec.ref_resource_claim_dranet.ip_range).ok()?;
        let size = network_address::usable_addresses(&range);
        let addresses: Api<NetworkAddress> = Api::all(ctx.client.clone());
        let by_network = ListParams::default().labels(&format!("{}={name}", network_address::NETWORK_LABEL));
        // Addresses first, then claims: a claim an address was made for existed before it.
        let held = match addresses.list(&by_network).await {
            Ok(l) => l.items,
            Err(e) => {
                tracing::warn!(network = %name, error = %e, "listing NetworkAddresses");
                return None;
            }
        };
        let labelled_claims: Option<BTreeSet<String>> = if held.iter().any(|a| a.spec.claim.name.is_empty()) {
            let claims: Api<ResourceClaim> = Api::all(ctx.client.clone());
            let selector = network_label_value(&name).map(|v| format!("{NETWORK_LABEL}={v}")).unwrap_or_default();
            match claims.list_metadata(&ListParams::default().labels(&selector)).await {
                Ok(l) => Some(l.items.into_iter().filter_map(|c| c.metadata.uid).collect()),
                Err(e) => {
                    tracing::warn!(network = %name, error = %e, "listing ResourceClaims");
                    return None;
                }
            }
        } else {
            None
        };
        let mut allocated: u128 = 0;
        for a in &held {
            let claim = &a.spec.claim;
            let gone = if claim.name.is_empty() {
                labelled_claims.as_ref().is_some_and(|uids| !uids.contains(&claim.uid))
            } else {
                let claims: Api<ResourceClaim> = Api::namespaced(ctx.client.clone(), &claim.namespace);
                match claims.get_metadata_opt(&claim.name).await {
                    Ok(Some(c)) => c.metadata.uid.as_deref() != Some(claim.uid.as_str()),
                    Ok(None) => true,
                    Err(e) => {
                        tracing::warn!(network = %name, error = %e, "reading ResourceClaim {}/{}", claim.namespace, claim.name);
                        false
                    }
                }
            };
            let object = a.name_any();
            if gone {
                let uid = a.metadata.uid.clone();
                let params = DeleteParams {
                    preconditions: uid.map(|uid| kube::api::Preconditions { uid: Some(uid), resource_version: None }),
                    ..DeleteParams::default()
                };
                match addresses.delete(&object, &params).await {
                    Ok(_) => {
                        tracing::info!(network = %name, address = %a.spec.address, claim = %claim.uid, "collected an address whose claim is gone");
                        continue;
                    }
                    Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => continue,
                    Err(e) => tracing::warn!(network = %name, error = %e, "deleting NetworkAddress {object}"),
                }
            }
            allocated += 1;
        }
        let clamp = |n: u128| i64::try_from(n).unwrap_or(i64::MAX);
        Some(AddressUsage { allocated: clamp(allocated), size: clamp(size), usage: format!("{allocated}/{size}") })
    }
}

impl Reconciler<NumaNetwork> for NumaNetworkReconciler {
    type Error = kube::Error;

    async fn apply(&self, nn: Arc<NumaNetwork>, ctx: &Context) -> Result<Action, kube::Error> {
        let v = verdict(&nn);
        let readiness = if v.status == "True" {
            self.reconcile_templates(&nn, ctx).await.unwrap_or_else(|| Readiness {
                condition: Verdict {
                    status: "False",
                    reason: "WaitingForPipelines",
                    message: "the Pipeline list (pipelines.numaflow.numaproj.io/v1alpha1) has not been read yet: is Numaflow installed?".into(),
                    generation: nn.metadata.generation,
                },
                template: Some(resource_claim_template_name(&nn.name_any())),
                namespaces: nn.status.as_ref().map(|s| s.namespaces.clone()).unwrap_or_default(),
                addresses: None,
            })
        } else {
            Readiness {
                condition: Verdict {
                    status: "False",
                    reason: "InvalidSpec",
                    message: "the spec is not accepted; see the Accepted condition".into(),
                    generation: nn.metadata.generation,
                },
                template: None,
                namespaces: nn.status.as_ref().map(|s| s.namespaces.clone()).unwrap_or_default(),
                addresses: None,
            }
        };
        let mut readiness = readiness;
        if v.status == "True" {
            readiness.addresses = self.account_addresses(&nn, ctx).await;
        }
        // Waiting for the Pipeline list needs no requeue: reading it reconciles every network.
        let next = if readiness.condition.reason == "TemplateFailed" {
            Action::requeue(TEMPLATE_RETRY)
        } else {
            Action::await_change()
        };
        if is_current_with(nn.status.as_ref(), &v, &readiness) {
            return Ok(next);
        }
        let api: Api<NumaNetwork> = Api::all(ctx.client.clone());
        let params = PostParams { field_manager: Some(ctx.field_manager.clone()), ..PostParams::default() };
        let mut judged = None;
        let written =
            update_with_retry(&api, &nn.name_any(), Part::Status, &params, &RetryPolicy::conflicts(), |fresh| {
                // Judge the copy just read: its spec may be newer than the one that triggered us.
                let v = verdict(fresh);
                let mut r = readiness.clone();
                if v.status == "False" {
                    // The copy just read is invalid though the one judged was not: Ready says so
                    // (the next reconcile, triggered by this write, looks at it whole).
                    r.condition.reason = "InvalidSpec";
                    r.condition.status = "False";
                    r.condition.message = "the spec is not accepted; see the Accepted condition".into();
                    r.template = None;
                }
                r.condition.generation = v.generation;
                let changed =
                    record_with(fresh.status.get_or_insert_with(NumaNetworkStatus::default), &v, &r, Timestamp::now());
                judged = Some((v, r));
                changed
            })
            .await?;
        if let (Some(obj), Some((v, r))) = (written, judged) {
            if v.status == "False" {
                ctx.event(&obj, EventType::Warning, "InvalidSpec", "Validate", Some(v.message)).await;
            } else if r.condition.status == "False" && r.condition.reason != "WaitingForPipelines" {
                ctx.event(&obj, EventType::Warning, r.condition.reason, "Templates", Some(r.condition.message)).await;
            }
        }
        Ok(next)
    }
}

/// `stream` without its errors, each logged: an error in a side stream (the Pipeline API not
/// served while Numaflow is not installed) would otherwise put every trigger of the controller,
/// the networks' own included, into kube-runtime's trigger backoff. The watcher behind `stream`
/// paces its own retries (`default_backoff`).
fn quiet<T: Send + 'static, E: std::fmt::Display + Send + 'static>(
    what: &'static str,
    stream: impl futures::Stream<Item = Result<T, E>> + Send + 'static,
) -> impl futures::Stream<Item = Result<T, E>> + Send + 'static {
    stream.filter(move |r| {
        if let Err(e) = r {
            tracing::debug!(controller = NAME, watch = what, error = %e, "watch failed; retrying");
        }
        std::future::ready(r.is_ok())
    })
}

/// Run the controller over every NumaNetwork until `shutdown` completes. Pipelines (every
/// namespace) are watched into a cache and trigger the networks they name; the templates the
/// controller made trigger their network.
pub async fn run(ctx: Context, settings: Settings, shutdown: impl Future<Output = ()> + Send + Sync + 'static) {
    let client = ctx.client.clone();
    let api: Api<NumaNetwork> = Api::all(client.clone());
    let resource = pipeline_resource();
    let writer = reflector::store::Writer::<DynamicObject>::new(resource.clone());
    let pipelines = writer.as_reader();
    let pipeline_api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    let pipeline_stream = quiet(
        "pipelines",
        watcher(pipeline_api, watcher::Config::default()).default_backoff().reflect(writer).touched_objects(),
    );
    let templates: Api<ResourceClaimTemplate> = Api::all(client.clone());
    let template_stream = quiet(
        "resourceclaimtemplates",
        watcher(templates, watcher::Config::default().labels(NETWORK_LABEL)).default_backoff().touched_objects(),
    );
    // Once the Pipeline list has been read, every network is looked at again (those no pipeline
    // names included: they were waiting for the list).
    let listed = pipelines.clone();
    let pipelines_read =
        futures::stream::once(async move { listed.wait_until_ready().await.ok() }).filter_map(|r| async move { r });
    // A network's addresses (allocated, released) and the claims made from its templates (a
    // deleted claim may leave an address to collect) trigger the network.
    let address_stream = quiet(
        "networkaddresses",
        watcher(Api::<NetworkAddress>::all(client.clone()), watcher::Config::default())
            .default_backoff()
            .touched_objects(),
    );
    let claim_stream = quiet(
        "resourceclaims",
        watcher(
            Api::<kube::core::PartialObjectMeta<ResourceClaim>>::all(client.clone()),
            watcher::Config::default().labels(NETWORK_LABEL),
        )
        .default_backoff()
        .touched_objects(),
    );
    let configure = move |c: Controller<NumaNetwork>| {
        c.reconcile_all_on(pipelines_read)
            .watches_stream(address_stream, |a: NetworkAddress| Some(ObjectRef::<NumaNetwork>::new(&a.spec.network)))
            .watches_stream(claim_stream, |c: kube::core::PartialObjectMeta<ResourceClaim>| {
                c.metadata.labels.as_ref().and_then(|l| l.get(NETWORK_LABEL)).map(|n| ObjectRef::<NumaNetwork>::new(n))
            })
            .owns_stream(template_stream)
            .watches_stream_with(
                pipeline_stream.boxed(),
                |p: DynamicObject| {
                    pipeline_networks(&pipeline_value(&p))
                        .into_iter()
                        .map(|n| ObjectRef::<NumaNetwork>::new(&n))
                        .collect::<Vec<_>>()
                },
                resource,
            )
    };
    weft_kube::controller::run_with(
        api,
        watcher::Config::default(),
        Scope::cluster(),
        Arc::new(NumaNetworkReconciler::new(pipelines)),
        ctx,
        settings,
        shutdown,
        configure,
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::numanetwork::{DeviceClassReference, DranetClaimParameters, NumaNetworkSpec};
    use serde_json::json;

    fn nn(ip_range: &str, generation: i64) -> NumaNetwork {
        let mut nn = NumaNetwork::new(
            "net-a",
            NumaNetworkSpec {
                ref_device_class: DeviceClassReference { name: "vf.nvidia.dra.net".into() },
                ref_resource_claim_dranet: DranetClaimParameters {
                    ip_range: ip_range.into(),
                    ethernet_speed: Some(100),
                    vlan_tag: Some(10),
                },
            },
        );
        nn.metadata.generation = Some(generation);
        nn
    }

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(secs).expect("valid timestamp")
    }

    #[test]
    fn valid_and_invalid_specs_get_their_verdicts() {
        let ok = verdict(&nn("192.168.10.0/24", 1));
        assert_eq!((ok.status, ok.reason, ok.generation), ("True", "Valid", Some(1)));
        let bad = verdict(&nn("192.168.10.1/24", 2));
        assert_eq!((bad.status, bad.reason), ("False", "InvalidSpec"));
        assert!(bad.message.contains("spec.refResourceClaimDranet.ipRange"), "{}", bad.message);
    }

    #[test]
    fn recording_is_idempotent_and_keeps_transition_time_until_status_flips() {
        let mut status = NumaNetworkStatus::default();
        let v1 = verdict(&nn("10.0.0.0/8", 1));
        assert!(record(&mut status, &v1, at(100)));
        assert!(!record(&mut status, &v1, at(200)), "same verdict: no change");
        assert!(is_current(Some(&status), &v1));

        // New generation, still valid: observedGeneration moves, transition time does not.
        let v2 = verdict(&nn("10.0.0.0/16", 2));
        assert!(record(&mut status, &v2, at(300)));
        assert_eq!(status.observed_generation, Some(2));
        assert_eq!(status.conditions.len(), 1);
        assert_eq!(status.conditions[0].last_transition_time, Time(at(100)));

        // Invalid: status flips, transition time moves.
        let v3 = verdict(&nn("10.0.0.1/16", 3));
        assert!(record(&mut status, &v3, at(400)));
        assert_eq!(status.conditions[0].status, "False");
        assert_eq!(status.conditions[0].last_transition_time, Time(at(400)));
    }

    fn class(selector: Option<&str>, config_driver: Option<&str>) -> DeviceClass {
        let mut c: DeviceClass = serde_json::from_value(json!({"metadata": {"name": "c"}, "spec": {}})).unwrap();
        if let Some(expr) = selector {
            c.spec.selectors = Some(vec![serde_json::from_value(json!({"cel": {"expression": expr}})).unwrap()]);
        }
        if let Some(d) = config_driver {
            c.spec.config =
                Some(vec![serde_json::from_value(json!({"opaque": {"driver": d, "parameters": {}}})).unwrap()]);
        }
        c
    }

    #[test]
    fn the_class_driver_is_read_from_its_selector_or_config() {
        let cases = [
            (Some(r#"device.driver == "nic.weft.io""#), None, Some("nic.weft.io")),
            (Some(r#"device.driver=='dra.net' && device.attributes["dra.net"].rdma"#), None, Some("dra.net")),
            (Some(r#""dra.net" == device.driver"#), None, Some("dra.net")),
            (Some(r#"device.attributes["x"].y == "z""#), Some("other.io"), Some("other.io")),
            (Some("device.driver in ['a', 'b']"), None, None),
            (None, None, None),
        ];
        for (selector, config, want) in cases {
            assert_eq!(class_driver(&class(selector, config)).as_deref(), want, "{selector:?} {config:?}");
        }
    }

    #[test]
    fn weft_templates_carry_the_network_in_the_v1_shape() {
        let mut n = nn("192.168.10.0/24", 1);
        n.metadata.uid = Some("uid-1".into());
        let t = serde_json::to_value(template(&n, "video", &Addressing::Weft)).unwrap();
        assert_eq!(t["metadata"]["name"], "net-a-rct");
        assert_eq!(t["metadata"]["namespace"], "video");
        assert_eq!(t["metadata"]["labels"][NETWORK_LABEL], "net-a");
        assert_eq!(t["metadata"]["ownerReferences"][0]["kind"], "NumaNetwork");
        assert_eq!(t["metadata"]["ownerReferences"][0]["uid"], "uid-1");
        assert_eq!(t["metadata"]["ownerReferences"][0]["controller"], true);
        let devices = &t["spec"]["spec"]["devices"];
        assert_eq!(devices["requests"][0]["name"], "nic");
        assert_eq!(devices["requests"][0]["exactly"]["deviceClassName"], "vf.nvidia.dra.net");
        assert_eq!(devices["requests"][0]["exactly"]["count"], 1);
        assert_eq!(devices["config"][0]["requests"], json!(["nic"]));
        assert_eq!(devices["config"][0]["opaque"]["driver"], "nic.weft.io");
        let parameters = &devices["config"][0]["opaque"]["parameters"];
        let parsed = NicConfig::parse(parameters).unwrap();
        assert_eq!(
            (parsed.network.as_str(), parsed.ip_range.to_string(), parsed.vlan),
            ("net-a", "192.168.10.0/24".into(), Some(10))
        );
        // The claims made from it carry the label too.
        assert_eq!(t["spec"]["metadata"]["labels"][NETWORK_LABEL], "net-a");
    }

    #[test]
    fn dranet_templates_carry_only_a_profile() {
        let t = serde_json::to_value(template(&nn("192.168.10.0/24", 1), "video", &Addressing::Dranet)).unwrap();
        let opaque = &t["spec"]["spec"]["devices"]["config"][0]["opaque"];
        assert_eq!(opaque["driver"], "dra.net");
        // dranet parses its parameters strictly: nothing but keys it knows.
        assert_eq!(opaque["parameters"], json!({"profile": "weft.io/net-a"}));
        let other =
            serde_json::to_value(template(&nn("192.168.10.0/24", 1), "video", &Addressing::Other("x".into()))).unwrap();
        assert!(other["spec"]["spec"]["devices"].get("config").is_none_or(Value::is_null), "{other}");
    }

    #[test]
    fn pipelines_name_networks_in_edges_and_in_the_annotation() {
        let p = json!({
            "metadata": {"annotations": {EDGES_ANNOTATION: r#"[{"from":"a","to":"b","numaNetwork":"net-b","connectionType":"direct"}]"#}},
            "spec": {"edges": [
                {"from": "in", "to": "a"},
                {"from": "a", "to": "b", "numaNetwork": {"name": "net-a", "connectionType": "direct"}}
            ]}
        });
        assert_eq!(pipeline_networks(&p), ["net-a".to_string(), "net-b".to_string()].into_iter().collect());
        let broken = json!({"metadata": {"annotations": {EDGES_ANNOTATION: "not json"}}, "spec": {}});
        assert!(pipeline_networks(&broken).is_empty());
    }

    #[test]
    fn readiness_is_recorded_once() {
        let n = nn("10.0.0.0/8", 1);
        let v = verdict(&n);
        let r = Readiness {
            condition: Verdict { status: "True", reason: "TemplatesReady", message: "m".into(), generation: Some(1) },
            template: Some("net-a-rct".into()),
            namespaces: vec!["video".into()],
            addresses: None,
        };
        let mut status = NumaNetworkStatus::default();
        assert!(record_with(&mut status, &v, &r, at(1)));
        assert!(is_current_with(Some(&status), &v, &r));
        assert!(!record_with(&mut status, &v, &r, at(2)));
        assert_eq!(status.namespaces, vec!["video".to_string()]);
        let moved = Readiness { namespaces: vec![], ..r.clone() };
        assert!(!is_current_with(Some(&status), &v, &moved));
    }

    #[test]
    fn other_conditions_are_kept() {
        let mut status = NumaNetworkStatus::default();
        status.conditions.push(Condition {
            type_: "Ready".into(),
            status: "True".into(),
            reason: "TemplatesCreated".into(),
            message: String::new(),
            observed_generation: Some(1),
            last_transition_time: Time(at(5)),
        });
        assert!(record(&mut status, &verdict(&nn("10.0.0.0/8", 1)), at(10)));
        assert_eq!(status.conditions.len(), 2);
        assert_eq!(status.conditions[0].type_, "Ready");
    }
}
