//! dranet's profile provider over real HTTP, with addresses kept as NetworkAddress objects on the
//! fake API server: the requests dranet's webhook client sends (`pkg/cloudprovider/webhook`), and
//! the status codes it documents.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use weft_crds::profile_provider::{ProfileProvider, serve};
use weft_crds::{DeviceClassReference, DranetClaimParameters, NumaNetwork, NumaNetworkSpec};
use weft_fakeapi::FakeApiServer;

struct Provider {
    url: String,
    stop: CancellationToken,
    http: reqwest::Client,
}

async fn start(server: &FakeApiServer) -> Provider {
    let client = server.client();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in weft_crds::all() {
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
    let nets: Api<NumaNetwork> = Api::all(client.clone());
    let spec = |range: &str| NumaNetworkSpec {
        ref_device_class: DeviceClassReference { name: "dranet-vf".into() },
        ref_resource_claim_dranet: DranetClaimParameters {
            ip_range: range.into(),
            ethernet_speed: None,
            vlan_tag: None,
        },
    };
    nets.create(&PostParams::default(), &NumaNetwork::new("net-a", spec("192.168.10.0/24"))).await.unwrap();
    nets.create(&PostParams::default(), &NumaNetwork::new("tiny", spec("10.9.0.0/30"))).await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let stop = CancellationToken::new();
    let s = stop.clone();
    tokio::spawn(serve(ProfileProvider::new(client), listener, async move { s.cancelled().await }));
    Provider { url, stop, http: reqwest::Client::new() }
}

fn body(profile: &str, claim: &str, device: &str) -> Value {
    json!({
        "device": {"name": device, "pci_address": "0000:3b:02.1", "mac_address": "aa:bb:cc:00:00:01"},
        "claim_uid": claim,
        "config": {"profile": profile, "interface": {"name": "net1"}}
    })
}

impl Provider {
    async fn post(&self, path: &str, body: &Value) -> (u16, String) {
        let r = self.http.post(format!("{}{path}", self.url)).json(body).send().await.unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    }

    async fn get_config(&self, profile: &str, claim: &str, device: &str) -> (u16, String) {
        self.post("/GetProfileConfig", &body(profile, claim, device)).await
    }
}

fn addresses(text: &str) -> Value {
    serde_json::from_str::<Value>(text).unwrap()["interface"]["addresses"].clone()
}

#[tokio::test]
async fn health_declares_a_profile_provider_only() {
    let server = FakeApiServer::start().await;
    let p = start(&server).await;
    let r = p.http.get(format!("{}/health", p.url)).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(r.json::<Value>().await.unwrap(), json!({"cloudProvider": false, "profileProvider": true}));
    p.stop.cancel();
}

#[tokio::test]
async fn addresses_are_handed_out_once_per_claim_and_device_and_given_back() {
    let server = FakeApiServer::start().await;
    let p = start(&server).await;
    let setup = server.requests().len();
    let (code, text) = p.get_config("weft.io/net-a", "claim-1", "pci-0000-3b-02-1").await;
    assert_eq!(code, 200, "{text}");
    assert_eq!(addresses(&text), json!(["192.168.10.1/24"]));
    // dranet retries prepare: the same (claim, device) gets the same address.
    let (_, again) = p.get_config("weft.io/net-a", "claim-1", "pci-0000-3b-02-1").await;
    assert_eq!(addresses(&again), json!(["192.168.10.1/24"]));
    let (_, other) = p.get_config("weft.io/net-a", "claim-2", "pci-0000-3b-02-2").await;
    assert_eq!(addresses(&other), json!(["192.168.10.2/24"]));
    assert_eq!(server.list("networkaddresses", None).len(), 2);

    let (code, _) = p.post("/ReleaseProfileConfig", &body("weft.io/net-a", "claim-1", "pci-0000-3b-02-1")).await;
    assert_eq!(code, 200);
    let held: Vec<Value> = server.list("networkaddresses", None).iter().map(|a| a["spec"]["address"].clone()).collect();
    assert_eq!(held, vec![json!("192.168.10.2")]);
    // Releasing again (dranet does not track it) is still fine.
    let (code, _) = p.post("/ReleaseProfileConfig", &body("weft.io/net-a", "claim-1", "pci-0000-3b-02-1")).await;
    assert_eq!(code, 200);
    // The freed address is the next one handed out.
    let (_, third) = p.get_config("weft.io/net-a", "claim-3", "pci-0000-3b-02-3").await;
    assert_eq!(addresses(&third), json!(["192.168.10.1/24"]));
    p.stop.cancel();
    // What the provider asked of the API server (after the test's own setup) is granted by the
    // controller's ClusterRole, which the component runs it under.
    weft_testkit::rbac::assert_granted(&server.requests()[setup..], &["base/controller/rbac.yaml"]);
}

#[tokio::test]
async fn refusals_use_dranets_status_codes() {
    let server = FakeApiServer::start().await;
    let p = start(&server).await;
    let (code, text) = p.get_config("acme.com/overlay", "c", "d").await;
    assert_eq!(code, 404, "{text}");
    assert!(text.contains("acme.com/overlay"), "{text}");
    let (code, text) = p.get_config("weft.io/missing", "c", "d").await;
    assert_eq!(code, 404, "{text}");
    assert!(text.contains("NumaNetwork missing does not exist"), "{text}");
    let (code, _) = p.post("/GetProfileConfig", &json!({"device": {}, "claim_uid": ""})).await;
    assert_eq!(code, 400);
    let (code, _) = p.post("/GetProfileConfig", &json!("not an object")).await;
    assert_eq!(code, 400);
    // A /30 has two usable addresses: the third claim is refused with a conflict.
    for (claim, want) in [("a", "10.9.0.1/30"), ("b", "10.9.0.2/30")] {
        let (code, text) = p.get_config("weft.io/tiny", claim, "d").await;
        assert_eq!((code, addresses(&text)), (200, json!([want])));
    }
    let (code, text) = p.get_config("weft.io/tiny", "c", "d").await;
    assert_eq!(code, 409, "{text}");
    assert!(text.contains("no free address in 10.9.0.0/30"), "{text}");
    p.stop.cancel();
}
