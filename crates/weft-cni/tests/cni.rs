//! The CNI contract, through the built executable as a runtime runs it: real network namespaces,
//! veth host ends as VFs (named as VFs in a fake sysfs), Debian's host-local for addresses.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::fs::OpenOptions;

use common::*;
use serde_json::{Value, json};

const V: &str = "1.1.0";

#[test]
fn add_check_del_moves_the_vf_into_the_pod_and_back() {
    if !can_host_local() {
        return;
    }
    let node = Node::new(1, "wcpf0");
    let ns = NetnsGuard::new();
    let vf = &node.vfs[0].1.name;
    let before = link(vf, None).expect("the VF is in the host");
    let conf = node.conf(V, "net-a", Some(0), "10.61.0.0/24", json!({"mtu": 1400}));

    let (result, ok, err) = exec(&cni_env("ADD", "c1", Some(&ns.path()), "net1"), &conf);
    assert!(ok, "ADD failed: {result} {err}");
    assert_eq!(result["cniVersion"], V);
    let iface = &result["interfaces"][0];
    assert_eq!(iface["name"], "net1");
    assert_eq!(iface["mac"], before.mac.as_str());
    assert_eq!(iface["mtu"], 1400);
    assert_eq!(iface["sandbox"], ns.path().as_str());
    assert_eq!(iface["pciID"], node.vfs[0].0.as_str());
    assert_eq!(result["ips"][0]["address"], "10.61.0.2/24");
    assert_eq!(result["ips"][0]["gateway"], "10.61.0.1");
    assert_eq!(result["ips"][0]["interface"], 0);

    // In the pod under its name, with MAC, MTU and address; gone from the host.
    let inside = link("net1", Some(&ns.name)).expect("net1 in the pod");
    assert_eq!((inside.mac.as_str(), inside.mtu, inside.up), (before.mac.as_str(), 1400, true));
    assert_eq!(addresses("net1", &ns.name), ["10.61.0.2/24"]);
    assert!(link(vf, None).is_none(), "{vf} should have left the host");
    assert_eq!(node.cached(), ["c1-net1.json"]);
    assert_eq!(node.record(0).as_deref(), Some(ns.path().as_str()));
    assert_eq!(node.held_ips("net-a"), ["10.61.0.2"]);

    // The cache holds the original state and the VIF.
    let cached: Value = serde_json::from_slice(&std::fs::read(node.cache().join("c1-net1.json")).unwrap()).unwrap();
    assert_eq!(cached["vfs"][0]["original"]["hostIfname"], vf.as_str());
    assert_eq!(cached["vfs"][0]["original"]["mtu"], 1500);
    assert_eq!(cached["vfs"][0]["vif"]["pciAddress"], node.vfs[0].0.as_str());
    assert_eq!(cached["vfs"][0]["vif"]["ips"], json!(["10.61.0.2/24"]));

    // CHECK with the ADD result passes; once the MTU drifts it names what differs.
    let mut check = conf.clone();
    check["prevResult"] = result.clone();
    let (out, ok, err) = exec(&cni_env("CHECK", "c1", Some(&ns.path()), "net1"), &check);
    assert!(ok, "CHECK failed: {out} {err}");
    assert_eq!(out, Value::Null, "CHECK prints nothing on success");
    std::process::Command::new("ip").args(["-n", &ns.name, "link", "set", "net1", "mtu", "1300"]).status().unwrap();
    let (out, ok, _) = exec(&cni_env("CHECK", "c1", Some(&ns.path()), "net1"), &check);
    assert!(!ok);
    assert_eq!(out["code"], 106);
    assert_eq!(out["msg"], "net1: MTU is 1300, expected 1400");

    // DEL: back in the host with its name, MTU and up state; state and address released.
    let (out, ok, err) = exec(&cni_env("DEL", "c1", Some(&ns.path()), "net1"), &conf);
    assert!(ok, "DEL failed: {out} {err}");
    let after = link(vf, None).expect("the VF is back in the host");
    assert_eq!(after, before);
    assert!(link("net1", Some(&ns.name)).is_none());
    assert!(node.cached().is_empty());
    assert_eq!(node.record(0), None);
    assert!(node.held_ips("net-a").is_empty());

    // DEL again succeeds and changes nothing.
    let (out, ok, err) = exec(&cni_env("DEL", "c1", Some(&ns.path()), "net1"), &conf);
    assert!(ok, "second DEL failed: {out} {err}");
    assert_eq!(link(vf, None), Some(before));
}

#[test]
fn del_after_the_netns_is_gone_releases_everything() {
    if !can_host_local() {
        return;
    }
    let node = Node::new(1, "wcpf0");
    let ns = NetnsGuard::new();
    let conf = node.conf(V, "net-b", Some(0), "10.62.0.0/24", json!({}));
    let (out, ok, err) = exec(&cni_env("ADD", "c1", Some(&ns.path()), "net1"), &conf);
    assert!(ok, "ADD failed: {out} {err}");
    ns.delete();
    let (out, ok, err) = exec(&cni_env("DEL", "c1", Some(&ns.path()), "net1"), &conf);
    assert!(ok, "DEL failed: {out} {err}");
    assert!(node.cached().is_empty());
    assert_eq!(node.record(0), None);
    assert!(node.held_ips("net-b").is_empty());
    // Without CNI_NETNS at all, DEL of the now unknown attachment still succeeds.
    let (out, ok, err) = exec(&cni_env("DEL", "c1", None, "net1"), &conf);
    assert!(ok, "DEL without netns failed: {out} {err}");
}

#[test]
fn exhausted_host_local_range_passes_its_error_through_and_undoes_the_add() {
    if !can_host_local() {
        return;
    }
    // A /30 has one address to hand out (.1 is the gateway).
    let node = Node::new(2, "wcpf0");
    let (a, b) = (NetnsGuard::new(), NetnsGuard::new());
    let conf_a = node.conf(V, "net-c", Some(0), "10.63.0.0/30", json!({}));
    let conf_b = node.conf(V, "net-c", Some(1), "10.63.0.0/30", json!({"mtu": 1280}));
    let (out, ok, err) = exec(&cni_env("ADD", "ca", Some(&a.path()), "net1"), &conf_a);
    assert!(ok, "first ADD failed: {out} {err}");
    let vf_b = node.vfs[1].1.name.clone();
    let before = link(&vf_b, None).unwrap();

    let (out, ok, _) = exec(&cni_env("ADD", "cb", Some(&b.path()), "net1"), &conf_b);
    assert!(!ok);
    assert_eq!(out["code"], 999, "host-local's own code: {out}");
    assert!(out["msg"].as_str().unwrap().contains("no IP addresses available"), "{out}");
    assert!(out["details"].as_str().unwrap().contains("IPAM plugin host-local (ADD)"), "{out}");
    // Half-way work undone: the VF is back in the host as it was, nothing in the pod, no state.
    assert_eq!(link(&vf_b, None), Some(before));
    assert!(link("net1", Some(&b.name)).is_none());
    assert_eq!(node.cached(), ["ca-net1.json"]);
    assert_eq!(node.record(1), None);
    assert_eq!(node.held_ips("net-c"), ["10.63.0.2"]);
}

#[test]
fn a_pf_that_cannot_set_a_vlan_fails_the_add_cleanly() {
    if !can_host_local() {
        return;
    }
    // The PF is a real veth: the kernel knows it, but it has no VFs to configure.
    let pf = VethGuard::new("wcp");
    let node = Node::new(1, &pf.name);
    let ns = NetnsGuard::new();
    let vf = node.vfs[0].1.name.clone();
    let before = link(&vf, None).unwrap();
    let conf = node.conf(V, "net-d", Some(0), "10.64.0.0/24", json!({"vlan": 100}));
    let (out, ok, _) = exec(&cni_env("ADD", "c1", Some(&ns.path()), "net1"), &conf);
    assert!(!ok);
    assert_eq!(out["code"], 102, "{out}");
    let msg = out["msg"].as_str().unwrap();
    assert!(msg.contains(&format!("PF {} reports no VFs", pf.name)), "{msg}");
    assert_eq!(link(&vf, None), Some(before));
    assert!(link("net1", Some(&ns.name)).is_none());
    assert!(node.cached().is_empty());
    assert_eq!(node.record(0), None);
    assert!(node.held_ips("net-d").is_empty());
}

#[test]
fn two_adds_racing_for_one_vf_give_it_to_exactly_one() {
    if !can_host_local() {
        return;
    }
    let node = Node::new(1, "wcpf0");
    let (a, b) = (NetnsGuard::new(), NetnsGuard::new());
    let conf = node.conf(V, "net-e", Some(0), "10.65.0.0/24", json!({}));
    let spawn = |cid: &str, ns: &NetnsGuard| {
        let conf = conf.clone();
        let env = cni_env("ADD", cid, Some(&ns.path()), "net1");
        std::thread::spawn(move || exec(&env, &conf))
    };
    let (ra, rb) = (spawn("ca", &a), spawn("cb", &b));
    let (ra, rb) = (ra.join().unwrap(), rb.join().unwrap());
    assert!(ra.1 ^ rb.1, "exactly one ADD wins: {:?} / {:?}", ra.0, rb.0);
    let (winner, loser, loser_ns, winner_ns) = if ra.1 { ("ca", &rb.0, &b, &a) } else { ("cb", &ra.0, &a, &b) };
    assert_eq!(loser["code"], 101, "{loser}");
    assert!(loser["msg"].as_str().unwrap().contains(&format!("VF {} is allocated to", node.vfs[0].0)), "{loser}");
    assert!(link("net1", Some(&winner_ns.name)).is_some());
    assert!(link("net1", Some(&loser_ns.name)).is_none());
    assert_eq!(node.cached(), [format!("{winner}-net1.json")]);
    assert_eq!(node.held_ips("net-e").len(), 1);
    let (out, ok, err) = exec(&cni_env("DEL", winner, Some(&winner_ns.path()), "net1"), &conf);
    assert!(ok, "{out} {err}");
    assert!(link(&node.vfs[0].1.name, None).is_some());
}

#[test]
fn a_held_vf_lock_means_try_again_later() {
    if !can_host_local() {
        return;
    }
    let node = Node::new(1, "wcpf0");
    let ns = NetnsGuard::new();
    let conf = node.conf(V, "net-f", Some(0), "10.66.0.0/24", json!({"lockTimeoutMs": 20}));
    std::fs::create_dir_all(node.cache().join("pci")).unwrap();
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(node.cache().join("pci").join(format!("{}.lock", node.vfs[0].0)))
        .unwrap();
    lock.lock().unwrap();
    let (out, ok, _) = exec(&cni_env("ADD", "c1", Some(&ns.path()), "net1"), &conf);
    assert!(!ok);
    assert_eq!(out["code"], 11, "{out}");
    assert!(link(&node.vfs[0].1.name, None).is_some());
    drop(lock);
    let (out, ok, err) = exec(&cni_env("ADD", "c1", Some(&ns.path()), "net1"), &conf);
    assert!(ok, "{out} {err}");
    let (out, ok, err) = exec(&cni_env("DEL", "c1", Some(&ns.path()), "net1"), &conf);
    assert!(ok, "{out} {err}");
}

#[test]
fn an_interface_name_taken_in_the_pod_is_refused() {
    if !can_host_local() {
        return;
    }
    let node = Node::new(1, "wcpf0");
    let ns = NetnsGuard::new();
    let squatter = VethGuard::new("wcs");
    std::process::Command::new("ip")
        .args(["link", "set", &squatter.name, "netns", &ns.name, "name", "net1"])
        .status()
        .unwrap();
    let conf = node.conf(V, "net-g", Some(0), "10.67.0.0/24", json!({}));
    let (out, ok, _) = exec(&cni_env("ADD", "c1", Some(&ns.path()), "net1"), &conf);
    assert!(!ok);
    assert_eq!(out["code"], 103);
    assert_eq!(out["msg"], format!("interface net1 already exists in {}", ns.path()));
    assert!(link(&node.vfs[0].1.name, None).is_some());
    assert!(node.cached().is_empty());
}

#[test]
fn a_stale_record_of_a_gone_netns_does_not_block_the_vf() {
    if !can_host_local() {
        return;
    }
    let node = Node::new(1, "wcpf0");
    let ns = NetnsGuard::new();
    std::fs::create_dir_all(node.cache().join("pci")).unwrap();
    std::fs::write(node.cache().join("pci").join(&node.vfs[0].0), "/run/netns/weft-cni-long-gone").unwrap();
    let conf = node.conf(V, "net-h", Some(0), "10.68.0.0/24", json!({}));
    let (out, ok, err) = exec(&cni_env("ADD", "c1", Some(&ns.path()), "net1"), &conf);
    assert!(ok, "{out} {err}");
    assert_eq!(node.record(0).as_deref(), Some(ns.path().as_str()));
    let (out, ok, err) = exec(&cni_env("DEL", "c1", Some(&ns.path()), "net1"), &conf);
    assert!(ok, "{out} {err}");
}

#[test]
fn gc_releases_attachments_not_in_the_valid_list() {
    if !can_host_local() {
        return;
    }
    let node = Node::new(2, "wcpf0");
    let (a, b) = (NetnsGuard::new(), NetnsGuard::new());
    let conf_a = node.conf(V, "net-i", Some(0), "10.69.0.0/24", json!({}));
    let conf_b = node.conf(V, "net-i", Some(1), "10.69.0.0/24", json!({}));
    assert!(exec(&cni_env("ADD", "ca", Some(&a.path()), "net1"), &conf_a).1);
    assert!(exec(&cni_env("ADD", "cb", Some(&b.path()), "net1"), &conf_b).1);
    assert_eq!(node.held_ips("net-i").len(), 2);
    let mut gc = node.conf(V, "net-i", None, "10.69.0.0/24", json!({}));
    gc["cni.dev/valid-attachments"] = json!([{"containerID": "ca", "ifname": "net1"}]);
    let (out, ok, err) = exec(&[("CNI_COMMAND", "GC".into()), ("CNI_PATH", CNI_BIN_DIR.into())], &gc);
    assert!(ok, "GC failed: {out} {err}");
    assert_eq!(node.cached(), ["ca-net1.json"]);
    assert!(link("net1", Some(&b.name)).is_none());
    assert!(link(&node.vfs[1].1.name, None).is_some(), "cb's VF is back in the host");
    assert!(link("net1", Some(&a.name)).is_some(), "ca is valid and keeps its VF");
    assert_eq!(node.held_ips("net-i").len(), 1);
    // GC needs CNI 1.1.0.
    gc["cniVersion"] = json!("1.0.0");
    let (out, ok, _) = exec(&[("CNI_COMMAND", "GC".into()), ("CNI_PATH", CNI_BIN_DIR.into())], &gc);
    assert!(!ok);
    assert_eq!(out["code"], 1);
    assert!(exec(&cni_env("DEL", "ca", Some(&a.path()), "net1"), &conf_a).1);
}

#[test]
fn status_is_ready_only_with_a_writable_cache_and_an_ipam_plugin() {
    if !can_host_local() {
        return;
    }
    let node = Node::new(0, "wcpf0");
    let env = [("CNI_COMMAND", "STATUS".to_string()), ("CNI_PATH", CNI_BIN_DIR.to_string())];
    let conf = node.conf(V, "net-j", None, "10.70.0.0/24", json!({}));
    let (out, ok, err) = exec(&env, &conf);
    assert!(ok, "{out} {err}");
    let mut missing = conf.clone();
    missing["ipam"]["type"] = json!("no-such-ipam");
    let (out, ok, _) = exec(&env, &missing);
    assert!(!ok);
    assert_eq!(out["code"], 50);
    assert!(out["msg"].as_str().unwrap().contains("no-such-ipam"), "{out}");
    let file = node.dir.path().join("a-file");
    std::fs::write(&file, "x").unwrap();
    let mut unwritable = conf.clone();
    unwritable["cacheDir"] = json!(file.join("cache"));
    let (out, ok, _) = exec(&env, &unwritable);
    assert!(!ok);
    assert_eq!(out["code"], 50);
    assert!(out["msg"].as_str().unwrap().contains("is not writable"), "{out}");
}

/// One bad call: environment, configuration, expected code, a fragment of the message.
type BadCase = (Vec<(&'static str, String)>, Value, u64, &'static str);

#[test]
fn bad_environment_and_configuration_give_spec_error_json() {
    let conf = json!({"cniVersion": V, "name": "n", "type": "weft-cni", "deviceID": "0000:3b:00.2"});
    let add = |extra: &[(&'static str, &str)]| {
        let mut env = vec![
            ("CNI_COMMAND", "ADD".to_string()),
            ("CNI_CONTAINERID", "c1".to_string()),
            ("CNI_NETNS", "/run/netns/x".to_string()),
            ("CNI_IFNAME", "net1".to_string()),
        ];
        for (k, v) in extra {
            env.retain(|(e, _)| e != k);
            if !v.is_empty() {
                env.push((k, v.to_string()));
            }
        }
        env
    };
    let with = |k: &str, v: Value| {
        let mut c = conf.clone();
        c[k] = v;
        c
    };
    let cases: Vec<BadCase> = vec![
        (add(&[("CNI_NETNS", ""), ("CNI_IFNAME", "")]), conf.clone(), 4, "[CNI_NETNS,CNI_IFNAME]"),
        (add(&[("CNI_COMMAND", "")]), conf.clone(), 4, "CNI_COMMAND"),
        (add(&[("CNI_COMMAND", "PUT")]), conf.clone(), 4, "unknown CNI_COMMAND 'PUT'"),
        (add(&[("CNI_ARGS", "FOO=bar")]), conf.clone(), 4, "CNI_ARGS: unknown key 'FOO'"),
        (add(&[("CNI_IFNAME", "this-name-is-too-long")]), conf.clone(), 4, "CNI_IFNAME"),
        (add(&[]), json!("not an object"), 6, "not a JSON object"),
        (add(&[]), with("cniVersion", json!("0.2.0")), 1, "incompatible CNI versions"),
        (add(&[]), with("vlan", json!(4095)), 7, "vlan: 4095 is not a VLAN id"),
        (add(&[]), with("vlanProto", json!("802.1ad")), 7, "vlanProto: needs vlan"),
        (add(&[]), with("mac", json!("nope")), 7, "mac: 'nope' is not a MAC address"),
        (add(&[]), with("deviceID", json!("eth1")), 7, "deviceID: 'eth1' is not a PCI address"),
        (add(&[]), with("name", json!("bad name")), 7, "name:"),
        (add(&[]), with("prevResult", json!({"ips": [{"address": "10.0.0.1"}]})), 6, "prevResult: ips[0].address"),
        (add(&[]), conf.clone(), 4, "CNI_NETNS: network namespace /run/netns/x does not exist"),
    ];
    for (env, stdin, code, fragment) in cases {
        let (out, ok, _) = exec(&env, &stdin);
        assert!(!ok, "{env:?} {stdin} should fail");
        assert_eq!(out["code"], code, "{env:?} {stdin}: {out}");
        let text =
            format!("{} {}", out["msg"].as_str().unwrap_or_default(), out["details"].as_str().unwrap_or_default());
        assert!(text.contains(fragment), "{env:?} {stdin}: '{text}' lacks '{fragment}'");
        let keys: Vec<&String> = out.as_object().unwrap().keys().collect();
        assert!(keys.iter().all(|k| ["cniVersion", "code", "msg", "details"].contains(&k.as_str())), "{out}");
        assert!(out["cniVersion"].is_string(), "{out}");
    }
    // A plain file as CNI_NETNS is not a namespace.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("f");
    std::fs::write(&file, "").unwrap();
    let (out, ok, _) = exec(&add(&[("CNI_NETNS", file.to_str().unwrap())]), &conf);
    assert!(!ok);
    assert_eq!(out["code"], 4);
    assert!(out["msg"].as_str().unwrap().contains("is not a network namespace"), "{out}");
}

#[test]
fn version_lists_what_is_supported_for_the_asked_version() {
    for asked in ["0.3.1", "1.0.0", "1.1.0"] {
        let (out, ok, _) = exec(&[("CNI_COMMAND", "VERSION".into())], &json!({"cniVersion": asked}));
        assert!(ok);
        assert_eq!(
            out,
            json!({"cniVersion": asked, "supportedVersions": ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]})
        );
    }
}
