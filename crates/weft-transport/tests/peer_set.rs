//! Peer set changes without DNS (a test peer source): a removed peer drains before its link
//! closes, a new peer takes over, and a connection failure makes the sender resolve afresh.

mod support;

use std::sync::Arc;
use std::time::Duration;

use support::{Recorder, SwitchPeers, guard, msg, permit_gated_receiver, recording_receiver, wait_until};
use tokio::sync::Semaphore;
use weft_transport::{Backoff, Sender, SenderConfig, TcpBackend};

fn fast() -> SenderConfig {
    SenderConfig {
        backoff: Backoff { initial: Duration::from_millis(5), max: Duration::from_millis(50), jitter: 0.5 },
        min_resolve_interval: Duration::from_millis(10),
        ..SenderConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_peer_drains_and_a_new_peer_takes_over_without_loss() {
    let gate = Arc::new(Semaphore::new(0));
    let rec_a = Recorder::default();
    let a = permit_gated_receiver(&rec_a, &gate).await;
    let rec_b = Recorder::default();
    let b = recording_receiver(&rec_b).await;
    let peers = SwitchPeers::new(vec![a.local_addr()], Some(Duration::from_millis(20)));
    let sender = Sender::new(TcpBackend::default(), peers.clone(), fast());
    let mut first = Vec::new();
    for i in 0..20 {
        first.push(sender.send(msg(format!("first-{i}"), 100)).await.expect("send"));
    }
    wait_until("A holds the first batch", || rec_a.calls() == 20).await;

    // The peer set moves to B while A still holds 20 unacknowledged messages.
    peers.set(vec![b.local_addr()]);
    wait_until("the sender sees the new peer set", || sender.stats().peers == vec![b.local_addr()]).await;
    let mut second = Vec::new();
    for i in 0..20 {
        second.push(sender.send(msg(format!("second-{i}"), 100)).await.expect("send"));
    }
    for h in second {
        guard("ack from B", h.acked()).await.expect("acked");
    }
    assert_eq!(rec_b.calls(), 20, "new messages go to the new peer only");
    let links = sender.stats().links;
    assert!(
        links.iter().any(|l| l.peer == a.local_addr() && !l.open && l.outstanding == 20),
        "A's link stays, draining: {links:?}"
    );

    // A finishes; its acks arrive over the draining link, then the link closes.
    gate.add_permits(20);
    for h in first {
        guard("ack from A", h.acked()).await.expect("acked");
    }
    wait_until("A's link closed after draining", || sender.stats().links.iter().all(|l| l.peer != a.local_addr()))
        .await;
    assert_eq!(rec_a.calls(), 20, "A saw only the first batch");
    let stats = sender.stats();
    assert_eq!((stats.acked, stats.resent), (40, 0), "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_failure_makes_the_sender_resolve_afresh() {
    let rec_a = Recorder::default();
    let a = recording_receiver(&rec_a).await;
    // Valid for ever: only a failure makes the sender ask again.
    let peers = SwitchPeers::new(vec![a.local_addr()], None);
    let sender = Sender::new(TcpBackend::default(), peers.clone(), fast());
    guard("ack", sender.send(msg("m0", 10)).await.expect("send").acked()).await.expect("acked");
    assert_eq!(peers.resolutions(), 1);

    let rec_b = Recorder::default();
    let b = recording_receiver(&rec_b).await;
    peers.set(vec![b.local_addr()]);
    drop(a);
    wait_until("a fresh resolution after the failure", || peers.invalidations() >= 1 && peers.resolutions() >= 2).await;
    guard("ack", sender.send(msg("m1", 10)).await.expect("send").acked()).await.expect("acked");
    assert_eq!(rec_b.count("m1"), 1);
    assert!(sender.stats().link_failures >= 1);
}
