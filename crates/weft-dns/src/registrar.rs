//! The registrar: a pod controller on weft's controller skeleton that keeps each ready vertex
//! pod's records in etcd, the lease they all hang on, and the start-up collection of stale ones.
//!
//! - **Apply** (a pod changed): the pod's [`plan`]; each refused entry is a Warning Event; if the
//!   pod is Ready, each wanted entry's address is read from its ResourceClaim and the record put
//!   (only when its value or lease differs from what is stored); records this registrar holds for
//!   the pod that are no longer wanted (not Ready, entry gone) are deleted. A claim without an
//!   address yet requeues the pod after [`DnsSettings::claim_requeue`].
//! - **Cleanup** (the pod is being deleted; finalizer [`FINALIZER`]): every record this registrar
//!   holds for the pod is deleted before the finalizer goes.
//! - What the registrar "holds for a pod" is read back from etcd, never remembered: the records
//!   under the pod's pipeline directory whose owner marker names this registrar and the pod.
//! - **Lease**: one per registrar, granted at start and kept alive every third of its TTL. If etcd
//!   says it is gone (the registrar could not reach etcd for a whole TTL), a new one is granted and
//!   every pod reconciled again, which puts the records back on it. A registrar that dies stops
//!   renewing; its records expire with the lease.
//! - **Start**: before the controller starts, the records under the prefix whose marker names this
//!   registrar and that no ready pod wants are deleted (pods gone or not ready while it was down).

use std::collections::{BTreeMap, HashSet};
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{Api, ListParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use tokio::sync::watch;
use tokio_stream::wrappers::WatchStream;
use tokio_util::sync::CancellationToken;
use weft_kube::controller::{Context, Reconciler, Scope, Settings};

use crate::etcd::EtcdStore;
use crate::pod::{ClaimAddress, ClaimRef, claim_address, claim_ref, plan};
use crate::record::{Owner, Prefix, Record, owner_of};
use crate::settings::{DnsSettings, SettingsError};
use crate::store::{KeepAlive, RecordStore, StoreError};

/// The controller's name in logs, metrics and Events.
pub const NAME: &str = "dns";
/// The finalizer the registrar keeps on the pods it watches, so that it sees their deletion.
pub const FINALIZER: &str = "weft.io/dns-records";

/// Longest wait between attempts to reach etcd at start or to get a lease back.
const MAX_RETRY: Duration = Duration::from_secs(30);

/// A reconcile that failed.
#[derive(Debug, thiserror::Error)]
pub enum RegistrarError {
    /// An etcd operation failed.
    #[error("pod {pod}: {source}")]
    Store {
        /// `namespace/name`.
        pod: String,
        /// What failed.
        #[source]
        source: StoreError,
    },
    /// Reading a ResourceClaim failed.
    #[error("pod {pod}: reading ResourceClaim {claim}: {source}")]
    Claim {
        /// `namespace/name`.
        pod: String,
        /// `namespace/name` of the claim.
        claim: String,
        /// What failed.
        #[source]
        source: kube::Error,
    },
}

/// The pod reconciler.
pub struct Registrar<S> {
    store: S,
    settings: DnsSettings,
    prefix: Prefix,
    lease: watch::Receiver<i64>,
}

impl<S: RecordStore> Registrar<S> {
    /// A registrar writing through `store` on the lease `lease` holds (validated `settings`).
    pub fn new(store: S, settings: DnsSettings, lease: watch::Receiver<i64>) -> Result<Registrar<S>, SettingsError> {
        settings.validate()?;
        let prefix = Prefix::new(&settings.prefix)?;
        Ok(Registrar { store, settings, prefix, lease })
    }

    fn owner(&self, pod: &Pod) -> Owner {
        Owner {
            owner: self.settings.registrar_id.clone(),
            namespace: pod.namespace().unwrap_or_default(),
            pod: pod.name_any(),
            pod_uid: pod.uid().unwrap_or_default(),
        }
    }

    /// Whether `value` is a record this registrar wrote for the pod `owner` names.
    fn is_ours_for(&self, value: &[u8], pod: &Owner) -> bool {
        owner_of(value).is_some_and(|o| o.owner == pod.owner && o.namespace == pod.namespace && o.pod == pod.pod)
    }

    fn store_err(pod: &Pod) -> impl Fn(StoreError) -> RegistrarError + '_ {
        move |source| RegistrarError::Store { pod: pod_name(pod), source }
    }

    /// Makes the records this registrar holds for `pod` under `dir` exactly `desired` (key → value),
    /// on the current lease.
    async fn sync(&self, pod: &Pod, dir: &str, desired: &BTreeMap<String, Vec<u8>>) -> Result<(), RegistrarError> {
        let me = self.owner(pod);
        let held: BTreeMap<String, (Vec<u8>, i64)> = self
            .store
            .get_prefix(dir)
            .await
            .map_err(Self::store_err(pod))?
            .into_iter()
            .filter(|kv| self.is_ours_for(&kv.value, &me))
            .map(|kv| (kv.key, (kv.value, kv.lease)))
            .collect();
        let lease = *self.lease.borrow();
        for (key, value) in desired {
            if held.get(key).is_some_and(|(v, l)| v == value && *l == lease) {
                continue;
            }
            self.store.put(key, value.clone(), lease).await.map_err(Self::store_err(pod))?;
            tracing::debug!(key, "DNS record put");
        }
        for key in held.keys().filter(|k| !desired.contains_key(*k)) {
            self.store.delete(key).await.map_err(Self::store_err(pod))?;
            tracing::debug!(key, "DNS record deleted");
        }
        Ok(())
    }
}

fn pod_name(pod: &Pod) -> String {
    format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any())
}

impl<S: RecordStore> Reconciler<Pod> for Registrar<S> {
    type Error = RegistrarError;

    fn finalizer(&self) -> Option<&str> {
        Some(FINALIZER)
    }

    async fn apply(&self, pod: Arc<Pod>, ctx: &Context) -> Result<Action, RegistrarError> {
        let plan = plan(&pod, &self.prefix, &self.settings.zone);
        for r in &plan.refused {
            ctx.event(&*pod, EventType::Warning, r.reason, "RegisterDNS", Some(r.message.clone())).await;
        }
        let Some(dir) = plan.dir.as_deref() else {
            // No domain can be formed from the labels: nothing was or will be written.
            return Ok(Action::await_change());
        };
        let mut desired = BTreeMap::new();
        let mut waiting = false;
        if plan.ready {
            let namespace = pod.namespace().unwrap_or_default();
            let claims: Api<ResourceClaim> = Api::namespaced(ctx.client.clone(), &namespace);
            for w in &plan.wanted {
                let name = match claim_ref(&pod, &w.claim) {
                    ClaimRef::Named(n) => n,
                    ClaimRef::Pending => {
                        waiting = true;
                        continue;
                    }
                    ClaimRef::Missing => {
                        let note = format!(
                            "NumaNetwork '{}': the pod has no resource claim '{}' (spec.resourceClaims); no record for {}",
                            w.network, w.claim, w.domain
                        );
                        ctx.event(&*pod, EventType::Warning, "VertexDomainRefused", "RegisterDNS", Some(note)).await;
                        continue;
                    }
                };
                let claim = claims.get_opt(&name).await.map_err(|source| RegistrarError::Claim {
                    pod: pod_name(&pod),
                    claim: format!("{namespace}/{name}"),
                    source,
                })?;
                match claim.as_ref().map(|c| claim_address(c, &self.settings.drivers)) {
                    Some(ClaimAddress::Ip(ip)) => {
                        let record = Record::new(ip, self.settings.ttl, self.owner(&pod)).with_port(plan.port);
                        desired.insert(w.key.clone(), record.to_bytes());
                    }
                    Some(ClaimAddress::NotYet) | None => waiting = true,
                    Some(ClaimAddress::Bad(why)) => {
                        ctx.event(&*pod, EventType::Warning, "BadClaimAddress", "RegisterDNS", Some(why)).await;
                        waiting = true;
                    }
                }
            }
        }
        self.sync(&pod, dir, &desired).await?;
        Ok(if waiting { Action::requeue(self.settings.claim_requeue) } else { Action::await_change() })
    }

    async fn cleanup(&self, pod: Arc<Pod>, _ctx: &Context) -> Result<Action, RegistrarError> {
        if let Some(dir) = plan(&pod, &self.prefix, &self.settings.zone).dir {
            self.sync(&pod, &dir, &BTreeMap::new()).await?;
        }
        Ok(Action::await_change())
    }
}

/// Deletes the records under the prefix that carry this registrar's marker and that no ready pod
/// among `pods` wants; returns how many it deleted.
pub async fn collect_stale<S: RecordStore>(
    store: &S,
    settings: &DnsSettings,
    pods: &[Pod],
) -> Result<usize, StoreError> {
    let Ok(prefix) = Prefix::new(&settings.prefix) else {
        return Ok(0);
    };
    let wanted: HashSet<String> = pods
        .iter()
        .map(|p| plan(p, &prefix, &settings.zone))
        .filter(|p| p.ready)
        .flat_map(|p| p.wanted.into_iter().map(|w| w.key))
        .collect();
    let mut deleted = 0;
    for kv in store.get_prefix(&prefix.dir()).await? {
        let ours = owner_of(&kv.value).is_some_and(|o| o.owner == settings.registrar_id);
        if ours && !wanted.contains(&kv.key) && store.delete(&kv.key).await? {
            tracing::info!(key = kv.key, "stale DNS record collected");
            deleted += 1;
        }
    }
    Ok(deleted)
}

/// Every pod the registrar watches, listed in pages.
async fn list_pods(client: &Client, selector: &str) -> Result<Vec<Pod>, kube::Error> {
    let api: Api<Pod> = Api::all(client.clone());
    let mut params = ListParams::default().labels(selector).limit(500);
    let mut out = Vec::new();
    loop {
        let page = api.list(&params).await?;
        out.extend(page.items);
        match page.metadata.continue_ {
            Some(c) if !c.is_empty() => params = params.continue_token(&c),
            _ => return Ok(out),
        }
    }
}

/// Retries `f` with doubling waits (up to [`MAX_RETRY`]) until it succeeds or `stop` is
/// cancelled (then `None`).
async fn retry<T, E: std::fmt::Display, F: Future<Output = Result<T, E>>>(
    what: &str,
    stop: &CancellationToken,
    mut f: impl FnMut() -> F,
) -> Option<T> {
    let mut wait = Duration::from_millis(200);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return None,
            r = f() => match r {
                Ok(v) => return Some(v),
                Err(e) => tracing::warn!(error = %e, retry_in = ?wait, "DNS registrar: {what} failed"),
            },
        }
        tokio::select! {
            _ = stop.cancelled() => return None,
            _ = tokio::time::sleep(wait) => {}
        }
        wait = (wait * 2).min(MAX_RETRY);
    }
}

/// Keeps the lease in `current` alive until `stop`; grants a new one (and publishes it) when etcd
/// says the old one is gone.
async fn keep_lease<S: RecordStore>(store: S, ttl: i64, current: watch::Sender<i64>, stop: CancellationToken) {
    let every = Duration::from_millis(u64::try_from(ttl).unwrap_or(1).saturating_mul(1000) / 3);
    'streams: loop {
        let lease = *current.borrow();
        let Some(mut ka) = retry("opening the lease keep-alive", &stop, || store.keep_alive(lease)).await else {
            return;
        };
        loop {
            let renewed = tokio::select! {
                _ = stop.cancelled() => return,
                r = ka.renew() => r,
            };
            match renewed {
                Ok(left) if left > 0 => {}
                Ok(_) => {
                    tracing::warn!(
                        lease = format!("{lease:x}"),
                        "DNS registrar: the etcd lease expired; granting a new one"
                    );
                    let Some(fresh) = retry("granting a new lease", &stop, || store.grant(ttl)).await else {
                        return;
                    };
                    tracing::info!(
                        lease = format!("{:x}", fresh.id),
                        "DNS registrar: new etcd lease; putting the records again"
                    );
                    current.send_replace(fresh.id);
                    continue 'streams;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "DNS registrar: renewing the etcd lease failed; reopening the stream");
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(every.min(Duration::from_secs(1))) => {}
                    }
                    continue 'streams;
                }
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(every) => {}
            }
        }
    }
}

/// Runs the registrar against etcd at `dns.endpoints` until `shutdown` completes: grant the lease,
/// collect stale records, then keep the lease alive and the records current. etcd being
/// unreachable is retried (logged), never returned; only settings that cannot work are errors,
/// returned before anything starts.
pub async fn run(
    ctx: Context,
    controller: Settings,
    dns: DnsSettings,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> Result<(), SettingsError> {
    dns.validate()?;
    let store = EtcdStore::connect(&dns.endpoints, dns.request_timeout)?;
    run_with_store(store, ctx, controller, dns, shutdown).await
}

/// [`run`] over any [`RecordStore`].
pub async fn run_with_store<S: RecordStore>(
    store: S,
    ctx: Context,
    controller: Settings,
    dns: DnsSettings,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> Result<(), SettingsError> {
    dns.validate()?;
    let stop = CancellationToken::new();
    let work = async {
        let ttl = dns.lease_secs();
        let Some(lease) = retry("granting the etcd lease", &stop, || store.grant(ttl)).await else {
            return Ok(());
        };
        tracing::info!(
            lease = format!("{:x}", lease.id),
            ttl = lease.ttl,
            endpoints = dns.endpoints.join(","),
            "DNS registrar: etcd lease granted"
        );
        let collected = retry("collecting stale records", &stop, || async {
            let pods = list_pods(&ctx.client, &dns.pod_selector).await.map_err(|e| e.to_string())?;
            collect_stale(&store, &dns, &pods).await.map_err(|e| e.to_string())
        })
        .await;
        let Some(collected) = collected else {
            return Ok(());
        };
        tracing::info!(collected, "DNS registrar: stale records collected");
        let (current, lease_rx) = watch::channel(lease.id);
        let registrar = Arc::new(Registrar::new(store.clone(), dns.clone(), lease_rx.clone())?);
        let api: Api<Pod> = Api::all(ctx.client.clone());
        let config = watcher::Config::default().labels(&dns.pod_selector);
        let stopped = stop.clone();
        let lease_changes = WatchStream::from_changes(lease_rx).map(|_| ());
        let keeper = keep_lease(store.clone(), ttl, current.clone(), stop.clone());
        let controller = weft_kube::controller::run_with(
            api,
            config,
            Scope::namespaced(),
            registrar,
            ctx.clone(),
            controller,
            async move { stopped.cancelled().await },
            |c| c.reconcile_all_on(lease_changes),
        );
        tokio::join!(keeper, controller);
        if dns.revoke_on_shutdown {
            let lease = *current.borrow();
            match store.revoke(lease).await {
                Ok(()) => tracing::info!(lease = format!("{lease:x}"), "DNS registrar: lease revoked, records removed"),
                Err(e) => {
                    tracing::warn!(error = %e, "DNS registrar: revoking the lease failed; its records expire with it")
                }
            }
        }
        Ok(())
    };
    let mut work = pin!(work);
    tokio::select! {
        r = &mut work => r,
        () = shutdown => {
            stop.cancel();
            work.await
        }
    }
}
