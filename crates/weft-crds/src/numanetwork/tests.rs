//! Tests of the NumaNetwork type, its `validate()`, and the generated CRD: the OpenAPI schema (with
//! the `jsonschema` crate), the CEL rules (evaluated client-side with kube's `cel` feature, which
//! implements Kubernetes' CEL libraries including `isCIDR`/`cidr`), and agreement between the two.

use super::*;
use kube::{CustomResourceExt, core::cel::Validator};
use serde_json::{Value, json};

fn spec(class: &str, range: &str, speed: Option<i32>, vlan: Option<i32>) -> NumaNetworkSpec {
    NumaNetworkSpec {
        ref_device_class: DeviceClassReference { name: class.to_string() },
        ref_resource_claim_dranet: DranetClaimParameters {
            ip_range: range.to_string(),
            ethernet_speed: speed,
            vlan_tag: vlan,
        },
    }
}

fn good() -> NumaNetworkSpec {
    spec("vf.nvidia.dra.net", "192.168.10.0/24", Some(100), Some(10))
}

fn with_range(range: &str) -> NumaNetworkSpec {
    spec("vf.nvidia.dra.net", range, None, None)
}

fn errors(s: &NumaNetworkSpec) -> Vec<String> {
    match s.validate() {
        Ok(()) => vec![],
        Err(e) => e.0.iter().map(ToString::to_string).collect(),
    }
}

fn one_error(s: &NumaNetworkSpec) -> String {
    let errs = errors(s);
    assert_eq!(errs.len(), 1, "{errs:?}");
    errs[0].clone()
}

// ---- validate(): CIDRs ----

#[test]
fn accepts_ipv4_and_ipv6_networks() {
    for range in [
        "192.168.10.0/24",
        "10.0.0.0/8",
        "10.1.2.3/32",
        "0.0.0.0/0",
        "fd00:10::/64",
        "FD00:10::/64",
        "2001:db8::1/128",
        "::/0",
        "::1.2.3.0/120",
    ] {
        assert_eq!(errors(&with_range(range)), Vec::<String>::new(), "{range}");
    }
}

#[test]
fn rejects_host_bits_and_names_the_network() {
    let e = one_error(&with_range("192.168.10.5/24"));
    assert_eq!(
        e,
        "spec.refResourceClaimDranet.ipRange: '192.168.10.5/24' has host bits set; the network is 192.168.10.0/24"
    );
    let e = one_error(&with_range("fd00:10::1/64"));
    assert!(e.ends_with("the network is fd00:10::/64"), "{e}");
    assert!(one_error(&with_range("10.0.0.1/0")).ends_with("the network is 0.0.0.0/0"));
}

#[test]
fn rejects_bad_prefixes() {
    for (range, why) in [
        ("10.0.0.0/33", "not a prefix length for IPv4 (0–32"),
        ("fd00::/129", "not a prefix length for IPv6 (0–128"),
        ("10.0.0.0/024", "no leading zeros"),
        ("10.0.0.0/+8", "not a prefix length"),
        ("10.0.0.0/", "not a prefix length"),
        ("10.0.0.0/8/8", "not a prefix length"),
        ("10.0.0.0/ 8", "not a prefix length"),
        ("10.0.0.0/1000", "not a prefix length"),
    ] {
        let e = one_error(&with_range(range));
        assert!(e.starts_with("spec.refResourceClaimDranet.ipRange: "), "{e}");
        assert!(e.contains(why), "{range}: {e}");
    }
}

#[test]
fn rejects_things_that_are_not_cidrs() {
    for (range, why) in [
        ("", "no /prefix"),
        ("10.0.0.0", "no /prefix"),
        ("10.0.0.256/24", "'10.0.0.256' is not an IPv4 or IPv6 address"),
        ("010.0.0.0/8", "is not an IPv4 or IPv6 address"),
        ("10.0.0/24", "is not an IPv4 or IPv6 address"),
        ("fe80::%eth0/64", "is not an IPv4 or IPv6 address"),
        ("fd00:::/64", "is not an IPv4 or IPv6 address"),
        ("net-a", "no /prefix"),
        ("::ffff:10.0.0.0/104", "IPv4-mapped"),
    ] {
        let e = one_error(&with_range(range));
        assert!(e.contains(why), "{range}: {e}");
        assert!(e.contains("e.g. 192.168.10.0/24 or fd00:10::/64"), "{e}");
    }
    let long = format!("{}/8", "1".repeat(70));
    assert!(one_error(&with_range(&long)).contains("at most 64"));
}

#[test]
fn cidr_masking() {
    let c = Cidr::parse("172.16.5.77/12").unwrap();
    assert_eq!(c.masked().to_string(), "172.16.0.0/12");
    assert!(!c.is_masked());
    assert!(Cidr::parse("172.16.0.0/12").unwrap().is_masked());
    assert_eq!(Cidr::parse("2001:db8:abcd:12::7/56").unwrap().masked().to_string(), "2001:db8:abcd::/56");
    assert!(Cidr::parse("255.255.255.255/32").unwrap().is_masked());
    assert_eq!(Cidr::parse("255.255.255.255/0").unwrap().masked().to_string(), "0.0.0.0/0");
}

// ---- validate(): VLAN, speed, device class, name ----

#[test]
fn vlan_bounds() {
    let with_vlan = |v| spec("vf.nvidia.dra.net", "10.0.0.0/8", None, Some(v));
    assert_eq!(
        one_error(&with_vlan(0)),
        "spec.refResourceClaimDranet.vlanTag: 0 is outside 1–4094; leave it out for an untagged network"
    );
    assert!(with_vlan(1).validate().is_ok());
    assert!(with_vlan(4094).validate().is_ok());
    assert!(one_error(&with_vlan(4095)).starts_with("spec.refResourceClaimDranet.vlanTag: 4095 is outside 1–4094"));
    assert!(one_error(&with_vlan(-1)).contains("-1 is outside"));
    assert!(spec("vf.nvidia.dra.net", "10.0.0.0/8", None, None).validate().is_ok());
}

#[test]
fn speed_must_be_positive() {
    let with_speed = |s| spec("vf.nvidia.dra.net", "10.0.0.0/8", Some(s), None);
    assert_eq!(
        one_error(&with_speed(0)),
        "spec.refResourceClaimDranet.ethernetSpeed: 0 is not a link speed: it must be at least 1 (Gb/s); leave it out if unknown"
    );
    assert!(one_error(&with_speed(-100)).contains("-100 is not a link speed"));
    assert!(with_speed(1).validate().is_ok());
    assert!(with_speed(400).validate().is_ok());
}

#[test]
fn device_class_is_a_dns_subdomain() {
    let with_class = |c: &str| spec(c, "10.0.0.0/8", None, None);
    assert_eq!(
        one_error(&with_class("")),
        "spec.refDeviceClass.name: must not be empty: name a DRA DeviceClass, e.g. vf.nvidia.dra.net"
    );
    for bad in ["Vf.nvidia.dra.net", "-vf", "vf-", "vf..net", ".vf", "vf.", "vf_net", "vf net", "vf.nvidia.dra.net/x"] {
        let e = one_error(&with_class(bad));
        assert!(e.starts_with("spec.refDeviceClass.name: '"), "{bad}: {e}");
        assert!(e.contains("is not a DNS subdomain"), "{bad}: {e}");
    }
    for ok in ["a", "0", "vf", "vf.nvidia.dra.net", "gpu-nic-1.example.com", "a-b.c-d"] {
        assert!(with_class(ok).validate().is_ok(), "{ok}");
    }
    let longest = format!("{}.{}", "a".repeat(126), "b".repeat(126));
    assert_eq!(longest.len(), 253);
    assert!(with_class(&longest).validate().is_ok());
    let too_long = format!("{longest}c");
    assert_eq!(one_error(&with_class(&too_long)), "spec.refDeviceClass.name: is 254 characters; at most 253");
}

#[test]
fn every_error_is_reported_at_once() {
    let s = spec("", "10.0.0.1/8", Some(0), Some(4095));
    let err = s.validate().unwrap_err();
    let paths: Vec<&str> = err.0.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "spec.refDeviceClass.name",
            "spec.refResourceClaimDranet.ipRange",
            "spec.refResourceClaimDranet.ethernetSpeed",
            "spec.refResourceClaimDranet.vlanTag"
        ]
    );
    assert!(err.to_string().contains("; spec.refResourceClaimDranet.vlanTag: 4095 is outside 1–4094"));
}

#[test]
fn name_leaves_room_for_the_rct_suffix() {
    let ok = NumaNetwork::new(&"n".repeat(249), good());
    assert!(ok.validate().is_ok());
    assert_eq!(ok.resource_claim_template_name().map(|n| n.len()), Some(253));
    let long = NumaNetwork::new(&"n".repeat(250), good());
    let err = long.validate().unwrap_err();
    assert_eq!(err.0.len(), 1);
    assert_eq!(err.0[0].path, "metadata.name");
    assert!(err.0[0].message.starts_with("is 250 characters; at most 249"));
}

#[test]
fn rct_name() {
    assert_eq!(resource_claim_template_name("pipeline1-multi-network"), "pipeline1-multi-network-rct");
    let n = NumaNetwork::new("net-a", good());
    assert_eq!(n.resource_claim_template_name().as_deref(), Some("net-a-rct"));
    assert!(n.ready_condition().is_none());
}

#[test]
fn update_rules() {
    let old = good();
    // ethernetSpeed may change.
    let mut s = old.clone();
    s.ref_resource_claim_dranet.ethernet_speed = Some(200);
    assert!(s.validate_update(&old).is_ok());
    s.ref_resource_claim_dranet.ethernet_speed = None;
    assert!(s.validate_update(&old).is_ok());

    let mut s = old.clone();
    s.ref_resource_claim_dranet.ip_range = "192.168.11.0/24".into();
    let e = s.validate_update(&old).unwrap_err();
    assert_eq!(e.0.len(), 1);
    assert_eq!(e.0[0].path, "spec.refResourceClaimDranet.ipRange");
    assert!(e.0[0].message.starts_with("is immutable (was '192.168.10.0/24', now '192.168.11.0/24')"));

    let mut s = old.clone();
    s.ref_resource_claim_dranet.vlan_tag = Some(11);
    let e = s.validate_update(&old).unwrap_err();
    assert!(e.0[0].message.starts_with("is immutable (was 10, now 11)"), "{e}");
    s.ref_resource_claim_dranet.vlan_tag = None;
    let e = s.validate_update(&old).unwrap_err();
    assert!(e.0[0].message.starts_with("cannot be added or removed after creation (was 10, now untagged)"), "{e}");

    let mut s = old.clone();
    s.ref_device_class.name = "other.dra.net".into();
    let e = s.validate_update(&old).unwrap_err();
    assert_eq!(e.0[0].path, "spec.refDeviceClass.name");

    // The object-level check runs both.
    let old_obj = NumaNetwork::new("net", old);
    let mut new_obj = old_obj.clone();
    new_obj.spec.ref_resource_claim_dranet.vlan_tag = Some(0);
    let e = new_obj.validate_update(&old_obj).unwrap_err();
    assert_eq!(e.0.len(), 2, "{e}");
}

// ---- the generated CRD ----

fn crd_json() -> Value {
    serde_json::to_value(NumaNetwork::crd()).unwrap()
}

fn schema() -> Value {
    crd_json()["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone()
}

fn rules_at(schema: &Value, pointer: &str) -> Vec<String> {
    schema
        .pointer(pointer)
        .unwrap_or_else(|| panic!("no schema at {pointer}"))
        .get("x-kubernetes-validations")
        .and_then(Value::as_array)
        .map(|rules| rules.iter().map(|r| r["rule"].as_str().unwrap().to_string()).collect())
        .unwrap_or_default()
}

const SPEC: &str = "/properties/spec/properties";
const DRANET: &str = "/properties/spec/properties/refResourceClaimDranet";

#[test]
fn crd_identity_scope_and_names() {
    let crd = crd_json();
    assert_eq!(crd["metadata"]["name"], CRD_NAME);
    assert_eq!(crd["spec"]["group"], GROUP);
    assert_eq!(crd["spec"]["scope"], "Cluster");
    assert_eq!(crd["spec"]["names"]["kind"], KIND);
    assert_eq!(crd["spec"]["names"]["plural"], "numanetworks");
    assert_eq!(crd["spec"]["names"]["singular"], "numanetwork");
    assert_eq!(crd["spec"]["names"]["shortNames"], json!(["nnet", "nn"]));
    assert_eq!(crd["spec"]["names"]["categories"], json!(["weft"]));
    let v = &crd["spec"]["versions"][0];
    assert_eq!(v["name"], VERSION);
    assert_eq!(v["served"], true);
    assert_eq!(v["storage"], true);
    assert_eq!(v["subresources"]["status"], json!({}));
}

#[test]
fn printer_columns() {
    let crd = crd_json();
    let cols: Vec<(String, String, String)> = crd["spec"]["versions"][0]["additionalPrinterColumns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap().into(),
                c["type"].as_str().unwrap().into(),
                c["jsonPath"].as_str().unwrap().into(),
            )
        })
        .collect();
    let expect = [
        ("DeviceClass", "string", ".spec.refDeviceClass.name"),
        ("IPRange", "string", ".spec.refResourceClaimDranet.ipRange"),
        ("VLAN", "integer", ".spec.refResourceClaimDranet.vlanTag"),
        ("Speed", "integer", ".spec.refResourceClaimDranet.ethernetSpeed"),
        ("Addresses", "string", ".status.addresses.usage"),
        ("Ready", "string", ".status.conditions[?(@.type==\"Ready\")].status"),
        ("Age", "date", ".metadata.creationTimestamp"),
    ];
    let expect: Vec<(String, String, String)> =
        expect.iter().map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string())).collect();
    assert_eq!(cols, expect);
}

#[test]
fn schema_constraints_are_present() {
    let s = schema();
    assert_eq!(s["required"], json!(["spec"]));
    assert_eq!(s["properties"]["spec"]["required"], json!(["refDeviceClass", "refResourceClaimDranet"]));
    let name = s.pointer(&format!("{SPEC}/refDeviceClass/properties/name")).unwrap();
    assert_eq!(name["minLength"], 1);
    assert_eq!(name["maxLength"], 253);
    let num = |v: &Value| v.as_f64().unwrap();
    assert_eq!(name["pattern"], DNS_SUBDOMAIN_PATTERN);
    let dranet = s.pointer(DRANET).unwrap();
    assert_eq!(dranet["required"], json!(["ipRange"]));
    let p = &dranet["properties"];
    assert_eq!(p["ipRange"]["pattern"], CIDR_PATTERN);
    assert_eq!(p["ipRange"]["maxLength"], 64);
    assert_eq!(p["vlanTag"]["type"], "integer");
    assert_eq!(p["vlanTag"]["format"], "int32");
    assert_eq!(num(&p["vlanTag"]["minimum"]), 1.0);
    assert_eq!(num(&p["vlanTag"]["maximum"]), 4094.0);
    assert_eq!(p["ethernetSpeed"]["format"], "int32");
    assert_eq!(num(&p["ethernetSpeed"]["minimum"]), 1.0);
    // Optional spec fields are absent rather than null, so `has()` in the CEL rules is exact.
    assert!(p["vlanTag"].get("nullable").is_none());
    assert!(p["ethernetSpeed"].get("nullable").is_none());
    let conditions = &s["properties"]["status"]["properties"]["conditions"];
    assert_eq!(conditions["x-kubernetes-list-type"], "map");
    assert_eq!(conditions["x-kubernetes-list-map-keys"], json!(["type"]));
    assert_eq!(conditions["items"]["required"], json!(["lastTransitionTime", "message", "reason", "status", "type"]));
}

#[test]
fn cel_rules_are_present() {
    let s = schema();
    assert_eq!(rules_at(&s, ""), [NAME_LENGTH_RULE]);
    assert_eq!(rules_at(&s, &format!("{SPEC}/refDeviceClass/properties/name")), [IMMUTABLE_RULE]);
    assert_eq!(rules_at(&s, DRANET), [VLAN_PRESENCE_RULE]);
    assert_eq!(
        rules_at(&s, &format!("{DRANET}/properties/ipRange")),
        [IP_RANGE_IS_CIDR_RULE, IP_RANGE_MASKED_RULE, IMMUTABLE_RULE]
    );
    assert_eq!(rules_at(&s, &format!("{DRANET}/properties/vlanTag")), [IMMUTABLE_RULE]);
    assert!(rules_at(&s, &format!("{DRANET}/properties/ethernetSpeed")).is_empty());
    // Seven rules in all, each with a message so the API server's error says what to do.
    let mut all = Vec::new();
    collect_rules(&s, &mut all);
    assert_eq!(all.len(), 7, "{all:?}");
    for r in &all {
        assert!(r["message"].as_str().is_some_and(|m| !m.is_empty()), "{r}");
    }
    assert_eq!(NAME_LENGTH_RULE, format!("self.metadata.name.size() <= {MAX_NAME_LEN}"));
}

fn collect_rules(v: &Value, out: &mut Vec<Value>) {
    match v {
        Value::Object(map) => {
            for (k, child) in map {
                if k == "x-kubernetes-validations" {
                    out.extend(child.as_array().into_iter().flatten().cloned());
                } else {
                    collect_rules(child, out);
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|i| collect_rules(i, out)),
        _ => {}
    }
}

#[test]
fn cel_rules_compile() {
    let compiled = kube::core::cel::compile_schema(&schema());
    assert!(!compiled.has_errors(), "{:?}", compiled.compilation_errors());
}

// ---- schema vs validate() on the same objects ----

fn object(spec: Value) -> Value {
    json!({
        "apiVersion": "numaflow.numaproj.io/v1alpha1",
        "kind": "NumaNetwork",
        "metadata": {"name": "net-a"},
        "spec": spec,
    })
}

fn good_spec() -> Value {
    json!({
        "refDeviceClass": {"name": "vf.nvidia.dra.net"},
        "refResourceClaimDranet": {"ipRange": "192.168.10.0/24", "ethernetSpeed": 100, "vlanTag": 10}
    })
}

fn patched(pointer: &str, value: Option<Value>) -> Value {
    let mut s = good_spec();
    let (parent, key) = pointer.rsplit_once('/').unwrap();
    let map = s.pointer_mut(parent).unwrap().as_object_mut().unwrap();
    match value {
        Some(v) => map.insert(key.to_string(), v),
        None => map.remove(key),
    };
    object(s)
}

/// Errors from the OpenAPI schema (types, required, pattern, bounds), as the API server checks
/// them before CEL.
fn openapi_errors(obj: &Value) -> Vec<String> {
    let validator = jsonschema::validator_for(&schema()).unwrap();
    validator.iter_errors(obj).map(|e| format!("{}: {e}", e.instance_path())).collect()
}

fn cel_errors(obj: &Value, old: Option<&Value>) -> Vec<String> {
    match Validator::new().validate(&schema(), obj, old) {
        Ok(()) => vec![],
        Err(errs) => errs.into_vec().iter().map(ToString::to_string).collect(),
    }
}

/// What the API server would say: the schema first, then CEL (which it skips on schema errors).
fn server_errors(obj: &Value) -> Vec<String> {
    let e = openapi_errors(obj);
    if e.is_empty() { cel_errors(obj, None) } else { e }
}

fn rust_errors(obj: &Value) -> Vec<String> {
    match serde_json::from_value::<NumaNetwork>(obj.clone()) {
        Err(e) => vec![format!("does not deserialize: {e}")],
        Ok(n) => n.validate().err().map(|e| e.0.iter().map(ToString::to_string).collect()).unwrap_or_default(),
    }
}

fn cases() -> Vec<(&'static str, Value, bool)> {
    let range = "/refResourceClaimDranet/ipRange";
    let vlan = "/refResourceClaimDranet/vlanTag";
    let speed = "/refResourceClaimDranet/ethernetSpeed";
    let class = "/refDeviceClass/name";
    vec![
        ("good", object(good_spec()), true),
        ("ipv6", patched(range, Some(json!("fd00:10::/64"))), true),
        ("ipv6 upper case", patched(range, Some(json!("FD00:10::/64"))), true),
        ("ipv4 /32", patched(range, Some(json!("10.1.2.3/32"))), true),
        ("default route", patched(range, Some(json!("0.0.0.0/0"))), true),
        ("ipv6 /128", patched(range, Some(json!("2001:db8::1/128"))), true),
        ("ipv6 embedded ipv4", patched(range, Some(json!("::1.2.3.0/120"))), true),
        ("host bits v4", patched(range, Some(json!("192.168.10.5/24"))), false),
        ("host bits v6", patched(range, Some(json!("fd00:10::1/64"))), false),
        ("prefix 33", patched(range, Some(json!("10.0.0.0/33"))), false),
        ("prefix 129", patched(range, Some(json!("fd00::/129"))), false),
        ("prefix leading zero", patched(range, Some(json!("10.0.0.0/08"))), false),
        ("no prefix", patched(range, Some(json!("10.0.0.0"))), false),
        ("octet 256", patched(range, Some(json!("10.0.0.256/24"))), false),
        ("octet leading zero", patched(range, Some(json!("10.0.0.010/32"))), false),
        ("three octets", patched(range, Some(json!("10.0.0/24"))), false),
        ("zone", patched(range, Some(json!("fe80::%eth0/64"))), false),
        ("bad ipv6", patched(range, Some(json!("fd00:::/64"))), false),
        ("ipv6 nine groups", patched(range, Some(json!("1:2:3:4:5:6:7:8:9/64"))), false),
        ("ipv6 group too long", patched(range, Some(json!("fd000:1::/64"))), false),
        ("ipv4-mapped", patched(range, Some(json!("::ffff:10.0.0.0/104"))), false),
        ("empty range", patched(range, Some(json!(""))), false),
        ("words", patched(range, Some(json!("my-network"))), false),
        ("range is a number", patched(range, Some(json!(10))), false),
        ("no range", patched(range, None), false),
        ("vlan 0", patched(vlan, Some(json!(0))), false),
        ("vlan 1", patched(vlan, Some(json!(1))), true),
        ("vlan 4094", patched(vlan, Some(json!(4094))), true),
        ("vlan 4095", patched(vlan, Some(json!(4095))), false),
        ("vlan as string", patched(vlan, Some(json!("10"))), false),
        ("no vlan", patched(vlan, None), true),
        ("speed 0", patched(speed, Some(json!(0))), false),
        ("speed 1", patched(speed, Some(json!(1))), true),
        ("speed negative", patched(speed, Some(json!(-25))), false),
        ("no speed", patched(speed, None), true),
        ("empty class", patched(class, Some(json!(""))), false),
        ("upper-case class", patched(class, Some(json!("VF.nvidia"))), false),
        ("class with underscore", patched(class, Some(json!("vf_nvidia"))), false),
        ("class 254 chars", patched(class, Some(json!(format!("{}.{}", "a".repeat(126), "b".repeat(127))))), false),
        ("no class", patched(class, None), false),
        ("no refDeviceClass", patched("/refDeviceClass", None), false),
        ("no refResourceClaimDranet", patched("/refResourceClaimDranet", None), false),
        (
            "no spec",
            json!({"apiVersion": "numaflow.numaproj.io/v1alpha1", "kind": "NumaNetwork", "metadata": {"name": "x"}}),
            false,
        ),
        (
            "name 250 chars",
            {
                let mut o = object(good_spec());
                o["metadata"]["name"] = json!("n".repeat(250));
                o
            },
            false,
        ),
    ]
}

#[test]
fn schema_and_validate_agree() {
    for (what, obj, valid) in cases() {
        let server = server_errors(&obj);
        let rust = rust_errors(&obj);
        assert_eq!(server.is_empty(), valid, "{what}: API server (schema + CEL) says {server:?}");
        assert_eq!(rust.is_empty(), valid, "{what}: validate() says {rust:?}");
    }
}

#[test]
fn openapi_schema_alone_catches_gross_errors() {
    // What a validator without CEL (kubeconform, an editor) still catches through the patterns.
    for (what, obj, must_fail) in [
        ("words", patched("/refResourceClaimDranet/ipRange", Some(json!("my-network"))), true),
        ("no prefix", patched("/refResourceClaimDranet/ipRange", Some(json!("10.0.0.0"))), true),
        ("prefix 33", patched("/refResourceClaimDranet/ipRange", Some(json!("10.0.0.0/33"))), true),
        ("prefix 08", patched("/refResourceClaimDranet/ipRange", Some(json!("10.0.0.0/08"))), true),
        ("vlan 4095", patched("/refResourceClaimDranet/vlanTag", Some(json!(4095))), true),
        ("upper-case class", patched("/refDeviceClass/name", Some(json!("VF"))), true),
        ("octet 256", patched("/refResourceClaimDranet/ipRange", Some(json!("10.0.0.256/24"))), true),
        ("octet leading zero", patched("/refResourceClaimDranet/ipRange", Some(json!("10.0.0.010/32"))), true),
        // Only CEL knows these:
        ("host bits", patched("/refResourceClaimDranet/ipRange", Some(json!("10.0.0.1/8"))), false),
        ("bad ipv6", patched("/refResourceClaimDranet/ipRange", Some(json!("fd00:::/64"))), false),
        ("ipv4-mapped", patched("/refResourceClaimDranet/ipRange", Some(json!("::ffff:10.0.0.0/104"))), false),
    ] {
        assert_eq!(!openapi_errors(&obj).is_empty(), must_fail, "{what}");
    }
}

#[test]
fn cel_messages_name_the_field() {
    let obj = patched("/refResourceClaimDranet/ipRange", Some(json!("192.168.10.5/24")));
    assert!(openapi_errors(&obj).is_empty());
    let e = cel_errors(&obj, None);
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(e[0].contains("spec.refResourceClaimDranet.ipRange"), "{e:?}");
    assert!(e[0].contains("host bits zero"), "{e:?}");
    let obj = patched("/refResourceClaimDranet/ipRange", Some(json!("fd00:::/64")));
    assert!(openapi_errors(&obj).is_empty());
    let e = cel_errors(&obj, None);
    assert!(e.iter().any(|m| m.contains("ipRange must be a CIDR")), "{e:?}");
}

#[test]
fn cel_transition_rules_match_validate_update() {
    let old = object(good_spec());
    let edits: Vec<(&str, &str, Option<Value>, bool)> = vec![
        ("same", "/refResourceClaimDranet/ethernetSpeed", Some(json!(100)), true),
        ("speed changes", "/refResourceClaimDranet/ethernetSpeed", Some(json!(400)), true),
        ("speed removed", "/refResourceClaimDranet/ethernetSpeed", None, true),
        ("range changes", "/refResourceClaimDranet/ipRange", Some(json!("192.168.11.0/24")), false),
        ("vlan changes", "/refResourceClaimDranet/vlanTag", Some(json!(11)), false),
        ("vlan removed", "/refResourceClaimDranet/vlanTag", None, false),
        ("class changes", "/refDeviceClass/name", Some(json!("other.dra.net")), false),
    ];
    for (what, pointer, value, allowed) in edits {
        let new = patched(pointer, value);
        let cel = cel_errors(&new, Some(&old));
        assert_eq!(cel.is_empty(), allowed, "{what}: CEL says {cel:?}");
        let (n, o): (NumaNetwork, NumaNetwork) =
            (serde_json::from_value(new).unwrap(), serde_json::from_value(old.clone()).unwrap());
        assert_eq!(n.validate_update(&o).is_ok(), allowed, "{what}: validate_update");
    }
    // Adding a VLAN to an untagged network is refused too.
    let untagged = patched("/refResourceClaimDranet/vlanTag", None);
    let tagged = object(good_spec());
    assert!(!cel_errors(&tagged, Some(&untagged)).is_empty());
    let (n, o): (NumaNetwork, NumaNetwork) =
        (serde_json::from_value(tagged).unwrap(), serde_json::from_value(untagged).unwrap());
    assert!(n.validate_update(&o).is_err());
}

#[test]
fn round_trips_with_status() {
    let mut n = NumaNetwork::new("net-a", good());
    n.status = Some(NumaNetworkStatus {
        observed_generation: Some(3),
        resource_claim_template: Some("net-a-rct".into()),
        namespaces: vec!["video".into()],
        addresses: Some(AddressUsage { allocated: 3, size: 254, usage: "3/254".into() }),
        conditions: vec![Condition {
            type_: READY_CONDITION.into(),
            status: "True".into(),
            reason: "TemplatesCreated".into(),
            message: String::new(),
            last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                "2026-01-02T03:04:05Z".parse().unwrap(),
            ),
            observed_generation: Some(3),
        }],
    });
    let v = serde_json::to_value(&n).unwrap();
    assert_eq!(v["status"]["resourceClaimTemplate"], "net-a-rct");
    assert_eq!(v["status"]["conditions"][0]["lastTransitionTime"], "2026-01-02T03:04:05Z");
    assert!(openapi_errors(&v).is_empty(), "{:?}", openapi_errors(&v));
    let back: NumaNetwork = serde_json::from_value(v).unwrap();
    assert_eq!(back, n);
    assert_eq!(back.ready_condition().map(|c| c.status.as_str()), Some("True"));
    // Optional fields that are unset are left out, not written as null.
    let bare = serde_json::to_value(NumaNetwork::new("x", with_range("10.0.0.0/8"))).unwrap();
    assert_eq!(bare["spec"]["refResourceClaimDranet"], json!({"ipRange": "10.0.0.0/8"}));
}

// ---- the example manifest ----

#[test]
fn example_manifest_is_valid() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/examples/numanetwork.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    let n: NumaNetwork = serde_saphyr::from_str(&text).unwrap();
    assert_eq!(n.metadata.name.as_deref(), Some("pipeline1-multi-network"));
    assert!(n.metadata.namespace.is_none(), "NumaNetwork is cluster-scoped");
    assert_eq!(n.spec, good());
    n.validate().unwrap();
    let v: Value = serde_saphyr::from_str(&text).unwrap();
    assert_eq!(v["apiVersion"], "numaflow.numaproj.io/v1alpha1");
    assert_eq!(v["kind"], "NumaNetwork");
    assert_eq!(server_errors(&v), Vec::<String>::new());
    assert_eq!(n.resource_claim_template_name().as_deref(), Some("pipeline1-multi-network-rct"));
}

#[test]
fn the_seed_spelling_is_not_accepted() {
    // The seed's `refResouceClaimDranet` is a typo: the required field is then missing.
    let obj = object(json!({
        "refDeviceClass": {"name": "vf.nvidia.dra.net"},
        "refResouceClaimDranet": {"ipRange": "192.168.10.0/24"}
    }));
    assert!(!openapi_errors(&obj).is_empty());
    assert!(!rust_errors(&obj).is_empty());
}
