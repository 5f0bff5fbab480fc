//! Request bodies at the sizes real schedulers send, and oversized ones: bodies are decoded as
//! they arrive, what weft does not read is dropped as it goes, and a node list over the limit is
//! refused at the first node over it, before the rest of the body is read or decoded.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod sizes;

use std::io::Read;
use std::sync::Arc;
use std::time::Duration;

use common::{TestServer, post_raw};
use serde_json::{Value, json};
use weft_extender::stream::{JsonStream, StreamError, StreamLimits};
use weft_extender::wire::{ExtenderFilterResult, read_args};
use weft_extender::{ExtenderConfig, InMemoryView};

const LIMITS: StreamLimits = StreamLimits { max_body_bytes: u64::MAX, max_decoded_bytes: 64 << 20 };

/// An endless body: `head`, then `item(i)` for i = 0, 1, … separated by commas, never closed;
/// counts the bytes it hands out.
struct Endless<F> {
    pending: Vec<u8>,
    at: usize,
    next: usize,
    item: F,
    handed_out: u64,
}

impl<F: FnMut(usize) -> String> Endless<F> {
    fn new(head: &str, item: F) -> Self {
        Endless { pending: head.as_bytes().to_vec(), at: 0, next: 0, item, handed_out: 0 }
    }
}

impl<F: FnMut(usize) -> String> Read for Endless<F> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        while self.at == self.pending.len() {
            let sep = if self.next == 0 { "" } else { "," };
            self.pending = format!("{sep}{}", (self.item)(self.next)).into_bytes();
            self.at = 0;
            self.next += 1;
        }
        let n = out.len().min(self.pending.len() - self.at);
        out[..n].copy_from_slice(&self.pending[self.at..self.at + n]);
        self.at += n;
        self.handed_out += n as u64;
        Ok(n)
    }
}

fn pod_text() -> String {
    common::pending_pod_json("p", 2).to_string()
}

#[test]
fn an_endless_node_list_stops_at_the_first_node_over_the_limit() {
    // 1.9M bare nodes (59 MiB) once took 3 GB and ran on after the answer; an endless list shows
    // that decoding stops at the limit and reads only about as far.
    const MAX: usize = 1_000;
    let node = |i: usize| format!("{{\"metadata\":{{\"name\":\"n{i:07}\"}}}}");
    let head = format!("{{\"Pod\":{},\"Nodes\":{{\"items\":[", pod_text());
    let mut stream = JsonStream::new(Endless::new(&head, node), LIMITS);
    let err = read_args(&mut stream, MAX).unwrap_err();
    assert!(matches!(err, StreamError::TooManyNodes { max: MAX }), "{err}");
    assert!(err.to_string().contains("at least 1001 nodes; at most 1000"), "{err}");
    let through_limit = (head.len() + (MAX + 1) * (node(0).len() + 1)) as u64;
    assert!(
        stream.consumed() <= through_limit && stream.read_bytes() <= through_limit + (128 << 10),
        "decoded {} and read {} bytes; the first {} nodes end at byte {through_limit}",
        stream.consumed(),
        stream.read_bytes(),
        MAX + 1
    );

    // The same for node names.
    let head = format!("{{\"Pod\":{},\"NodeNames\":[", pod_text());
    let mut stream = JsonStream::new(Endless::new(&head, |i| format!("\"n{i:07}\"")), LIMITS);
    let err = read_args(&mut stream, MAX).unwrap_err();
    assert!(matches!(err, StreamError::TooManyNodes { max: MAX }), "{err}");
    assert!(stream.read_bytes() <= (head.len() + (MAX + 1) * 11) as u64 + (128 << 10), "{}", stream.read_bytes());
}

#[test]
fn an_endless_volcano_node_list_stops_at_the_limit() {
    const MAX: usize = 50;
    let task = sizes::task_info(&sizes::running_pod("w-0", "uid-w-0", ""), "", 1);
    let head = format!("{{\"task\":{task},\"nodes\":[");
    let node = |i: usize| sizes::node_info_text(&format!("gpu-{i:05}"), 2);
    let one = node(0).len();
    let mut stream = JsonStream::new(Endless::new(&head, node), LIMITS);
    let err = weft_extender::volcano::read_prioritize(&mut stream, MAX).unwrap_err();
    assert!(matches!(err, StreamError::TooManyNodes { max: MAX }), "{err}");
    assert!(stream.read_bytes() <= (head.len() + (MAX + 2) * (one + 1)) as u64 + (128 << 10));
}

#[test]
fn skipped_task_pods_do_not_count_against_the_decoded_limit_and_kept_values_do() {
    let task = sizes::task_info(&sizes::running_pod("w-0", "uid-w-0", ""), "", 1);
    let names: Vec<String> = (0..40).map(|i| format!("gpu-{i:05}")).collect();
    let body = sizes::prioritize_body(&task, &names, 10);
    let one_node = sizes::node_info_text("gpu-00000", 10).len();
    // Room for the task and one NodeInfo at a time, a tenth of the body.
    let limit = one_node * 2 + task.to_string().len();
    assert!(body.len() > limit * 10, "{} vs {limit}", body.len());
    let limits = StreamLimits { max_body_bytes: u64::MAX, max_decoded_bytes: limit };
    let mut stream = JsonStream::new(body.as_slice(), limits);
    let request = weft_extender::volcano::read_prioritize(&mut stream, 10_000).unwrap();
    let got: Vec<String> = request.nodes.unwrap().into_iter().map(|n| n.name).collect();
    assert_eq!(got, names);
    assert!(stream.kept_bytes() < limit, "kept {} of {limit}", stream.kept_bytes());

    // Node objects are kept: the same budget refuses a Nodes list ten times its size.
    let node = common::node_json("n", Some(&common::a100_nvswitch("n")), 8).to_string();
    let nodes: Vec<String> = (0..(limit * 10 / node.len() + 1)).map(|_| node.clone()).collect();
    let body = format!("{{\"Pod\":{},\"Nodes\":{{\"items\":[{}]}}}}", pod_text(), nodes.join(","));
    let err = read_args(&mut JsonStream::new(body.as_bytes(), limits), 10_000).unwrap_err();
    assert!(matches!(err, StreamError::DecodedTooLarge { .. }), "{err}");
    assert!(err.is_too_large());

    // One value larger than the limit is refused as it is read, not after.
    let huge = format!("{{\"Pod\":{{\"metadata\":{{\"name\":\"{}\"}}}}}}", "x".repeat(limit * 4));
    let mut stream = JsonStream::new(huge.as_bytes(), limits);
    let err = read_args(&mut stream, 10).unwrap_err();
    assert!(matches!(&err, StreamError::ValueTooLarge { what, .. } if what == "Pod"), "{err}");
    assert!(stream.read_bytes() <= (limit + (64 << 10)) as u64 + 1, "{}", stream.read_bytes());
}

#[test]
fn values_split_anywhere_across_reads_decode_the_same() {
    let body = json!({"Pod": common::pending_pod_json("p", 2), "unknown": [1, {"x": [true, null, -1.5e3]}, "s"],
                      "Nodes": {"metadata": {}, "items": [common::node_json("n1", None, 8)]},
                      "nodeNames": ["a", "b"], "n": 12345})
    .to_string();
    let whole: weft_extender::ExtenderArgs = serde_json::from_str(&body).unwrap();
    for step in [1, 2, 3, 7, 64] {
        let mut stream = JsonStream::new(Trickle(body.as_bytes(), step), LIMITS);
        assert_eq!(read_args(&mut stream, 10).unwrap(), whole, "step {step}");
    }
}

#[test]
fn a_decoded_limit_below_the_read_size_reads_on_instead_of_panicking() {
    // Found by fuzzing (fuzz/ extender_args): with --max-decoded-bytes under 64 KiB, a value cut
    // by a read asked `clamp(64 KiB, limit + 1)` of the buffer, which panics when min > max.
    let body = br#"{"pod":null,"nodes":null,"NodeNames":["a","b"],"x":[1,{"y":"\u00e9"}]}"#;
    let limits = StreamLimits { max_body_bytes: 1 << 16, max_decoded_bytes: 4096 };
    let mut stream = JsonStream::new(Trickle(body, 1), limits);
    let args = read_args(&mut stream, 10).unwrap();
    assert_eq!(args.node_names, Some(vec!["a".to_string(), "b".to_string()]));
    // A value over that limit is still refused for its size.
    let big = format!("{{\"NodeNames\":[\"{}\"]}}", "n".repeat(5000));
    let err = read_args(&mut JsonStream::new(Trickle(big.as_bytes(), 3), limits), 10).unwrap_err();
    assert!(matches!(err, StreamError::ValueTooLarge { limit: 4096, .. }), "{err}");
}

/// Hands out at most `.1` bytes per read.
struct Trickle<'a>(&'a [u8], usize);
impl Read for Trickle<'_> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        let n = out.len().min(self.1).min(self.0.len());
        out[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        Ok(n)
    }
}

#[test]
fn a_number_cut_by_a_read_is_read_on() {
    // Reads come in 64 KiB; put a number across that boundary at every split point.
    let number = "-68719476736.5e-3";
    for cut in 0..=number.len() {
        let pad = "x".repeat((64 << 10) - 14 - cut);
        let body = format!("{{\"pad\":\"{pad}\",\"n\":{number},\"NodeNames\":[\"a\"]}}");
        assert_eq!(body.find(number).unwrap() + cut, 64 << 10, "the number starts {cut} bytes before the cut");
        let args = read_args(&mut JsonStream::new(body.as_bytes(), LIMITS), 10).unwrap();
        assert_eq!(args.node_names, Some(vec!["a".to_string()]), "cut {cut}");
    }
}

#[test]
fn malformed_bodies_are_errors_that_say_where() {
    for (body, want) in [
        (&b"{\"Pod\": {\"metadata\": "[..], "line 1"),
        (b"{\"NodeNames\": [\"a\" \"b\"]}", "expected `,` or `]` in NodeNames"),
        (b"{\"NodeNames\": [\"a\"]} x", "the end of the body"),
        (b"[1]", "ExtenderArgs (an object)"),
        (b"{\"Pod\": 7}", "Pod: invalid type"),
    ] {
        let err = read_args(&mut JsonStream::new(body, LIMITS), 10).unwrap_err();
        assert!(matches!(err, StreamError::Syntax { .. }), "{err}");
        assert!(err.to_string().contains(want), "{err} (wanted {want})");
    }
    let deep = format!("{{\"x\":{}{}}}", "[".repeat(200), "]".repeat(200));
    let err = read_args(&mut JsonStream::new(deep.as_bytes(), LIMITS), 10).unwrap_err();
    assert!(err.to_string().contains("nested deeper than 128"), "{err}");
}

#[test]
fn reading_stops_once_the_deadline_has_passed() {
    let head = format!("{{\"Pod\":{},\"NodeNames\":[", pod_text());
    let passed = weft_extender::decision::Deadline::at(std::time::Instant::now());
    let mut stream = JsonStream::new(Endless::new(&head, |i| format!("\"n{i}\"")), LIMITS).with_deadline(passed);
    let err = read_args(&mut stream, usize::MAX).unwrap_err();
    assert!(matches!(err, StreamError::Expired), "{err}");
    assert_eq!(stream.read_bytes(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_given_up_stops_reading_its_body_and_frees_its_slot() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // One decision slot. A sender that stalls mid-body holds it until the request's time runs
    // out; then its decoder must stop (its body no longer reaches it), or the slot stays taken and
    // every later request times out too.
    let names: Vec<String> = vec!["n0".into()];
    let cfg = ExtenderConfig {
        request_timeout: Duration::from_secs(2),
        max_concurrent_decisions: 1,
        ..ExtenderConfig::default()
    };
    let server = TestServer::start(view_of(&names), cfg).await;
    let addr = server.base.trim_start_matches("http://").to_string();
    let mut stalled = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let part = format!("{{\"Pod\":{},\"NodeNames\":[\"n0\",", pod_text());
    let head = format!(
        "POST /prioritize HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Transfer-Encoding: chunked\r\n\r\n{:x}\r\n{part}\r\n",
        part.len()
    );
    stalled.write_all(head.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(60), async {
        let mut buf = [0u8; 1024];
        while !answer.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = stalled.read(&mut buf).await.unwrap();
            assert_ne!(n, 0, "closed without an answer");
            answer.extend_from_slice(&buf[..n]);
        }
    });
    read.await.expect("the stalled request is answered once its time is up");
    assert!(answer.starts_with(b"HTTP/1.1 503"), "{}", String::from_utf8_lossy(&answer));

    // The slot is free again: a whole request is answered.
    let body = common::args_with_names(common::pending_pod_json("p", 2), &["n0"]);
    let (status, text) = common::post(&format!("{}/prioritize", server.base), &body).await;
    assert_eq!(status, 200, "{text}");
    drop(stalled);
    server.stop().await.unwrap();
}

fn view_of(names: &[String]) -> Arc<InMemoryView> {
    let view = Arc::new(InMemoryView::new());
    for name in names {
        view.insert_node(common::node(name, Some(&common::pcie_only(name, 8)), 8));
    }
    view
}

/// Generous: debug builds decode slowly and timing is the benchmark's business.
fn patient() -> ExtenderConfig {
    ExtenderConfig { request_timeout: Duration::from_secs(120), ..ExtenderConfig::default() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volcano_prioritize_for_1000_nodes_with_20_pods_each_is_scored() {
    // 67 MiB, as Volcano marshals it: refused (413) when bodies were held whole under 64 MiB.
    let names: Vec<String> = (0..1_000).map(|i| format!("gpu-{i:05}")).collect();
    let task = sizes::task_info(&sizes::running_pod("w-0", "uid-w-0", ""), "", 1);
    let body = sizes::prioritize_body(&task, &names, 20);
    assert!(body.len() > 64 << 20, "{} bytes", body.len());
    let server = TestServer::start(view_of(&names), patient()).await;
    let (status, text) = post_raw(&format!("{}/volcano/prioritize", server.base), body, &[]).await;
    assert_eq!(status, 200, "{text}");
    let answer: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(answer["errorMessage"], "", "{answer}");
    let scores = answer["nodeScore"].as_object().unwrap();
    assert_eq!(scores.len(), 1_000);
    assert!(names.iter().all(|n| scores[n].as_f64().is_some_and(|s| (0.0..=100.0).contains(&s))));
    server.stop().await.unwrap();
}

#[tokio::test]
async fn a_node_list_over_the_limit_is_refused_before_the_rest_is_decoded() {
    // Four nodes where three are allowed, then a tail that is not JSON: decoding has stopped at
    // the fourth node, so the answer is the limit, not a syntax error about the tail.
    let names: Vec<String> = (0..3).map(|i| format!("n{i}")).collect();
    let cfg = ExtenderConfig { max_nodes_per_request: 3, ..patient() };
    let server = TestServer::start(view_of(&names), cfg).await;
    let tail = "!".repeat(1 << 20);
    let bodies = [
        format!("{{\"Pod\":{},\"NodeNames\":[\"n0\",\"n1\",\"n2\",\"n3\",{tail}", pod_text()),
        format!("{{\"Pod\":{},\"Nodes\":{{\"items\":[{},{tail}", pod_text(), ["{}"; 4].join(",")),
    ];
    for body in bodies {
        let (status, text) = post_raw(&format!("{}/filter", server.base), body.clone().into_bytes(), &[]).await;
        assert_eq!(status, 200, "{text}");
        let result: ExtenderFilterResult = serde_json::from_str(&text).unwrap();
        assert!(result.error.contains("at least 4 nodes; at most 3"), "{result:?}");
        assert_eq!((result.node_names, result.nodes), (None, None));
        let (status, text) = post_raw(&format!("{}/prioritize", server.base), body.into_bytes(), &[]).await;
        assert_eq!(status, 400, "{text}");
        assert!(text.contains("at most 3"), "{text}");
    }
    // vc-scheduler's prioritize: an answer with the reason, which Volcano reports.
    let task = sizes::task_info(&sizes::running_pod("w-0", "uid-w-0", ""), "", 1);
    let nodes: Vec<String> = (0..4).map(|i| sizes::node_info_text(&format!("n{i}"), 1)).collect();
    let body = format!("{{\"task\":{task},\"nodes\":[{},{tail}", nodes.join(","));
    let (status, text) = post_raw(&format!("{}/volcano/prioritize", server.base), body.into_bytes(), &[]).await;
    assert_eq!(status, 200, "{text}");
    let answer: Value = serde_json::from_str(&text).unwrap();
    assert!(answer["errorMessage"].as_str().unwrap().contains("at most 3"), "{answer}");
    assert_eq!(answer["nodeScore"], json!({}));
    server.stop().await.unwrap();
}

#[tokio::test]
async fn bodies_over_the_limits_get_413() {
    let cfg = ExtenderConfig { max_body_bytes: 1 << 20, max_decoded_bytes: 64 << 10, ..patient() };
    let server = TestServer::start(Arc::new(InMemoryView::new()), cfg).await;
    // Over the body limit, skipped or not.
    let task = sizes::task_info(&sizes::running_pod("w-0", "uid-w-0", ""), "", 1);
    let names: Vec<String> = (0..40).map(|i| format!("gpu-{i:05}")).collect();
    let body = sizes::prioritize_body(&task, &names, 10);
    assert!(body.len() > 1 << 20);
    let (status, text) = post_raw(&format!("{}/volcano/prioritize", server.base), body, &[]).await;
    assert_eq!(status, 413, "{text}");
    assert!(text.contains("--max-body-bytes"), "{text}");
    // Within it, but keeping more than the decoded limit.
    let node = common::node_json("n", Some(&common::a100_nvswitch("n")), 8).to_string();
    let body = format!("{{\"Pod\":{},\"Nodes\":{{\"items\":[{}]}}}}", pod_text(), vec![node; 40].join(","));
    assert!(body.len() < 1 << 20);
    let (status, text) = post_raw(&format!("{}/filter", server.base), body.into_bytes(), &[]).await;
    assert_eq!(status, 413, "{text}");
    assert!(text.contains("--max-decoded-bytes"), "{text}");
    // A bind body over the decoded limit.
    let bind = json!({"PodName": "x".repeat(70 << 10), "PodNamespace": "ml", "PodUID": "u", "Node": "n"});
    let (status, text) = post_raw(&format!("{}/bind", server.base), bind.to_string().into_bytes(), &[]).await;
    assert_eq!(status, 413, "{text}");
    server.stop().await.unwrap();
}
