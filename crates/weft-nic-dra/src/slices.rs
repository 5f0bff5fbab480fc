//! The node's VFs as ResourceSlices: one pool named after the node, `spec.nodeName` set, at most
//! [`MAX_DEVICES_PER_SLICE`] devices per slice (more devices: more slices, each saying how many
//! the pool has in `resourceSliceCount`).
//!
//! [`sync_slices`] makes the API server hold exactly the desired slices: it lists this driver's
//! slices of this node (field selectors `spec.driver`, `spec.nodeName`), and when they already say
//! what it would write it writes nothing; otherwise it writes every slice with the pool generation
//! one above the highest it found (the scheduler takes the slices of a pool's highest generation,
//! so none of the old set mixes with the new), updating slices in place, creating missing ones
//! (`generateName: <node>-nic.weft.io-`) and deleting the rest, stale pools included.
//! [`keep_published`] runs it at start and again on every change a watch of those slices shows
//! (the kubelet deletes a node's slices when it starts, or when a driver goes away).

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::resource::v1::{Device, ResourcePool, ResourceSlice, ResourceSliceSpec};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use tokio_util::sync::CancellationToken;
use weft_net::nic_claim::DRIVER;

/// The most devices one ResourceSlice may hold.
pub const MAX_DEVICES_PER_SLICE: usize = 128;
/// Conflicting writes (another writer between our list and our write) retried before giving up.
const CONFLICT_RETRIES: usize = 5;

/// Why the slices could not be made current.
#[derive(Debug, thiserror::Error)]
#[error("{what}: {source}")]
pub struct SliceError {
    /// What was being done.
    pub what: String,
    /// The client's error.
    #[source]
    pub source: kube::Error,
}

/// What a sync did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncOutcome {
    /// The slices were current.
    Unchanged,
    /// The slices were written.
    Written {
        /// The pool generation written.
        generation: i64,
        /// Slices written (updated or created).
        slices: usize,
        /// Slices deleted.
        deleted: usize,
    },
}

/// The field selector of this driver's slices of `node`.
pub fn field_selector(node: &str) -> String {
    format!("spec.driver={DRIVER},spec.nodeName={node}")
}

/// The slices of pool `node` holding `devices` (in their order) at `generation`: chunks of at most
/// [`MAX_DEVICES_PER_SLICE`]; one empty slice when there are no devices, so the pool is known to
/// be empty.
pub fn desired_specs(node: &str, devices: &[Device], generation: i64) -> Vec<ResourceSliceSpec> {
    let chunks: Vec<&[Device]> =
        if devices.is_empty() { vec![&[]] } else { devices.chunks(MAX_DEVICES_PER_SLICE).collect() };
    let count = i64::try_from(chunks.len()).unwrap_or(i64::MAX);
    chunks
        .into_iter()
        .map(|chunk| ResourceSliceSpec {
            driver: DRIVER.to_string(),
            node_name: Some(node.to_string()),
            pool: ResourcePool { name: node.to_string(), generation, resource_slice_count: count },
            devices: Some(chunk.to_vec()),
            ..ResourceSliceSpec::default()
        })
        .collect()
}

/// Whether `existing` already says what `desired` does (driver, node, pool and devices).
fn same(existing: &ResourceSliceSpec, desired: &ResourceSliceSpec) -> bool {
    existing.driver == desired.driver
        && existing.node_name == desired.node_name
        && existing.pool == desired.pool
        && existing.devices.as_deref().unwrap_or_default() == desired.devices.as_deref().unwrap_or_default()
}

/// Whether every desired slice is among `existing` (slice names are generated, so their order says
/// nothing: each desired spec is matched with an existing slice of its own).
fn all_present(existing: &[ResourceSlice], desired: &[ResourceSliceSpec]) -> bool {
    let mut used = vec![false; existing.len()];
    desired.iter().all(|d| {
        let found = existing.iter().enumerate().position(|(i, s)| !used[i] && same(&s.spec, d));
        found.map(|i| used[i] = true).is_some()
    })
}

/// `generateName` of new slices: `<node>-nic.weft.io-` (the node name shortened when it would make
/// the name too long).
fn generate_name(node: &str) -> String {
    let end = (0..=node.len().min(200)).rev().find(|i| node.is_char_boundary(*i)).unwrap_or(0);
    let node = node[..end].trim_end_matches(['.', '-']);
    format!("{node}-{DRIVER}-")
}

fn api_error(what: String) -> impl FnOnce(kube::Error) -> SliceError {
    move |source| SliceError { what, source }
}

fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.is_conflict())
}

/// Makes the API server hold exactly the slices of `devices` in pool `node` (see the module docs).
pub async fn sync_slices(client: &kube::Client, node: &str, devices: &[Device]) -> Result<SyncOutcome, SliceError> {
    sync_slices_above(client, node, devices, 0).await
}

/// [`sync_slices`], writing a generation above `floor` too (the highest this process wrote, so
/// the generation never goes back when every slice was deleted behind its back).
pub async fn sync_slices_above(
    client: &kube::Client,
    node: &str,
    devices: &[Device],
    floor: i64,
) -> Result<SyncOutcome, SliceError> {
    let mut attempt = 0;
    loop {
        match sync_once(client, node, devices, floor).await {
            Err(e) if is_conflict(&e.source) && attempt < CONFLICT_RETRIES => attempt += 1,
            other => return other,
        }
    }
}

async fn sync_once(
    client: &kube::Client,
    node: &str,
    devices: &[Device],
    floor: i64,
) -> Result<SyncOutcome, SliceError> {
    let api: Api<ResourceSlice> = Api::all(client.clone());
    let listed = api
        .list(&ListParams::default().fields(&field_selector(node)))
        .await
        .map_err(api_error(format!("listing the {DRIVER} ResourceSlices of node {node}")))?;
    let mut ours: Vec<ResourceSlice> = Vec::new();
    let mut stale: Vec<ResourceSlice> = Vec::new();
    for s in listed.items {
        if s.spec.pool.name == node { ours.push(s) } else { stale.push(s) }
    }
    ours.sort_by_key(|s| s.name_any());
    let generation = ours.iter().chain(&stale).map(|s| s.spec.pool.generation).max().unwrap_or(0);
    let current = desired_specs(node, devices, generation);
    if stale.is_empty() && ours.len() == current.len() && all_present(&ours, &current) {
        return Ok(SyncOutcome::Unchanged);
    }
    let generation = generation.max(floor) + 1;
    let desired = desired_specs(node, devices, generation);
    let mut written = 0;
    for (i, spec) in desired.iter().enumerate() {
        match ours.get(i) {
            Some(existing) => {
                let name = existing.name_any();
                let mut updated = existing.clone();
                updated.spec = spec.clone();
                api.replace(&name, &PostParams::default(), &updated)
                    .await
                    .map_err(api_error(format!("updating ResourceSlice {name}")))?;
            }
            None => {
                let mut slice = ResourceSlice { spec: spec.clone(), ..ResourceSlice::default() };
                slice.metadata.generate_name = Some(generate_name(node));
                api.create(&PostParams::default(), &slice)
                    .await
                    .map_err(api_error(format!("creating a ResourceSlice of node {node}")))?;
            }
        }
        written += 1;
    }
    let mut deleted = 0;
    for s in ours.iter().skip(desired.len()).chain(&stale) {
        let name = s.name_any();
        match api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => deleted += 1,
            Err(kube::Error::Api(st)) if st.is_not_found() => {}
            Err(e) => return Err(api_error(format!("deleting ResourceSlice {name}"))(e)),
        }
    }
    Ok(SyncOutcome::Written { generation, slices: written, deleted })
}

/// Keeps the slices of `devices` published until `shutdown`: a sync at start, then one after every
/// change to this driver's slices of the node (a failed sync is retried with backoff, 1 s doubling
/// to 1 min). The pool generation only grows while it runs.
pub async fn keep_published(client: kube::Client, node: String, devices: Vec<Device>, shutdown: CancellationToken) {
    let api: Api<ResourceSlice> = Api::all(client.clone());
    let config = watcher::Config::default().fields(&field_selector(&node));
    let mut changes = watcher(api, config).default_backoff().boxed();
    let mut backoff = Duration::from_secs(1);
    let mut written = 0;
    loop {
        match sync_slices_above(&client, &node, &devices, written).await {
            Ok(SyncOutcome::Unchanged) => backoff = Duration::from_secs(1),
            Ok(SyncOutcome::Written { generation, slices, deleted }) => {
                written = generation;
                tracing::info!(%node, generation, slices, deleted, devices = devices.len(), "published the VFs as ResourceSlices");
                backoff = Duration::from_secs(1);
            }
            Err(e) => {
                tracing::warn!(%node, error = %e, "publishing the VFs as ResourceSlices; retrying in {backoff:?}");
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(60));
                continue;
            }
        }
        // Wait for a change worth a look: a slice written or deleted, or a fresh list.
        loop {
            let event = tokio::select! {
                () = shutdown.cancelled() => return,
                e = changes.next() => e,
            };
            match event {
                None => return,
                Some(Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_) | watcher::Event::InitDone)) => break,
                Some(Ok(_)) => {}
                Some(Err(e)) => tracing::debug!(%node, error = %e, "watching the ResourceSlices"),
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests assert by unwrapping
mod tests {
    use super::*;

    fn dev(i: usize) -> Device {
        Device { name: format!("vf-{i}"), ..Device::default() }
    }

    #[test]
    fn at_most_128_devices_per_slice_and_every_slice_counts_the_pool() {
        let devices: Vec<Device> = (0..300).map(dev).collect();
        let specs = desired_specs("n1", &devices, 4);
        let sizes: Vec<usize> = specs.iter().map(|s| s.devices.as_ref().unwrap().len()).collect();
        assert_eq!(sizes, [128, 128, 44]);
        for s in &specs {
            assert_eq!(s.pool, ResourcePool { name: "n1".into(), generation: 4, resource_slice_count: 3 });
            assert_eq!((s.driver.as_str(), s.node_name.as_deref()), (DRIVER, Some("n1")));
        }
        let empty = desired_specs("n1", &[], 1);
        assert_eq!(empty.len(), 1);
        assert_eq!(empty[0].pool.resource_slice_count, 1);
        assert_eq!(generate_name("n1"), "n1-nic.weft.io-");
        assert!(generate_name(&format!("{}.x", "a".repeat(200))).len() <= 200 + DRIVER.len() + 2);
    }
}
