//! The node's VFs as ResourceSlices on the fake API server: one pool named after the node, at most
//! 128 devices per slice, the pool generation bumped on every change, stale slices of this driver
//! and node deleted, other drivers' and nodes' slices left alone, and a deleted slice put back.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use k8s_openapi::api::resource::v1::{Device, ResourceSlice};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use weft_fakeapi::{FakeApiServer, Verb};
use weft_nic_dra::slices::{SyncOutcome, keep_published, sync_slices};

fn slice(name: &str, driver: &str, node: &str, pool: &str, generation: i64) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {"driver": driver, "nodeName": node, "pool": {"name": pool, "generation": generation, "resourceSliceCount": 1},
                 "devices": [{"name": "old"}]}
    })
}

fn ours(api: &FakeApiServer) -> Vec<ResourceSlice> {
    let mut s: Vec<ResourceSlice> = api
        .list_typed::<ResourceSlice>(None)
        .unwrap()
        .into_iter()
        .filter(|s| s.spec.driver == DRIVER && s.spec.node_name.as_deref() == Some(NODE))
        .collect();
    s.sort_by_key(|s| s.metadata.name.clone());
    s
}

#[tokio::test]
async fn the_vfs_are_published_kept_and_stale_slices_removed() {
    let dir = tempfile::tempdir().unwrap();
    let sriov = sysfs(dir.path());
    let devices = inventory(&sriov).api_devices();
    let api = FakeApiServer::start().await;
    // A slice an earlier run left under another pool name, and slices that are not ours.
    api.insert(slice("stale", DRIVER, NODE, "renamed", 5)).unwrap();
    api.insert(slice("other-node", DRIVER, "node-2", "node-2", 1)).unwrap();
    api.insert(slice("other-driver", "gpu.example.com", NODE, NODE, 1)).unwrap();

    let stop = CancellationToken::new();
    let task = tokio::spawn(keep_published(api.client(), NODE.into(), devices.clone(), stop.clone()));
    guard("the slice", api.wait_for(|a| ours(a).len() == 1 && ours(a)[0].spec.pool.name == NODE)).await;
    let s = &ours(&api)[0];
    assert_eq!(
        (s.spec.pool.generation, s.spec.pool.resource_slice_count),
        (6, 1),
        "above the stale slice's generation"
    );
    assert_eq!(s.spec.node_name.as_deref(), Some(NODE));
    assert!(s.metadata.name.as_deref().unwrap().starts_with("node-1-nic.weft.io-"), "{:?}", s.metadata.name);
    let got: &[Device] = s.spec.devices.as_deref().unwrap();
    assert_eq!(got, devices.as_slice());
    let names: Vec<&str> = got.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names[0], "vf-0000-03-00-2");
    assert_eq!(names.len(), 8);
    let a = got[0].attributes.as_ref().unwrap();
    let string = |k: &str| a[k].string.as_deref().unwrap().to_string();
    assert_eq!(string("nic.weft.io/pciAddress"), "0000:03:00.2");
    assert_eq!(string("resource.kubernetes.io/pcieRoot"), "pci0000:00");
    assert_eq!(string("nic.weft.io/physnet"), "fabric");
    assert_eq!(string("nic.weft.io/pf"), "ens1f0");
    assert_eq!(a["nic.weft.io/numaNode"].int, Some(0));
    assert_eq!(a["nic.weft.io/rdma"].bool, Some(true));
    assert_eq!(a["nic.weft.io/linkSpeed"].int, Some(200_000));
    assert_eq!(a["nic.weft.io/vfIndex"].int, Some(0));
    let b = got[4].attributes.as_ref().unwrap();
    assert_eq!(b["resource.kubernetes.io/pcieRoot"].string.as_deref(), Some("pci0000:80"));
    assert_eq!((b["nic.weft.io/rdma"].bool, b["nic.weft.io/numaNode"].int), (Some(false), Some(1)));
    assert!(api.get("resourceslices", None, "stale").is_none());
    assert!(
        api.get("resourceslices", None, "other-node").is_some()
            && api.get("resourceslices", None, "other-driver").is_some()
    );

    // The kubelet wipes the node's slices when it starts: they come back, one generation up.
    let name = s.metadata.name.clone().unwrap();
    api.remove("resourceslices", None, &name);
    guard("the slice to come back", api.wait_for(|a| ours(a).first().is_some_and(|s| s.spec.pool.generation == 7)))
        .await;
    assert_eq!(ours(&api)[0].spec.devices.as_deref().unwrap(), devices.as_slice());
    stop.cancel();
    guard("the publisher to stop", task).await.unwrap();
    // Every request the publisher made is granted by the agent's ClusterRoles (base and nic-dra).
    weft_testkit::rbac::assert_granted(&api.requests(), &["base/agent/rbac.yaml", "components/nic-dra/rbac.yaml"]);
}

#[tokio::test]
async fn more_than_128_devices_take_several_slices_and_a_change_bumps_the_generation() {
    let api = FakeApiServer::start().await;
    let client = api.client();
    let many: Vec<Device> = (0..300).map(|i| Device { name: format!("vf-{i:03}"), ..Device::default() }).collect();
    let out = guard("sync", sync_slices(&client, NODE, &many)).await.unwrap();
    assert_eq!(out, SyncOutcome::Written { generation: 1, slices: 3, deleted: 0 });
    let slices = ours(&api);
    let sizes: Vec<usize> = slices.iter().map(|s| s.spec.devices.as_ref().unwrap().len()).collect();
    assert_eq!(sizes.iter().sum::<usize>(), 300);
    assert!(sizes.iter().all(|n| *n <= 128), "{sizes:?}");
    assert!(slices.iter().all(|s| s.spec.pool.resource_slice_count == 3 && s.spec.pool.generation == 1));

    // Nothing changed: nothing is written.
    api.clear_requests();
    assert_eq!(guard("sync", sync_slices(&client, NODE, &many)).await.unwrap(), SyncOutcome::Unchanged);
    assert!(api.requests().iter().all(|r| r.verb == Verb::List), "{:?}", api.requests());

    // Fewer devices: one slice, the next generation, the others deleted.
    let out = guard("sync", sync_slices(&client, NODE, &many[..10])).await.unwrap();
    assert_eq!(out, SyncOutcome::Written { generation: 2, slices: 1, deleted: 2 });
    let slices = ours(&api);
    assert_eq!(slices.len(), 1);
    assert_eq!(slices[0].spec.devices.as_ref().unwrap().len(), 10);
    assert_eq!((slices[0].spec.pool.generation, slices[0].spec.pool.resource_slice_count), (2, 1));
    weft_testkit::rbac::assert_granted(&api.requests(), &["base/agent/rbac.yaml", "components/nic-dra/rbac.yaml"]);
}
