//! The NumaNetwork controller, first part: admission of the spec into `status`.
//!
//! Every NumaNetwork gets an `Accepted` condition: `True` (reason `Valid`) when the spec passes
//! [`NumaNetwork::validate`] — the same checks as the CRD schema and its CEL rules, so this catches
//! objects created before the CRD carried a rule or on servers that skip CEL — and `False` (reason
//! `InvalidSpec`, message naming each field) otherwise, with a Warning Event. `observedGeneration`
//! says which spec the status describes.
//!
//! Creating the ResourceClaimTemplates (and the `Ready` condition) is the next part; it will add a
//! finalizer then. Nothing here needs cleanup, so this part keeps no finalizer.
//!
//! The write is a read-modify-write of the status subresource with the object's resourceVersion,
//! re-read on conflict ([`update_with_retry`]); `lastTransitionTime` changes only when the
//! condition's status does. An object whose status already says what it would write is not written,
//! so a restart or resync costs no writes.

use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{ResourceExt, runtime::watcher};

use crate::NumaNetwork;
use crate::numanetwork::NumaNetworkStatus;
use weft_kube::controller::{Context, Reconciler, Scope, Settings};
use weft_kube::write::{Part, RetryPolicy, update_with_retry};

/// Condition type set by this controller.
pub const ACCEPTED_CONDITION: &str = "Accepted";

/// The controller's name in logs, metrics and Events.
pub const NAME: &str = "numanetwork";

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

/// Whether `status` already records `v`.
pub fn is_current(status: Option<&NumaNetworkStatus>, v: &Verdict) -> bool {
    let Some(status) = status else { return false };
    status.observed_generation == v.generation
        && status.conditions.iter().any(|c| {
            c.type_ == ACCEPTED_CONDITION
                && c.status == v.status
                && c.reason == v.reason
                && c.message == v.message
                && c.observed_generation == v.generation
        })
}

/// Record `v` in `status` at time `now`; returns whether anything changed. The condition's
/// `lastTransitionTime` moves only when its status flips; other conditions are kept as they are.
pub fn record(status: &mut NumaNetworkStatus, v: &Verdict, now: Timestamp) -> bool {
    if is_current(Some(status), v) {
        return false;
    }
    status.observed_generation = v.generation;
    let fresh = Condition {
        type_: ACCEPTED_CONDITION.to_string(),
        status: v.status.to_string(),
        reason: v.reason.to_string(),
        message: v.message.clone(),
        observed_generation: v.generation,
        last_transition_time: Time(now),
    };
    match status.conditions.iter_mut().find(|c| c.type_ == ACCEPTED_CONDITION) {
        Some(c) => {
            let since = if c.status == fresh.status { c.last_transition_time.clone() } else { Time(now) };
            *c = Condition { last_transition_time: since, ..fresh };
        }
        None => status.conditions.push(fresh),
    }
    true
}

/// The reconciler.
#[derive(Debug, Default)]
pub struct NumaNetworkReconciler;

impl Reconciler<NumaNetwork> for NumaNetworkReconciler {
    type Error = kube::Error;

    async fn apply(&self, nn: Arc<NumaNetwork>, ctx: &Context) -> Result<Action, kube::Error> {
        if is_current(nn.status.as_ref(), &verdict(&nn)) {
            return Ok(Action::await_change());
        }
        let api: Api<NumaNetwork> = Api::all(ctx.client.clone());
        let params = PostParams { field_manager: Some(ctx.field_manager.clone()), ..PostParams::default() };
        let mut judged = None;
        let written =
            update_with_retry(&api, &nn.name_any(), Part::Status, &params, &RetryPolicy::conflicts(), |fresh| {
                // Judge the copy just read: its spec may be newer than the one that triggered us.
                let v = verdict(fresh);
                let changed = record(fresh.status.get_or_insert_with(NumaNetworkStatus::default), &v, Timestamp::now());
                judged = Some(v);
                changed
            })
            .await?;
        if let (Some(obj), Some(v)) = (written, judged)
            && v.status == "False"
        {
            ctx.event(&obj, EventType::Warning, "InvalidSpec", "Validate", Some(v.message)).await;
        }
        Ok(Action::await_change())
    }
}

/// Run the controller over every NumaNetwork until `shutdown` completes.
pub async fn run(ctx: Context, settings: Settings, shutdown: impl Future<Output = ()> + Send + Sync + 'static) {
    let api: Api<NumaNetwork> = Api::all(ctx.client.clone());
    weft_kube::controller::run(
        api,
        watcher::Config::default(),
        Scope::cluster(),
        Arc::new(NumaNetworkReconciler),
        ctx,
        settings,
        shutdown,
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::numanetwork::{DeviceClassReference, DranetClaimParameters, NumaNetworkSpec};

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
