//! Receivers that hang rather than fail: a handler that never returns, and a receiver whose
//! process accepts and reads but never answers (stopped or wedged, its kernel still speaking
//! TCP). Over real TCP on loopback.

mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::{Gate, Recorder, SwitchPeers, fast_config, gated_receiver, guard, loopback, msg, wait_until};
use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;
use weft_transport::{Message, Receiver, ReceiverConfig, Sender, SenderConfig, StaticPeers, TcpBackend};

/// Counts the futures dropped while still running.
struct DropCount(Arc<AtomicUsize>);

impl Drop for DropCount {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_never_returns_is_cancelled_and_its_message_delivered_again() {
    let calls: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    let cancelled = Arc::new(AtomicUsize::new(0));
    let config = ReceiverConfig { handler_timeout: Some(Duration::from_millis(100)), ..ReceiverConfig::default() };
    let handler = {
        let (calls, cancelled) = (calls.clone(), cancelled.clone());
        move |m: Message| {
            let first = {
                let mut calls = calls.lock().expect("lock");
                let n = calls.entry(m.id.clone()).or_default();
                *n += 1;
                *n == 1
            };
            let cancelled = cancelled.clone();
            async move {
                if first {
                    // Hangs for ever; only cancellation ends it (and drops the guard).
                    let _guard = DropCount(cancelled);
                    std::future::pending::<()>().await;
                }
                Ok::<(), String>(())
            }
        }
    };
    let receiver = Receiver::bind(&TcpBackend::default(), loopback(), config, handler).await.expect("bind");
    let sender = Sender::new(TcpBackend::default(), StaticPeers::new([receiver.local_addr()]), fast_config());
    let mut handles = Vec::new();
    for i in 0..5 {
        handles.push(sender.send(msg(format!("m{i}"), 100)).await.expect("send"));
    }
    for h in handles {
        assert!(guard("ack", h.acked()).await.expect("acked"), "queued, not dropped");
    }
    let stats = receiver.stats();
    assert_eq!((stats.timed_out, stats.handled, stats.failed), (5, 5, 0), "{stats:?}");
    assert_eq!(cancelled.load(Ordering::SeqCst), 5, "each hung handler's future was dropped, not left running");
    let calls = calls.lock().expect("lock").clone();
    assert_eq!(calls.len(), 5);
    assert!(calls.values().all(|n| *n == 2), "hung once, then handled: {calls:?}");
    assert_eq!(sender.stats().nacked, 5, "the timeout went back to the sender as a nack");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handlers_without_a_limit_are_left_running() {
    let gate = Gate::closed();
    let config = ReceiverConfig { handler_timeout: None, ..ReceiverConfig::default() };
    let receiver = gated_receiver(&Recorder::default(), &gate, config).await;
    let sender = Sender::new(TcpBackend::default(), StaticPeers::new([receiver.local_addr()]), fast_config());
    let sent = sender.send(msg("slow", 10)).await.expect("send");
    wait_until("the message reached the handler", || receiver.stats().received == 1).await;
    gate.open();
    guard("ack", sent.acked()).await.expect("acked");
    assert_eq!(receiver.stats().timed_out, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_limits_are_refused() {
    let bad = [
        ReceiverConfig { alive_interval: Duration::ZERO, ..ReceiverConfig::default() },
        ReceiverConfig { handler_timeout: Some(Duration::ZERO), ..ReceiverConfig::default() },
    ];
    for config in bad {
        let err =
            Receiver::bind(&TcpBackend::default(), loopback(), config, |_m: Message| async { Ok::<(), String>(()) })
                .await
                .expect_err("refused");
        assert!(err.to_string().contains("above zero"), "{err}");
    }
}

/// A peer that accepts links and reads everything but never writes a byte back: a receiver
/// process that is stopped or wedged while its kernel still acknowledges TCP.
async fn silent_peer() -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind(loopback()).await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut sink = vec![0u8; 64 * 1024];
                while matches!(conn.read(&mut sink).await, Ok(n) if n > 0) {}
            });
        }
    });
    (addr, accepted)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_receiver_is_left_and_a_slow_one_that_speaks_is_kept() {
    // The live receiver's handler waits at a gate: slow, but it speaks (alive frames).
    let gate = Gate::closed();
    let rec = Recorder::default();
    let config = ReceiverConfig { alive_interval: Duration::from_millis(20), ..ReceiverConfig::default() };
    let live = gated_receiver(&rec, &gate, config).await;
    let (silent, silent_accepts) = silent_peer().await;
    let peers = SwitchPeers::new(vec![live.local_addr()], Some(Duration::from_millis(20)));
    let config = SenderConfig { silence_timeout: Some(Duration::from_millis(300)), ..fast_config() };
    let sender = Sender::new(TcpBackend::default(), peers.clone(), config);

    // The live link has a message outstanding before the silent peer exists, so by the time
    // the silent link has been quiet for the timeout, the live one has waited longer still.
    let first = sender.send(msg("first", 10)).await.expect("send");
    wait_until("the live receiver has the first message", || rec.calls() == 1).await;
    peers.set(vec![live.local_addr(), silent]);
    guard("two links up", sender.wait_for_links(2)).await;
    let mut handles = vec![first];
    for i in 0..20 {
        handles.push(sender.send(msg(format!("m{i}"), 10)).await.expect("send"));
    }
    wait_until("the silent link is failed", || sender.stats().silent_links >= 1).await;
    assert!(silent_accepts.load(Ordering::SeqCst) >= 1);
    gate.open();
    for h in handles {
        assert!(guard("ack", h.acked()).await.expect("acked"));
    }
    assert_eq!(rec.distinct(), 21, "every message reached the live receiver");
    assert_eq!(rec.calls(), 21, "once each");
    // Had its link been failed, reaching it again would have taken a second one.
    assert_eq!(live.stats().links_accepted, 1, "the slow receiver that speaks kept its one link");
    let stats = sender.stats();
    assert!(stats.resent >= 1, "what the silent link had was sent again: {stats:?}");
}
