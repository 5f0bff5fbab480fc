//! A pod's request of a resource, as the kubelet counts it, over `v1.Pod` objects.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use k8s_openapi::api::core::v1::Pod;
use proptest::prelude::*;
use serde_json::json;
use weft_resources::{RequestError, Stage, pod_need, pod_request};

const GPU: &str = "nvidia.com/gpu";

fn pod(spec: serde_json::Value) -> Pod {
    serde_json::from_value(json!({"metadata": {"name": "p", "namespace": "ml"}, "spec": spec})).unwrap()
}

fn gpu(n: &str) -> serde_json::Value {
    json!({"limits": {GPU: n}, "requests": {GPU: n}})
}

#[test]
fn app_containers_are_summed() {
    let p = pod(json!({"containers": [{"name": "a", "resources": gpu("2")}, {"name": "b", "resources": gpu("1")}]}));
    assert_eq!(pod_request(&p, GPU), Ok(3));
}

#[test]
fn limit_alone_counts_and_larger_of_request_and_limit_wins() {
    let p = pod(json!({"containers": [
        {"name": "a", "resources": {"limits": {GPU: "2"}}},
        {"name": "b", "resources": {"requests": {GPU: "1"}, "limits": {GPU: "3"}}}
    ]}));
    assert_eq!(pod_request(&p, GPU), Ok(5));
}

#[test]
fn init_containers_count_by_their_maximum_against_the_app_sum() {
    let p = pod(json!({
        "initContainers": [{"name": "i1", "resources": gpu("4")}, {"name": "i2", "resources": gpu("1")}],
        "containers": [{"name": "a", "resources": gpu("1")}, {"name": "b", "resources": gpu("1")}]
    }));
    assert_eq!(pod_request(&p, GPU), Ok(4), "max(init 4, app 2)");
    let p = pod(json!({
        "initContainers": [{"name": "i1", "resources": gpu("1")}],
        "containers": [{"name": "a", "resources": gpu("2")}, {"name": "b", "resources": gpu("1")}]
    }));
    assert_eq!(pod_request(&p, GPU), Ok(3), "max(init 1, app 3)");
}

#[test]
fn sidecar_init_containers_add_to_the_app_sum_and_to_later_inits() {
    let p = pod(json!({
        "initContainers": [
            {"name": "sidecar", "restartPolicy": "Always", "resources": gpu("1")},
            {"name": "warmup", "resources": gpu("3")}
        ],
        "containers": [{"name": "a", "resources": gpu("2")}]
    }));
    // During warmup the sidecar runs too: 1 + 3 = 4; afterwards app 2 + sidecar 1 = 3.
    assert_eq!(pod_request(&p, GPU), Ok(4));
}

#[test]
fn other_resources_and_missing_resources_count_zero() {
    let p = pod(json!({"containers": [{"name": "a"}, {"name": "b", "resources": {"limits": {"cpu": "2"}}}]}));
    assert_eq!(pod_request(&p, GPU), Ok(0));
    let p: Pod = serde_json::from_value(json!({"metadata": {"name": "p"}})).unwrap();
    assert_eq!(pod_request(&p, GPU), Ok(0));
    let p = pod(json!({"containers": [{"name": "a", "resources": {"limits": {"amd.com/gpu": "2"}}}]}));
    assert_eq!(pod_request(&p, "amd.com/gpu"), Ok(2), "resource name is configurable");
}

#[test]
fn quantities_in_any_notation_that_is_a_whole_count_are_read() {
    let p = pod(json!({"containers": [
        {"name": "a", "resources": {"limits": {GPU: "2000m"}}},
        {"name": "b", "resources": {"limits": {GPU: "1e0"}}}
    ]}));
    assert_eq!(pod_request(&p, GPU), Ok(3));
}

#[test]
fn fractional_negative_or_huge_quantities_are_errors_naming_the_container() {
    let p = pod(json!({"containers": [{"name": "half", "resources": {"limits": {GPU: "500m"}}}]}));
    let e = pod_request(&p, GPU).expect_err("fractional");
    assert!(matches!(&e, RequestError::NotWhole { container, .. } if container == "half"), "{e}");
    assert!(e.to_string().contains("500m"), "{e}");
    let p = pod(json!({"containers": [{"name": "neg", "resources": {"limits": {GPU: "-1"}}}]}));
    assert!(matches!(pod_request(&p, GPU), Err(RequestError::NotWhole { .. })));
    let p = pod(json!({"initContainers": [{"name": "big", "resources": {"limits": {GPU: "1e30"}}}], "containers": []}));
    assert!(matches!(pod_request(&p, GPU), Err(RequestError::TooLarge { container, .. }) if container == "big"));
}

/// The need read off the pod's life as a timeline: each init container alone (with the sidecars
/// started before it), then every app container with every sidecar.
fn timeline_peak(init: &[(bool, u64)], app: &[u64]) -> u64 {
    let mut peak = 0;
    let mut running_sidecars = 0;
    for &(sidecar, n) in init {
        if sidecar {
            running_sidecars += n;
            peak = peak.max(running_sidecars);
        } else {
            peak = peak.max(running_sidecars + n);
        }
    }
    peak.max(running_sidecars + app.iter().sum::<u64>())
}

proptest! {
    #[test]
    fn pod_need_is_the_peak_of_the_pod_timeline(
        init in prop::collection::vec((any::<bool>(), 0u64..16), 0..6),
        app in prop::collection::vec(0u64..16, 0..6),
    ) {
        let stages = init
            .iter()
            .map(|&(sidecar, n)| (if sidecar { Stage::Sidecar } else { Stage::Init }, n))
            .chain(app.iter().map(|&n| (Stage::App, n)));
        prop_assert_eq!(pod_need(stages), timeline_peak(&init, &app));
    }
}
