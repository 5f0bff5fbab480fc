//! The GPUs pods hold on a node (a pod's request itself is weft-resources' `pod_request`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use weft_testkit as common;

use k8s_openapi::api::core::v1::Pod;
use weft_alloc::{Policy, PreparedNode, Request, allocate};
use weft_record::usage::{GpuSource, UsageIssue};
use weft_record::{DEFAULT_GPU_RESOURCE, gpus_in_use};

fn prepared(t: &weft_topology::NodeTopology) -> PreparedNode {
    PreparedNode::new(t).unwrap()
}

#[test]
fn annotated_pods_hold_exactly_their_annotated_gpus() {
    let node = prepared(&common::dgx1_v100("n"));
    let pods = vec![
        common::bound_pod("a", "n", 2, Some("0,3"), "2026-01-01T00:00:00Z"),
        common::bound_pod("b", "n", 1, Some("6"), "2026-01-01T00:00:01Z"),
    ];
    let usage = gpus_in_use(&node, &pods, DEFAULT_GPU_RESOURCE);
    assert_eq!(usage.used, 0b0100_1001);
    assert_eq!(usage.free(8), vec![1, 2, 4, 5, 7]);
    assert!(usage.issues.is_empty(), "{:?}", usage.issues);
    assert!(usage.pods.iter().all(|p| p.source == GpuSource::Annotation));
}

#[test]
fn unannotated_pods_are_replayed_in_creation_order_with_best_effort() {
    let topo = common::dgx1_v100("n");
    let node = prepared(&topo);
    // Listed out of order: the replay sorts by creation time.
    let pods = vec![
        common::bound_pod("late", "n", 2, None, "2026-01-01T00:00:09Z"),
        common::bound_pod("early", "n", 4, None, "2026-01-01T00:00:01Z"),
    ];
    let usage = gpus_in_use(&node, &pods, DEFAULT_GPU_RESOURCE);
    // Expected: what weft-alloc's best-effort picks, replayed by hand in creation order.
    let all: Vec<usize> = (0..8).collect();
    let first = allocate(&node, &Policy::BestEffort, &Request { count: 4, available: &all, required: &[] }).unwrap();
    let rest: Vec<usize> = all.iter().copied().filter(|g| !first.gpus.contains(g)).collect();
    let second = allocate(&node, &Policy::BestEffort, &Request { count: 2, available: &rest, required: &[] }).unwrap();
    assert_eq!(usage.pods[0].pod.name, "early");
    assert_eq!(usage.pods[0].gpus, first.gpus);
    assert_eq!(usage.pods[1].pod.name, "late");
    assert_eq!(usage.pods[1].gpus, second.gpus);
    assert!(usage.pods.iter().all(|p| p.source == GpuSource::Replayed));
    assert_eq!(usage.used.count_ones(), 6);
    // Deterministic: the same input in another order gives the same answer.
    let reversed: Vec<Pod> = pods.iter().rev().cloned().collect();
    assert_eq!(gpus_in_use(&node, &reversed, DEFAULT_GPU_RESOURCE), usage);
}

#[test]
fn annotated_pods_are_accounted_before_replayed_ones() {
    let node = prepared(&common::a100_nvswitch("n"));
    let pods = vec![
        common::bound_pod("old-unannotated", "n", 2, None, "2026-01-01T00:00:00Z"),
        common::bound_pod("new-annotated", "n", 2, Some("0,1"), "2026-01-01T00:00:05Z"),
    ];
    let usage = gpus_in_use(&node, &pods, DEFAULT_GPU_RESOURCE);
    let replayed = usage.pods.iter().find(|p| p.pod.name == "old-unannotated").unwrap();
    assert!(!replayed.gpus.contains(&0) && !replayed.gpus.contains(&1), "{:?}", replayed.gpus);
    assert_eq!(usage.used.count_ones(), 4);
}

#[test]
fn terminal_pods_hold_nothing() {
    let node = prepared(&common::a100_nvswitch("n"));
    let mut done = common::bound_pod("done", "n", 8, Some("0,1,2,3,4,5,6,7"), "2026-01-01T00:00:00Z");
    done.status.as_mut().unwrap().phase = Some("Succeeded".into());
    let mut failed = common::bound_pod("failed", "n", 8, None, "2026-01-01T00:00:00Z");
    failed.status.as_mut().unwrap().phase = Some("Failed".into());
    let usage = gpus_in_use(&node, &[done, failed], DEFAULT_GPU_RESOURCE);
    assert_eq!(usage.used, 0);
}

#[test]
fn conflicting_and_out_of_range_annotations_are_reported_not_fatal() {
    let node = prepared(&common::a100_nvswitch("n"));
    let pods = vec![
        common::bound_pod("a", "n", 2, Some("0,1"), "2026-01-01T00:00:00Z"),
        common::bound_pod("b", "n", 2, Some("1,9"), "2026-01-01T00:00:01Z"),
    ];
    let usage = gpus_in_use(&node, &pods, DEFAULT_GPU_RESOURCE);
    assert_eq!(usage.used, 0b11, "GPU9 ignored, GPU1 stays used");
    assert!(usage.issues.iter().any(|i| matches!(i, UsageIssue::Conflict { gpu: 1, .. })), "{:?}", usage.issues);
    assert!(usage.issues.iter().any(|i| matches!(i, UsageIssue::OutOfRange { gpu: 9, gpus: 8, .. })));
    let text = usage.issues.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n");
    assert!(text.contains("ml/a") && text.contains("ml/b"), "{text}");
}

#[test]
fn malformed_annotation_falls_back_to_replay() {
    let node = prepared(&common::a100_nvswitch("n"));
    let pods = vec![common::bound_pod("a", "n", 3, Some("zero,one"), "2026-01-01T00:00:00Z")];
    let usage = gpus_in_use(&node, &pods, DEFAULT_GPU_RESOURCE);
    assert_eq!(usage.used.count_ones(), 3);
    assert_eq!(usage.pods[0].source, GpuSource::Replayed);
    assert!(matches!(&usage.issues[0], UsageIssue::BadAnnotation { value, .. } if value == "zero,one"));
}

#[test]
fn annotation_count_differing_from_the_request_is_reported_and_the_annotation_wins() {
    let node = prepared(&common::a100_nvswitch("n"));
    let pods = vec![common::bound_pod("a", "n", 2, Some("4,5,6"), "2026-01-01T00:00:00Z")];
    let usage = gpus_in_use(&node, &pods, DEFAULT_GPU_RESOURCE);
    assert_eq!(usage.used, 0b0111_0000);
    assert!(matches!(usage.issues[0], UsageIssue::CountMismatch { annotated: 3, requested: 2, .. }));
}

#[test]
fn overcommitted_replay_marks_everything_used() {
    let node = prepared(&common::pcie_only("n", 4));
    let pods = vec![
        common::bound_pod("a", "n", 3, None, "2026-01-01T00:00:00Z"),
        common::bound_pod("b", "n", 2, None, "2026-01-01T00:00:01Z"),
    ];
    let usage = gpus_in_use(&node, &pods, DEFAULT_GPU_RESOURCE);
    assert_eq!(usage.used, 0b1111);
    assert!(matches!(usage.issues[0], UsageIssue::Overcommitted { requested: 2, free: 1, .. }), "{:?}", usage.issues);
}
