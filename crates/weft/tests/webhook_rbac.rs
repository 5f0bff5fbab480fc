//! The admission webhook's NumaNetwork lookups (`KubeNumaNetworks`: a watch of every NumaNetwork,
//! a GET for a name the watch has not delivered, a LIST to count them) against the fake API server
//! over HTTP: every request is granted by the webhook's ClusterRole
//! (deploy/components/webhook/rbac.yaml), and recorded for the whole-suite RBAC check.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams};
use weft_admission::webhook::{KubeNumaNetworks, KubePipelineCrd, NumaNetworkSource};
use weft_fakeapi::FakeApiServer;
use weft_fakeapi::Verb;

/// Longest a step may take (a hang guard, not a measurement).
const HANG_GUARD: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhooks_numanetwork_reads_are_granted_by_its_role() {
    let api = FakeApiServer::start().await;
    let crds: Api<CustomResourceDefinition> = Api::all(api.client());
    for crd in weft_crds::all() {
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
    api.insert(serde_json::json!({
        "apiVersion": "numaflow.numaproj.io/v1alpha1", "kind": "NumaNetwork",
        "metadata": {"name": "net-a"},
        "spec": {"refDeviceClass": {"name": "dranet-vf"}, "refResourceClaimDranet": {"ipRange": "10.0.0.0/24"}}
    }))
    .unwrap();
    let setup = api.requests().len();
    let networks = KubeNumaNetworks::spawn(api.client());
    tokio::time::timeout(HANG_GUARD, networks.wait_until_synced()).await.expect("the cache syncs");
    assert!(networks.cached("net-a"));
    assert!(!tokio::time::timeout(HANG_GUARD, networks.fetch("net-b")).await.unwrap().unwrap());
    let names = tokio::time::timeout(HANG_GUARD, networks.list()).await.unwrap().unwrap();
    assert_eq!(names, ["net-a"]);
    // The served Pipeline CRD, watched to tell which form of binding it keeps.
    let _crd = KubePipelineCrd::spawn(api.client());
    let listed = || api.requests().iter().any(|r| r.resource == "customresourcedefinitions" && r.verb == Verb::List);
    tokio::time::timeout(HANG_GUARD, async {
        while !listed() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the CRD watcher lists");
    weft_testkit::rbac::assert_granted(&api.requests()[setup..], &["components/webhook/rbac.yaml"]);
}
