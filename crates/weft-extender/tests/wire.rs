//! The extender wire types: what kube-scheduler sends decodes, what we emit is what Go decodes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;

use serde_json::{Value, json};
use weft_extender::wire::{ExtenderArgs, ExtenderFilterResult, HostPriority, NodeList, WireNode};

#[test]
fn args_from_kube_scheduler_with_node_objects_decode() {
    let body = common::args_with_nodes(
        common::pending_pod_json("p", 2),
        vec![common::node_json("n1", None, 8), common::node_json("n2", None, 8)],
    );
    let args: ExtenderArgs = serde_json::from_str(&body.to_string()).unwrap();
    let pod = args.pod.as_ref().expect("pod");
    assert_eq!(pod.metadata.name.as_deref(), Some("p"));
    assert_eq!(pod.spec.as_ref().unwrap().containers[0].name, "trainer");
    let nodes = args.nodes.as_ref().expect("nodes");
    assert_eq!(nodes.items.iter().map(|n| n.name()).collect::<Vec<_>>(), ["n1", "n2"]);
    assert_eq!(args.node_names, None);
}

#[test]
fn args_with_node_names_and_null_nodes_decode() {
    let body = common::args_with_names(common::pending_pod_json("p", 1), &["a", "b"]);
    let args: ExtenderArgs = serde_json::from_str(&body.to_string()).unwrap();
    assert_eq!(args.nodes, None);
    assert_eq!(args.node_names, Some(vec!["a".to_string(), "b".to_string()]));
}

#[test]
fn lowercase_and_camelcase_keys_are_accepted() {
    for (pod_key, nodes_key, names_key) in [("pod", "nodes", "nodenames"), ("pod", "nodes", "nodeNames")] {
        let body = json!({ pod_key: common::pending_pod_json("p", 1), nodes_key: null, names_key: ["a"] });
        let args: ExtenderArgs = serde_json::from_str(&body.to_string()).unwrap();
        assert!(args.pod.is_some());
        assert_eq!(args.node_names, Some(vec!["a".to_string()]));
    }
    let result: ExtenderFilterResult = serde_json::from_str(
        r#"{"nodes":null,"nodenames":["a"],"failedNodes":{"b":"why"},"failedAndUnresolvableNodes":{"c":"no"},"error":""}"#,
    )
    .unwrap();
    assert_eq!(result.node_names, Some(vec!["a".to_string()]));
    assert_eq!(result.failed_nodes.get("b").map(String::as_str), Some("why"));
    assert_eq!(result.failed_and_unresolvable_nodes.get("c").map(String::as_str), Some("no"));
    let hp: Vec<HostPriority> = serde_json::from_str(r#"[{"host":"a","score":7}]"#).unwrap();
    assert_eq!(hp, vec![HostPriority { host: "a".into(), score: 7, reason: None }]);
}

#[test]
fn pod_without_type_meta_and_with_null_containers_decodes() {
    let body = json!({"Pod": {"metadata": {"name": "p", "namespace": "ml"}, "spec": {"containers": null}},
        "Nodes": null, "NodeNames": ["a"]});
    let args: ExtenderArgs = serde_json::from_str(&body.to_string()).unwrap();
    let pod = args.pod.unwrap();
    assert!(pod.spec.unwrap().containers.is_empty());
}

#[test]
fn nulls_go_writes_for_nil_maps_and_lists_read_as_empty() {
    let result: ExtenderFilterResult = serde_json::from_str(
        r#"{"Nodes":{"metadata":{},"items":null},"NodeNames":null,"FailedNodes":null,"FailedAndUnresolvableNodes":null,"Error":null}"#,
    )
    .unwrap();
    assert_eq!(result.nodes, Some(NodeList::default()));
    assert!(result.failed_nodes.is_empty() && result.error.is_empty());
}

#[test]
fn filter_result_emits_every_go_field_in_pascal_case() {
    let result = ExtenderFilterResult {
        node_names: Some(vec!["a".into()]),
        failed_nodes: BTreeMap::from([("b".into(), "1 of 8 GPUs free; pod requests 2".into())]),
        ..ExtenderFilterResult::default()
    };
    let v: Value = serde_json::to_value(&result).unwrap();
    assert_eq!(
        v,
        json!({"Nodes": null, "NodeNames": ["a"], "FailedNodes": {"b": "1 of 8 GPUs free; pod requests 2"},
            "FailedAndUnresolvableNodes": {}, "Error": ""})
    );
}

#[test]
fn host_priority_emits_pascal_case_and_reason_only_when_set() {
    let plain = serde_json::to_string(&HostPriority { host: "a".into(), score: 3, reason: None }).unwrap();
    assert_eq!(plain, r#"{"Host":"a","Score":3}"#);
    let with = serde_json::to_string(&HostPriority { host: "a".into(), score: 0, reason: Some("r".into()) }).unwrap();
    assert_eq!(with, r#"{"Host":"a","Score":0,"Reason":"r"}"#);
}

#[test]
fn every_wire_type_round_trips() {
    let args: ExtenderArgs = serde_json::from_str(
        &common::args_with_nodes(common::pending_pod_json("p", 4), vec![common::node_json("n1", None, 8)]).to_string(),
    )
    .unwrap();
    let again: ExtenderArgs = serde_json::from_str(&serde_json::to_string(&args).unwrap()).unwrap();
    assert_eq!(again, args);

    let names: ExtenderArgs =
        serde_json::from_str(&common::args_with_names(common::pending_pod_json("p", 1), &["x"]).to_string()).unwrap();
    assert_eq!(serde_json::from_str::<ExtenderArgs>(&serde_json::to_string(&names).unwrap()).unwrap(), names);

    let result = ExtenderFilterResult {
        nodes: args.nodes.clone(),
        node_names: Some(vec!["n1".into()]),
        failed_nodes: BTreeMap::from([("n2".into(), "busy".into())]),
        failed_and_unresolvable_nodes: BTreeMap::from([("n3".into(), "too small".into())]),
        error: "boom".into(),
    };
    let text = serde_json::to_string(&result).unwrap();
    assert_eq!(serde_json::from_str::<ExtenderFilterResult>(&text).unwrap(), result);

    let list = vec![
        HostPriority { host: "a".into(), score: 10, reason: None },
        HostPriority { host: "b".into(), score: 0, reason: Some("no topology".into()) },
    ];
    let text = serde_json::to_string(&list).unwrap();
    assert!(text.starts_with('['), "prioritize answers a JSON array: {text}");
    assert_eq!(serde_json::from_str::<Vec<HostPriority>>(&text).unwrap(), list);
}

#[test]
fn wire_node_echoes_fields_unknown_to_k8s_openapi() {
    let mut node = common::node_json("n1", None, 8);
    node["status"]["declaredFeaturesFromTheFuture"] = json!(["X"]);
    let text = node.to_string();
    let wn: WireNode = serde_json::from_str(&text).unwrap();
    assert_eq!(wn.name(), "n1");
    let back: Value = serde_json::from_str(&serde_json::to_string(&wn).unwrap()).unwrap();
    assert_eq!(back, node, "the node goes back exactly as it came");
    let typed = WireNode::from_node(wn.to_node().unwrap()).unwrap();
    assert_eq!(typed, wn);
}

#[test]
fn binding_args_and_result_as_go_writes_and_reads_them() {
    use weft_extender::wire::{ExtenderBindingArgs, ExtenderBindingResult};
    // encoding/json of k8s.io/kube-scheduler/extender/v1.ExtenderBindingArgs: no json tags, so the
    // Go field names; PodUID is a types.UID (a string).
    let go = r#"{"PodName":"trainer-0","PodNamespace":"ml","PodUID":"5e1f","Node":"gpu-7"}"#;
    let args: ExtenderBindingArgs = serde_json::from_str(go).unwrap();
    assert_eq!(
        args,
        ExtenderBindingArgs {
            pod_name: "trainer-0".into(),
            pod_namespace: "ml".into(),
            pod_uid: "5e1f".into(),
            node: "gpu-7".into()
        }
    );
    assert_eq!(serde_json::to_string(&args).unwrap(), go);
    // Go's decoder matches keys case-insensitively; so do we.
    let lower: ExtenderBindingArgs =
        serde_json::from_str(r#"{"podname":"trainer-0","podnamespace":"ml","poduid":"5e1f","node":"gpu-7"}"#).unwrap();
    assert_eq!(lower, args);
    assert_eq!(serde_json::to_string(&ExtenderBindingResult::default()).unwrap(), r#"{"Error":""}"#);
    let failed: ExtenderBindingResult = serde_json::from_str(r#"{"Error":"node full"}"#).unwrap();
    assert_eq!(failed.error, "node full");
}

#[test]
fn a_wire_node_reads_its_name_version_and_topology_annotation_and_nothing_else() {
    use weft_extender::cache::Annotation;
    let t = common::a100_nvswitch("n1");
    let text = weft_topology::inventory::to_json(&t);
    let wn: WireNode = serde_json::from_str(&common::node_json("n1", Some(&t), 8).to_string()).unwrap();
    let key = wn.key();
    assert_eq!((key.name, key.resource_version), ("n1", Some("1001")));
    let Some(Annotation::Json(literal)) = key.annotation else { panic!("the annotation is kept as JSON") };
    assert_eq!(serde_json::from_str::<String>(literal).unwrap(), text);
    let bare: WireNode = serde_json::from_str(&common::node_json("n2", None, 8).to_string()).unwrap();
    assert!(bare.key().annotation.is_none());
    let nameless: WireNode = serde_json::from_str(r#"{"spec":{}}"#).unwrap();
    assert_eq!((nameless.name(), nameless.key().resource_version), ("", None));
}
