//! The library in process, with the recording fake PF (no machine here has SR-IOV), real namespaces
//! and veths for everything else; and the real netlink PF control against a veth.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use serde_json::{Value, json};
use weft_cni::net::Links;
use weft_cni::pf::{FakePfControl, Mac, NetlinkPfControl, PfCall, PfControl, PfError, PfVfState, VlanProto};

fn run(pf: &FakePfControl, env: &[(&str, String)], conf: &Value) -> weft_cni::Outcome {
    let map: std::collections::BTreeMap<String, String> = env.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
    weft_cni::run(|k| map.get(k).cloned(), conf.to_string().as_bytes(), pf)
}

fn zero_mac() -> Mac {
    Mac(vec![0; 6])
}

#[test]
fn vlan_and_mac_are_set_through_the_pf_and_restored_on_del() {
    if !can_host_local() {
        return;
    }
    let node = Node::new(1, "wcpf0");
    let ns = NetnsGuard::new();
    let original = PfVfState { vlan: 7, qos: 1, proto: VlanProto::Dot1Q, admin_mac: Some(zero_mac()) };
    let pf = FakePfControl::new().with_state("wcpf0", 0, original.clone());
    let conf = node.conf(
        "1.1.0",
        "net-v",
        Some(0),
        "10.71.0.0/24",
        json!({"vlan": 100, "vlanQoS": 2, "vlanProto": "802.1ad", "mac": "02:00:00:aa:bb:cc"}),
    );
    let out = run(&pf, &cni_env("ADD", "c1", Some(&ns.path()), "net1"), &conf);
    assert_eq!(out.exit_code, 0, "{}", out.stdout);
    let result: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(result["interfaces"][0]["mac"], "02:00:00:aa:bb:cc");
    assert_eq!(link("net1", Some(&ns.name)).unwrap().mac, "02:00:00:aa:bb:cc");
    let mac = Mac::parse("02:00:00:aa:bb:cc").unwrap();
    assert_eq!(
        pf.calls(),
        [
            PfCall::State { pf: "wcpf0".into(), vf: 0 },
            PfCall::SetVlan { pf: "wcpf0".into(), vf: 0, vlan: 100, qos: 2, proto: VlanProto::Dot1Ad },
            PfCall::SetMac { pf: "wcpf0".into(), vf: 0, mac: mac.clone() },
        ]
    );
    assert_eq!(pf.current("wcpf0", 0), PfVfState { vlan: 100, qos: 2, proto: VlanProto::Dot1Ad, admin_mac: Some(mac) });
    let cached: Value = serde_json::from_slice(&std::fs::read(node.cache().join("c1-net1.json")).unwrap()).unwrap();
    assert_eq!(cached["vfs"][0]["vif"]["vlan"], 100);
    assert_eq!(cached["vfs"][0]["original"]["pf"]["vlan"], 7);

    let out = run(&pf, &cni_env("DEL", "c1", Some(&ns.path()), "net1"), &conf);
    assert_eq!(out.exit_code, 0, "{}", out.stdout);
    let calls = pf.calls();
    assert_eq!(
        calls[3..],
        [
            PfCall::SetMac { pf: "wcpf0".into(), vf: 0, mac: zero_mac() },
            PfCall::SetVlan { pf: "wcpf0".into(), vf: 0, vlan: 7, qos: 1, proto: VlanProto::Dot1Q },
        ]
    );
    assert_eq!(pf.current("wcpf0", 0), original);
    // The netdev's own MAC is the one it had before ADD.
    let vf = link(&node.vfs[0].1.name, None).unwrap();
    assert_ne!(vf.mac, "02:00:00:aa:bb:cc");
}

#[test]
fn a_pf_refusing_the_mac_undoes_the_vlan_and_leaves_the_vf_alone() {
    if !can_host_local() {
        return;
    }
    let node = Node::new(1, "wcpf0");
    let ns = NetnsGuard::new();
    let vf = node.vfs[0].1.name.clone();
    let before = link(&vf, None).unwrap();
    let mut pf = FakePfControl::new();
    pf.fail_mac = Some("Operation not permitted".into());
    let conf = node.conf("1.1.0", "net-w", Some(0), "10.72.0.0/24", json!({"vlan": 100, "mac": "02:00:00:aa:bb:cd"}));
    let out = run(&pf, &cni_env("ADD", "c1", Some(&ns.path()), "net1"), &conf);
    assert_eq!(out.exit_code, 1);
    let err: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(err["code"], 102);
    assert!(err["msg"].as_str().unwrap().ends_with("Operation not permitted"), "{err}");
    assert_eq!(
        pf.calls().last(),
        Some(&PfCall::SetVlan { pf: "wcpf0".into(), vf: 0, vlan: 0, qos: 0, proto: VlanProto::Dot1Q }),
        "the VLAN goes back to what the PF reported"
    );
    assert_eq!(pf.current("wcpf0", 0).vlan, 0);
    assert_eq!(link(&vf, None), Some(before));
    assert!(node.cached().is_empty());
}

#[test]
fn a_failure_after_the_move_returns_the_vf_and_releases_its_address() {
    if !can_host_local() {
        return;
    }
    // host-local hands out the address, but its route cannot be added (its gateway is off-link),
    // after the VF is already in the pod with its address.
    let node = Node::new(1, "wcpf0");
    let ns = NetnsGuard::new();
    let vf = node.vfs[0].1.name.clone();
    let before = link(&vf, None).unwrap();
    let mut conf = node.conf("1.0.0", "net-x", Some(0), "10.73.0.0/24", json!({"mtu": 1450}));
    conf["ipam"]["routes"] = json!([{"dst": "10.90.0.0/16", "gw": "192.0.2.1"}]);
    let pf = FakePfControl::new();
    let out = run(&pf, &cni_env("ADD", "c1", Some(&ns.path()), "net1"), &conf);
    assert_eq!(out.exit_code, 1, "{}", out.stdout);
    let err: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(err["code"], 104);
    assert!(err["msg"].as_str().unwrap().contains("adding route 10.90.0.0/16 to net1"), "{err}");
    assert_eq!(link(&vf, None), Some(before), "back with its name, MTU and state");
    assert!(link("net1", Some(&ns.name)).is_none());
    assert!(node.held_ips("net-x").is_empty(), "IPAM DEL released the address");
    assert!(node.cached().is_empty());
    assert_eq!(node.record(0), None);
    assert!(pf.calls().is_empty(), "no VLAN or MAC asked, so the PF is not touched");
}

#[test]
fn weft_ipam_hands_out_the_physnet_range_and_the_physnet_vlan() {
    if !can_netns() {
        return;
    }
    let node = Node::new(2, "wcpf0");
    let (a, b) = (NetnsGuard::new(), NetnsGuard::new());
    let physnets = node.dir.path().join("physnets.yaml");
    std::fs::write(
        &physnets,
        "physnets:\n  - name: physnet2\n    devices: [wcpf0]\n    subnet: 10.74.0.0/29\n    rangeStart: 10.74.0.2\n    rangeEnd: 10.74.0.2\n    gateway: 10.74.0.1\n    vlan: 300\n    mtu: 1480\n",
    )
    .unwrap();
    let extra = json!({"physnet": "physnet2", "physnetConfig": physnets, "ipam": {"type": "weft"}});
    let conf_a = node.conf("1.1.0", "net-y", Some(0), "unused", extra.clone());
    let conf_b = node.conf("1.1.0", "net-y", Some(1), "unused", extra);
    let pf = FakePfControl::new();
    let out = run(&pf, &cni_env("ADD", "ca", Some(&a.path()), "net1"), &conf_a);
    assert_eq!(out.exit_code, 0, "{}", out.stdout);
    let r: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(r["ips"][0], json!({"address": "10.74.0.2/29", "gateway": "10.74.0.1", "interface": 0}));
    assert_eq!(r["interfaces"][0]["mtu"], 1480);
    assert_eq!(addresses("net1", &a.name), ["10.74.0.2/29"]);
    assert!(matches!(pf.calls()[1], PfCall::SetVlan { vlan: 300, .. }), "{:?}", pf.calls());
    // The range has one address: the second pod cannot get one, and its VF stays in the host.
    let out = run(&pf, &cni_env("ADD", "cb", Some(&b.path()), "net1"), &conf_b);
    assert_eq!(out.exit_code, 1);
    let err: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(err["code"], 107, "{err}");
    assert!(link(&node.vfs[1].1.name, None).is_some());
    // STATUS says the range is exhausted.
    let status = run(&pf, &[("CNI_COMMAND", "STATUS".into())], &conf_a);
    assert_eq!(status.exit_code, 1);
    let err: Value = serde_json::from_str(&status.stdout).unwrap();
    assert_eq!(err["code"], 50, "{err}");
    // DEL releases it; then the second pod gets it.
    assert_eq!(run(&pf, &cni_env("DEL", "ca", Some(&a.path()), "net1"), &conf_a).exit_code, 0);
    let out = run(&pf, &cni_env("ADD", "cb", Some(&b.path()), "net1"), &conf_b);
    assert_eq!(out.exit_code, 0, "{}", out.stdout);
    assert_eq!(run(&pf, &cni_env("DEL", "cb", Some(&b.path()), "net1"), &conf_b).exit_code, 0);
}

#[test]
fn netlink_pf_control_on_a_veth_fails_cleanly() {
    if !can_netns() {
        return;
    }
    let pf = VethGuard::new("wcq");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let host = Links::here().unwrap();
        let state = NetlinkPfControl.vf_state(&host, &pf.name, 0).await;
        assert_eq!(state, Err(PfError::NoVfs { pf: pf.name.clone() }));
        let e = NetlinkPfControl.set_vlan(&host, &pf.name, 0, 100, 0, VlanProto::Dot1Q).await.unwrap_err();
        let text = e.to_string();
        assert!(text.starts_with(&format!("setting VF 0 of PF {} to vlan 100", pf.name)), "{text}");
        assert!(text.contains("Operation not supported"), "{text}");
        let e =
            NetlinkPfControl.set_mac(&host, &pf.name, 0, &Mac::parse("02:00:00:00:00:01").unwrap()).await.unwrap_err();
        assert!(e.to_string().contains("Operation not supported"), "{e}");
        let e = NetlinkPfControl.vf_state(&host, "wcnosuchpf", 0).await.unwrap_err();
        assert_eq!(e, PfError::NoPf { pf: "wcnosuchpf".into() });
    });
}
