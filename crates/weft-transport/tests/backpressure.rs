//! Backpressure: the in-flight window with Numaflow's onFull choices, against a real receiver
//! whose handler blocks. "Pending" is checked by polling the send future once, not by timing.

mod support;

use std::sync::Arc;

use futures::FutureExt;
use support::{Recorder, guard, loopback, msg, permit_gated_receiver, wait_until};
use tokio::sync::Semaphore;
use weft_transport::{
    InFlightLimit, Message, OnFull, Receiver, ReceiverConfig, Sender, SenderConfig, Sent, StaticPeers, TcpBackend,
};

fn config(on_full: OnFull, messages: usize, bytes: usize) -> SenderConfig {
    SenderConfig { on_full, in_flight: InFlightLimit { messages, bytes }, ..SenderConfig::default() }
}

/// A gated receiver (closed gate) and a sender to it with `on_full` and an in-flight window of
/// `messages` and `bytes`. The receiver is returned so it lives as long as the test.
async fn gated(on_full: OnFull, messages: usize, bytes: usize) -> (Arc<Semaphore>, Recorder, Receiver, Sender) {
    let gate = Arc::new(Semaphore::new(0));
    let rec = Recorder::default();
    let receiver = permit_gated_receiver(&rec, &gate).await;
    let sender =
        Sender::new(TcpBackend::default(), StaticPeers::new([receiver.local_addr()]), config(on_full, messages, bytes));
    (gate, rec, receiver, sender)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_until_success_blocks_send_until_an_ack_makes_room() {
    let (gate, rec, _receiver, sender) = gated(OnFull::RetryUntilSuccess, 4, usize::MAX).await;
    let mut handles = Vec::new();
    for i in 0..4 {
        handles.push(sender.send(msg(format!("m{i}"), 100)).await.expect("send"));
    }
    wait_until("four messages in the handler", || rec.calls() == 4).await;
    let mut fifth = Box::pin(sender.send(msg("m4", 100)));
    assert!((&mut fifth).now_or_never().is_none(), "the fifth send waits while the window is full");
    assert_eq!(sender.stats().in_flight, 4);
    // One handler finishes, its ack makes room, the fifth send completes.
    gate.add_permits(1);
    let fifth = guard("fifth send", fifth).await.expect("send");
    assert!(!fifth.is_dropped());
    gate.add_permits(4);
    for h in handles.into_iter().chain([fifth]) {
        assert!(guard("ack", h.acked()).await.expect("acked"));
    }
    assert_eq!(sender.stats().dropped, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discard_latest_drops_counts_and_says_so_when_full() {
    let (gate, rec, _receiver, sender) = gated(OnFull::DiscardLatest, 4, usize::MAX).await;
    let mut handles = Vec::new();
    for i in 0..4 {
        assert!(!sender.is_full(), "room for m{i}");
        handles.push(sender.send(msg(format!("m{i}"), 100)).await.expect("send"));
    }
    assert!(sender.is_full(), "four in flight fill a window of four");
    for i in 4..7 {
        let sent = guard("send", sender.send(msg(format!("m{i}"), 100))).await.expect("send");
        assert!(matches!(sent, Sent::Dropped), "m{i} is dropped");
        assert_eq!(sent.acked().await, Ok(false));
    }
    assert_eq!(sender.stats().dropped, 3);
    gate.add_permits(4);
    for h in handles {
        assert!(guard("ack", h.acked()).await.expect("acked"));
    }
    assert!(!sender.is_full());
    // Room again: the next one is queued and delivered.
    gate.add_permits(1);
    let next = sender.send(msg("m7", 100)).await.expect("send");
    assert!(guard("ack", next.acked()).await.expect("acked"));
    assert_eq!(rec.distinct(), 5, "the dropped ones never reached the receiver");
    assert_eq!(rec.count("m5"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_byte_bound_blocks_like_the_count() {
    // Three 3000-byte payloads (plus headers) fit in 10000 bytes; a fourth does not.
    let (gate, _rec, _receiver, sender) = gated(OnFull::RetryUntilSuccess, 100, 10_000).await;
    let mut handles = Vec::new();
    for i in 0..3 {
        handles.push(sender.send(msg(format!("m{i}"), 3000)).await.expect("send"));
    }
    let mut fourth = Box::pin(sender.send(msg("m3", 3000)));
    assert!((&mut fourth).now_or_never().is_none(), "the bytes are full");
    let stats = sender.stats();
    assert!(stats.in_flight_bytes <= 10_000 && stats.in_flight == 3, "{stats:?}");
    gate.add_permits(100);
    let fourth = guard("fourth send", fourth).await.expect("send");
    for h in handles.into_iter().chain([fourth]) {
        assert!(guard("ack", h.acked()).await.expect("acked"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_bytes_stay_within_the_window_under_load() {
    // A slow receiver (one handler at a time) and a fast producer: memory held by the sender
    // is what the window allows, never more.
    let rec = Recorder::default();
    let receiver = Receiver::bind(
        &TcpBackend::default(),
        loopback(),
        ReceiverConfig { concurrency: 1, ..ReceiverConfig::default() },
        {
            let rec = rec.clone();
            move |m: Message| {
                let rec = rec.clone();
                async move {
                    tokio::task::yield_now().await;
                    rec.record(m);
                    Ok::<(), String>(())
                }
            }
        },
    )
    .await
    .expect("bind");
    const WINDOW: usize = 64 * 1024;
    let sender = Sender::new(
        TcpBackend::default(),
        StaticPeers::new([receiver.local_addr()]),
        config(OnFull::RetryUntilSuccess, 1000, WINDOW),
    );
    let mut handles = Vec::new();
    for i in 0..500usize {
        let size = 1 + (i * 7919) % (16 * 1024);
        handles.push(sender.send(msg(format!("m{i}"), size)).await.expect("send"));
        assert!(sender.stats().in_flight_bytes <= WINDOW);
    }
    for h in handles {
        guard("ack", h.acked()).await.expect("acked");
    }
    let stats = sender.stats();
    assert!(stats.peak_in_flight_bytes <= WINDOW, "peak {} over the window {WINDOW}", stats.peak_in_flight_bytes);
    assert!(
        stats.peak_in_flight_bytes > WINDOW / 2,
        "the window was actually used (peak {})",
        stats.peak_in_flight_bytes
    );
    assert_eq!(rec.distinct(), 500);
}
