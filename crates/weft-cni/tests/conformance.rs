//! Conformance with the CNI spec (SPEC.md of containernetworking/cni): its own example
//! configuration (section 1's `dbnet`, the bridge plugin's entry with host-local IPAM and DNS)
//! adapted to weft-cni, run for every supported version, and the results checked against the
//! spec's result schema for that version, written here from the spec's "ADD Success" section
//! (1.1.0), the 1.0.0 and the 0.4.0 spec texts. Then the appendix's chained example: the `tuning`
//! step's `prevResult` handed to weft-cni must come back with weft-cni's interface appended.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::IpAddr;

use common::*;
use ipnet::IpNet;
use serde_json::{Map, Value, json};

/// Checks `v` against the result schema of `version`; the error names the offending path.
fn check_result(v: &Value, version: &str) -> Result<(), String> {
    let v11 = version == "1.1.0";
    let v1 = version.starts_with('1');
    let obj = v.as_object().ok_or("the result is not an object")?;
    let allowed_top = ["cniVersion", "interfaces", "ips", "routes", "dns"];
    for k in obj.keys() {
        if !allowed_top.contains(&k.as_str()) {
            return Err(format!("unexpected top-level key {k}"));
        }
    }
    if obj.get("cniVersion").and_then(Value::as_str) != Some(version) {
        return Err(format!("cniVersion is {:?}, expected {version}", obj.get("cniVersion")));
    }
    let keys_in = |m: &Map<String, Value>, allowed: &[&str], at: &str| -> Result<(), String> {
        m.keys()
            .find(|k| !allowed.contains(&k.as_str()))
            .map_or(Ok(()), |k| Err(format!("{at}: key {k} is not in {version}")))
    };
    let string = |m: &Map<String, Value>, k: &str, at: &str, required: bool| -> Result<(), String> {
        match m.get(k) {
            None if !required => Ok(()),
            Some(Value::String(_)) => Ok(()),
            other => Err(format!("{at}.{k} must be a string, is {other:?}")),
        }
    };
    let uint = |m: &Map<String, Value>, k: &str, at: &str| -> Result<(), String> {
        match m.get(k) {
            None => Ok(()),
            Some(x) if x.as_u64().is_some() => Ok(()),
            other => Err(format!("{at}.{k} must be an unsigned integer, is {other:?}")),
        }
    };
    let list = |k: &str| -> Result<Vec<Value>, String> {
        match obj.get(k) {
            None => Ok(Vec::new()),
            Some(Value::Array(a)) => Ok(a.clone()),
            Some(x) => Err(format!("{k} must be a list, is {x}")),
        }
    };
    let interfaces = list("interfaces")?;
    for (i, iface) in interfaces.iter().enumerate() {
        let at = format!("interfaces[{i}]");
        let m = iface.as_object().ok_or(format!("{at} is not an object"))?;
        let allowed: &[&str] =
            if v11 { &["name", "mac", "mtu", "sandbox", "socketPath", "pciID"] } else { &["name", "mac", "sandbox"] };
        keys_in(m, allowed, &at)?;
        string(m, "name", &at, true)?;
        for k in ["mac", "sandbox", "socketPath", "pciID"] {
            string(m, k, &at, false)?;
        }
        uint(m, "mtu", &at)?;
    }
    for (i, ip) in list("ips")?.iter().enumerate() {
        let at = format!("ips[{i}]");
        let m = ip.as_object().ok_or(format!("{at} is not an object"))?;
        let allowed: &[&str] =
            if v1 { &["address", "gateway", "interface"] } else { &["version", "address", "gateway", "interface"] };
        keys_in(m, allowed, &at)?;
        let address: IpNet = m
            .get("address")
            .and_then(Value::as_str)
            .and_then(|a| a.parse().ok())
            .ok_or(format!("{at}.address must be an address in CIDR notation"))?;
        if let Some(g) = m.get("gateway") {
            g.as_str().and_then(|g| g.parse::<IpAddr>().ok()).ok_or(format!("{at}.gateway must be an IP address"))?;
        }
        if let Some(n) = m.get("interface") {
            let n = n.as_u64().ok_or(format!("{at}.interface must be an unsigned integer"))?;
            if n as usize >= interfaces.len() {
                return Err(format!("{at}.interface {n} is not an index into interfaces"));
            }
        }
        if !v1 {
            let family = if address.addr().is_ipv4() { "4" } else { "6" };
            if m.get("version").and_then(Value::as_str) != Some(family) {
                return Err(format!("{at}.version must be \"{family}\" in {version}"));
            }
        }
    }
    for (i, r) in list("routes")?.iter().enumerate() {
        let at = format!("routes[{i}]");
        let m = r.as_object().ok_or(format!("{at} is not an object"))?;
        let allowed: &[&str] =
            if v11 { &["dst", "gw", "mtu", "advmss", "priority", "table", "scope"] } else { &["dst", "gw"] };
        keys_in(m, allowed, &at)?;
        m.get("dst")
            .and_then(Value::as_str)
            .and_then(|d| d.parse::<IpNet>().ok())
            .ok_or(format!("{at}.dst must be a CIDR"))?;
        if let Some(g) = m.get("gw") {
            g.as_str().and_then(|g| g.parse::<IpAddr>().ok()).ok_or(format!("{at}.gw must be an IP address"))?;
        }
        for k in ["mtu", "advmss", "priority", "table", "scope"] {
            uint(m, k, &at)?;
        }
    }
    if let Some(dns) = obj.get("dns") {
        let m = dns.as_object().ok_or("dns must be an object")?;
        keys_in(m, &["nameservers", "domain", "search", "options"], "dns")?;
        string(m, "domain", "dns", false)?;
        for k in ["nameservers", "search", "options"] {
            if let Some(x) = m.get(k)
                && !x.as_array().is_some_and(|a| a.iter().all(Value::is_string))
            {
                return Err(format!("dns.{k} must be a list of strings"));
            }
        }
        for ns in m.get("nameservers").and_then(Value::as_array).into_iter().flatten() {
            ns.as_str().and_then(|s| s.parse::<IpAddr>().ok()).ok_or("dns.nameservers must be IP addresses")?;
        }
    }
    Ok(())
}

#[test]
fn the_schema_check_rejects_what_a_version_lacks() {
    let ok = json!({"cniVersion": "0.4.0", "interfaces": [{"name": "eth0"}], "ips": [{"version": "4", "address": "10.1.0.5/16", "interface": 0}], "dns": {}});
    assert_eq!(check_result(&ok, "0.4.0"), Ok(()));
    let no_version = json!({"cniVersion": "0.4.0", "ips": [{"address": "10.1.0.5/16"}]});
    assert!(check_result(&no_version, "0.4.0").unwrap_err().contains("ips[0].version"));
    let mtu_in_100 = json!({"cniVersion": "1.0.0", "interfaces": [{"name": "eth0", "mtu": 1500}]});
    assert!(check_result(&mtu_in_100, "1.0.0").unwrap_err().contains("key mtu"));
    let bad_index =
        json!({"cniVersion": "1.1.0", "interfaces": [], "ips": [{"address": "10.1.0.5/16", "interface": 3}]});
    assert!(check_result(&bad_index, "1.1.0").unwrap_err().contains("interface 3"));
}

/// SPEC.md §1's bridge entry of `dbnet`, as the runtime hands it to the plugin (the Add example
/// step 1), with weft-cni as the type and host-local's data under the test directory.
fn dbnet(node: &Node, version: &str) -> Value {
    json!({
        "cniVersion": version,
        "name": "dbnet",
        "type": "weft-cni",
        "bridge": "cni0",
        "keyA": ["some more", "plugin specific", "configuration"],
        "ipam": {
            "type": "host-local",
            "subnet": "10.1.0.0/16",
            "gateway": "10.1.0.1",
            "routes": [{"dst": "0.0.0.0/0"}],
            "dataDir": node.ipam_dir()
        },
        "dns": {"nameservers": ["10.1.0.1"]},
        "deviceID": node.vfs[0].0,
        "sysfsRoot": node.dir.path().join("sysfs"),
        "cacheDir": node.cache()
    })
}

#[test]
fn the_spec_example_conforms_at_every_supported_version() {
    if !can_host_local() {
        return;
    }
    for version in ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"] {
        let node = Node::new(1, "wcpf0");
        let ns = NetnsGuard::new();
        let conf = dbnet(&node, version);
        let (result, ok, err) = exec(&cni_env("ADD", "example", Some(&ns.path()), "eth0"), &conf);
        assert!(ok, "{version}: ADD failed: {result} {err}");
        check_result(&result, version).unwrap_or_else(|e| panic!("{version}: {e}: {result}"));
        assert_eq!(result["ips"][0]["address"], "10.1.0.2/16", "{version}");
        assert_eq!(result["ips"][0]["gateway"], "10.1.0.1", "{version}");
        assert_eq!(result["routes"], json!([{"dst": "0.0.0.0/0"}]), "{version}");
        assert_eq!(result["dns"], json!({"nameservers": ["10.1.0.1"]}), "{version}");
        assert_eq!(result["interfaces"][0]["sandbox"], ns.path().as_str(), "{version}");
        // The default route through the gateway is in the pod.
        let routes =
            std::process::Command::new("ip").args(["-n", &ns.name, "route", "show", "default"]).output().unwrap();
        assert!(String::from_utf8_lossy(&routes.stdout).contains("via 10.1.0.1 dev eth0"), "{version}");

        // The Check example: the same configuration with the ADD result as prevResult.
        if version != "0.3.0" && version != "0.3.1" {
            let mut check = conf.clone();
            check["prevResult"] = result.clone();
            let (out, ok, err) = exec(&cni_env("CHECK", "example", Some(&ns.path()), "eth0"), &check);
            assert!(ok, "{version}: CHECK failed: {out} {err}");
        } else {
            // CHECK came with 0.4.0.
            let (out, ok, _) = exec(&cni_env("CHECK", "example", Some(&ns.path()), "eth0"), &conf);
            assert!(!ok);
            assert_eq!(out["code"], 1, "{version}");
        }
        // The Delete example: the configuration with prevResult, twice.
        let mut del = conf.clone();
        del["prevResult"] = result.clone();
        for _ in 0..2 {
            let (out, ok, err) = exec(&cni_env("DEL", "example", Some(&ns.path()), "eth0"), &del);
            assert!(ok, "{version}: DEL failed: {out} {err}");
        }
        assert!(link(&node.vfs[0].1.name, None).is_some(), "{version}");
        assert!(node.held_ips("dbnet").is_empty(), "{version}");
    }
}

#[test]
fn a_prev_result_from_the_spec_passes_through_with_the_vf_appended() {
    if !can_host_local() {
        return;
    }
    let node = Node::new(1, "wcpf0");
    let ns = NetnsGuard::new();
    // The result the bridge plugin returns in the Add example (step 2's prevResult).
    let prev = json!({
        "cniVersion": "1.1.0",
        "ips": [{"address": "10.1.0.5/16", "gateway": "10.1.0.1", "interface": 2}],
        "routes": [{"dst": "0.0.0.0/0"}],
        "interfaces": [
            {"name": "cni0", "mac": "00:11:22:33:44:55"},
            {"name": "veth3243", "mac": "55:44:33:22:11:11"},
            {"name": "eth0", "mac": "99:88:77:66:55:44", "sandbox": "/var/run/netns/blue"}
        ],
        "dns": {"nameservers": ["10.1.0.1"]}
    });
    let mut conf = dbnet(&node, "1.1.0");
    conf["prevResult"] = prev.clone();
    conf["ipam"] = json!({"type": "host-local", "subnet": "10.2.0.0/16", "dataDir": node.ipam_dir()});
    conf.as_object_mut().unwrap().remove("dns");
    let (result, ok, err) = exec(&cni_env("ADD", "example", Some(&ns.path()), "net1"), &conf);
    assert!(ok, "ADD failed: {result} {err}");
    check_result(&result, "1.1.0").unwrap_or_else(|e| panic!("{e}: {result}"));
    let interfaces = result["interfaces"].as_array().unwrap();
    assert_eq!(interfaces[..3], prev["interfaces"].as_array().unwrap()[..]);
    assert_eq!(interfaces[3]["name"], "net1");
    assert_eq!(result["ips"][0], prev["ips"][0]);
    assert_eq!(result["ips"][1]["interface"], 3);
    assert_eq!(result["routes"], prev["routes"]);
    assert_eq!(result["dns"], prev["dns"]);
    let (out, ok, err) = exec(&cni_env("DEL", "example", Some(&ns.path()), "net1"), &conf);
    assert!(ok, "{out} {err}");
}

#[test]
fn status_and_gc_follow_the_spec_at_1_1_0() {
    if !can_host_local() {
        return;
    }
    let node = Node::new(1, "wcpf0");
    let conf = dbnet(&node, "1.1.0");
    // STATUS: ready, no output.
    let (out, ok, err) = exec(&[("CNI_COMMAND", "STATUS".into()), ("CNI_PATH", CNI_BIN_DIR.into())], &conf);
    assert!(ok, "{out} {err}");
    assert_eq!(out, Value::Null);
    // GC with nothing to collect: success, no output.
    let mut gc = conf.clone();
    gc["cni.dev/valid-attachments"] = json!([]);
    let (out, ok, err) = exec(&[("CNI_COMMAND", "GC".into()), ("CNI_PATH", CNI_BIN_DIR.into())], &gc);
    assert!(ok, "{out} {err}");
    assert_eq!(out, Value::Null);
    // Both need 1.1.0.
    let mut old = conf.clone();
    old["cniVersion"] = json!("1.0.0");
    let (out, ok, _) = exec(&[("CNI_COMMAND", "STATUS".into())], &old);
    assert!(!ok);
    assert_eq!(out["code"], 1);
}
