//! Watermarks across a direct edge: the receiver's input watermark is the minimum over its
//! upstream senders, idle senders still advance it, and a sender that left stops holding it.

mod support;

use std::time::Duration;

use support::{Recorder, guard, loopback, msg, wait_until};
use weft_transport::{NO_WATERMARK, Receiver, ReceiverConfig, Sender, SenderConfig, StaticPeers, TcpBackend};

fn sender(name: &str, receiver: &Receiver) -> Sender {
    Sender::new(
        TcpBackend::default(),
        StaticPeers::new([receiver.local_addr()]),
        SenderConfig { identity: name.to_string(), ..SenderConfig::default() },
    )
}

async fn receiver(rec: &Recorder, linger: Duration) -> Receiver {
    Receiver::bind(
        &TcpBackend::default(),
        loopback(),
        ReceiverConfig { sender_linger: linger, ..ReceiverConfig::default() },
        rec.handler(),
    )
    .await
    .expect("bind")
}

async fn wait_watermark(r: &Receiver, want: i64) {
    let mut w = r.watch_watermark();
    guard(&format!("watermark {want}"), w.wait_for(|v| *v == want)).await.expect("watch");
}

/// Waits until `n` senders said hello, so data that follows cannot race a late hello (a sender
/// that joins later cannot move the watermark back).
async fn wait_upstream(r: &Receiver, n: usize) {
    wait_until(&format!("{n} upstream senders"), || r.upstream().len() == n).await;
}

async fn send_at(s: &Sender, id: &str, watermark: i64) {
    let mut m = msg(id, 10);
    m.event_time = watermark;
    m.watermark = watermark;
    guard("ack", s.send(m).await.expect("send").acked()).await.expect("acked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_sender_still_advances_the_receivers_watermark() {
    let rec = Recorder::default();
    let r = receiver(&rec, Duration::from_secs(10)).await;
    let s = sender("a", &r);
    send_at(&s, "m1", 100).await;
    wait_watermark(&r, 100).await;
    // No more data: the watermark alone moves on, in a watermark frame.
    s.set_watermark(500);
    wait_watermark(&r, 500).await;
    s.set_watermark(400);
    assert_eq!(s.watermark(), 500, "a sender's watermark never goes back");
    assert_eq!(rec.calls(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_input_watermark_is_the_minimum_over_senders() {
    let rec = Recorder::default();
    let r = receiver(&rec, Duration::from_secs(10)).await;
    let a = sender("a", &r);
    let b = sender("b", &r);
    wait_upstream(&r, 2).await;
    send_at(&a, "a1", 100).await;
    send_at(&b, "b1", 300).await;
    wait_watermark(&r, 100).await;
    a.set_watermark(400);
    wait_watermark(&r, 300).await;
    b.set_watermark(1000);
    wait_watermark(&r, 400).await;
    assert_eq!(r.upstream(), vec![("a".into(), 400), ("b".into(), 1000)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sender_without_a_watermark_holds_it_at_none() {
    let rec = Recorder::default();
    let r = receiver(&rec, Duration::from_secs(10)).await;
    let a = sender("a", &r);
    let b = sender("b", &r);
    wait_upstream(&r, 2).await;
    send_at(&b, "b1", NO_WATERMARK).await;
    send_at(&a, "a1", 100).await;
    assert_eq!(r.upstream(), vec![("a".into(), 100), ("b".into(), NO_WATERMARK)]);
    assert_eq!(r.watermark(), NO_WATERMARK);
    b.set_watermark(50);
    wait_watermark(&r, 50).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sender_that_left_stops_holding_the_watermark_back() {
    let rec = Recorder::default();
    let r = receiver(&rec, Duration::ZERO).await;
    let a = sender("a", &r);
    let slow = sender("slow", &r);
    wait_upstream(&r, 2).await;
    send_at(&a, "a1", 100).await;
    send_at(&slow, "s1", 50).await;
    wait_watermark(&r, 50).await;
    a.set_watermark(700);
    drop(slow);
    wait_watermark(&r, 700).await;
    assert_eq!(r.upstream(), vec![("a".into(), 700)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn within_the_linger_a_reconnecting_sender_keeps_holding_it() {
    let rec = Recorder::default();
    let r = receiver(&rec, Duration::from_secs(600)).await;
    let a = sender("a", &r);
    let b = sender("b", &r);
    wait_upstream(&r, 2).await;
    send_at(&a, "a1", 100).await;
    send_at(&b, "b1", 50).await;
    wait_watermark(&r, 50).await;
    drop(b);
    a.set_watermark(700);
    wait_until("a's idle watermark arrives", || r.upstream().first() == Some(&("a".to_string(), 700))).await;
    // b is gone but lingers: its 50 still holds the minimum. A new sender under b's name
    // takes its place and moves it on.
    assert_eq!(r.watermark(), 50);
    let b2 = sender("b", &r);
    send_at(&b2, "b2", 60).await;
    wait_watermark(&r, 60).await;
    assert_eq!(r.upstream(), vec![("a".into(), 700), ("b".into(), 60)]);
}
