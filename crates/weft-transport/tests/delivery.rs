//! End-to-end delivery over real TCP on loopback: senders and receivers of the library, no fakes.

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use support::{
    Gate, Recorder, SwitchPeers, fast_config, gated_receiver, guard, loopback, msg, recording_receiver, wait_until,
};
use weft_transport::protocol::EncodeError;
use weft_transport::{
    InFlightLimit, Message, Receiver, ReceiverConfig, Selection, SendError, Sender, SenderConfig, Sent, StaticPeers,
    TcpBackend,
};

async fn wait_links(sender: &Sender, n: usize) {
    guard(&format!("{n} links up"), sender.wait_for_links(n)).await;
    assert_eq!(sender.stats().links.len(), n);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_reach_the_handler_whole_and_are_acknowledged() {
    let rec = Recorder::default();
    let receiver = recording_receiver(&rec).await;
    let sender = Sender::new(TcpBackend::default(), StaticPeers::new([receiver.local_addr()]), fast_config());
    let mut sent = Vec::new();
    let mut handles = Vec::new();
    for i in 0..1000 {
        let mut m = msg(format!("in-{i}-0"), i % 3000);
        m.keys = vec![format!("camera-{}", i % 4)];
        m.event_time = 1_700_000_000_000 + i as i64;
        m.watermark = 1_700_000_000_000;
        m.headers = BTreeMap::from([("frame".to_string(), i.to_string())]);
        sent.push(m.clone());
        match sender.send(m).await.expect("send") {
            Sent::Queued(h) => handles.push(h),
            Sent::Dropped => panic!("dropped under RetryUntilSuccess"),
        }
    }
    for h in handles {
        guard("ack", h).await.expect("acked");
    }
    let mut got = rec.messages();
    got.sort_by_key(|m| m.event_time);
    assert_eq!(got, sent, "every message arrives once with all its fields");
    let stats = sender.stats();
    assert_eq!((stats.acked, stats.in_flight, stats.in_flight_bytes), (1000, 0, 0));
    assert_eq!(receiver.stats().handled, 1000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_payloads_arrive_intact() {
    let rec = Recorder::default();
    let receiver = recording_receiver(&rec).await;
    let sender = Sender::new(TcpBackend::default(), StaticPeers::new([receiver.local_addr()]), fast_config());
    let sizes = [0usize, 1, 64 * 1024, 416 * 416 * 3, 4 * 1024 * 1024, 3];
    for (i, size) in sizes.iter().enumerate() {
        let m = msg(format!("big-{i}"), *size);
        let expect = m.payload.clone();
        guard("ack", sender.send(m).await.expect("send").acked()).await.expect("acked");
        let got = rec.messages().into_iter().find(|m| m.id == format!("big-{i}")).expect("delivered");
        assert_eq!(got.payload, expect, "payload of {size} bytes");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_robin_gives_every_peer_its_turn() {
    let recs: Vec<Recorder> = (0..3).map(|_| Recorder::default()).collect();
    let mut receivers = Vec::new();
    for r in &recs {
        receivers.push(recording_receiver(r).await);
    }
    let sender = Sender::new(
        TcpBackend::default(),
        StaticPeers::new(receivers.iter().map(|r| r.local_addr())),
        SenderConfig { selection: Selection::RoundRobin, ..fast_config() },
    );
    wait_links(&sender, 3).await;
    let mut handles = Vec::new();
    for i in 0..300 {
        handles.push(sender.send(msg(format!("m{i}"), 100)).await.expect("send"));
    }
    for h in handles {
        guard("ack", h.acked()).await.expect("acked");
    }
    let counts: Vec<usize> = recs.iter().map(Recorder::calls).collect();
    assert_eq!(counts, vec![100, 100, 100]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_outstanding_sends_past_a_busy_peer() {
    // Peer A's handler blocks; peer B's succeeds at once. Sending one message at a time, A
    // takes one and is then busy, so least-outstanding sends everything else to B (round
    // robin would give A every second message).
    let gate = Gate::closed();
    let rec_a = Recorder::default();
    let a = gated_receiver(&rec_a, &gate, ReceiverConfig::default()).await;
    let rec_b = Recorder::default();
    let b = recording_receiver(&rec_b).await;
    let sender = Sender::new(
        TcpBackend::default(),
        StaticPeers::new([a.local_addr(), b.local_addr()]),
        SenderConfig { selection: Selection::LeastOutstanding, ..fast_config() },
    );
    wait_links(&sender, 2).await;
    let mut waiting = Vec::new();
    for i in 0..50 {
        let before = rec_a.calls();
        let mut h = match sender.send(msg(format!("m{i}"), 10)).await.expect("send") {
            Sent::Queued(h) => h,
            Sent::Dropped => panic!("dropped"),
        };
        // Either B acknowledged it, or it went to A (whose handler saw it and holds it).
        let acked = guard("ack or arrival at A", async {
            tokio::select! {
                r = &mut h => { r.expect("acked"); true }
                () = async { wait_until("A", || rec_a.calls() > before).await } => false,
            }
        })
        .await;
        if !acked {
            waiting.push(h);
        }
    }
    assert_eq!(rec_a.calls(), 1, "A got one message, then was the busier peer");
    assert_eq!(rec_b.calls(), 49);
    gate.open();
    for h in waiting {
        guard("ack from A", h).await.expect("acked");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_handler_is_nacked_and_delivered_again_elsewhere() {
    let failing = Receiver::bind(&TcpBackend::default(), loopback(), ReceiverConfig::default(), |_m: Message| async {
        Err::<(), _>("model not loaded")
    })
    .await
    .expect("bind");
    let rec = Recorder::default();
    let good = recording_receiver(&rec).await;
    let sender =
        Sender::new(TcpBackend::default(), StaticPeers::new([failing.local_addr(), good.local_addr()]), fast_config());
    wait_links(&sender, 2).await;
    let mut handles = Vec::new();
    for i in 0..20 {
        handles.push(sender.send(msg(format!("m{i}"), 10)).await.expect("send"));
    }
    for h in handles {
        guard("ack", h.acked()).await.expect("acked");
    }
    assert_eq!(rec.distinct(), 20);
    assert_eq!(rec.calls(), 20, "each handled once where it succeeded");
    assert!(failing.stats().failed >= 1, "{:?}", failing.stats());
    assert_eq!(sender.stats().nacked, failing.stats().failed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resent_id_reaches_the_handler_once() {
    let rec = Recorder::default();
    let receiver = recording_receiver(&rec).await;
    let sender = Sender::new(TcpBackend::default(), StaticPeers::new([receiver.local_addr()]), fast_config());
    for _ in 0..3 {
        guard("ack", sender.send(msg("same-id", 10)).await.expect("send").acked()).await.expect("acked");
    }
    assert_eq!(rec.count("same-id"), 1);
    assert_eq!(receiver.stats().duplicates, 2);
    assert_eq!(sender.stats().acked, 3, "the duplicates are acknowledged too");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_of_a_running_message_waits_for_its_outcome() {
    let gate = Gate::closed();
    let rec = Recorder::default();
    let receiver = gated_receiver(&rec, &gate, ReceiverConfig::default()).await;
    let sender = Sender::new(TcpBackend::default(), StaticPeers::new([receiver.local_addr()]), fast_config());
    let first = sender.send(msg("x", 10)).await.expect("send");
    let second = sender.send(msg("x", 10)).await.expect("send");
    wait_until("both copies received", || receiver.stats().received == 2).await;
    assert_eq!(rec.calls(), 1, "the second copy does not run the handler");
    gate.open();
    guard("first ack", first.acked()).await.expect("acked");
    guard("second ack", second.acked()).await.expect("acked");
    assert_eq!(rec.calls(), 1);
    assert_eq!(receiver.stats().duplicates, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_wait_for_a_peer_and_go_when_one_appears() {
    let peers = SwitchPeers::new(vec![], Some(Duration::from_millis(20)));
    let sender = Sender::new(TcpBackend::default(), peers.clone(), fast_config());
    let mut handles = Vec::new();
    for i in 0..10 {
        handles.push(sender.send(msg(format!("m{i}"), 10)).await.expect("send"));
    }
    assert_eq!(sender.stats().in_flight, 10, "queued with no peer");
    let rec = Recorder::default();
    let receiver = recording_receiver(&rec).await;
    peers.set(vec![receiver.local_addr()]);
    for h in handles {
        guard("ack", h.acked()).await.expect("acked");
    }
    assert_eq!(rec.distinct(), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_messages_are_refused_with_what_is_wrong() {
    let sender = Sender::new(
        TcpBackend::default(),
        StaticPeers::new([]),
        SenderConfig { max_payload: 1000, in_flight: InFlightLimit { messages: 10, bytes: 500 }, ..fast_config() },
    );
    assert_eq!(sender.send(msg("", 1)).await.expect_err("empty id"), SendError::Encode(EncodeError::EmptyId));
    assert_eq!(
        sender.send(msg("a", 1001)).await.expect_err("too large"),
        SendError::PayloadTooLarge { size: 1001, limit: 1000 }
    );
    let err = sender.send(msg("a", 900)).await.expect_err("over window");
    assert!(matches!(err, SendError::LargerThanWindow { limit: 500, .. }), "{err}");
    assert!(err.to_string().contains("in-flight window of 500 bytes"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_sender_fails_unacknowledged_messages_as_closed() {
    let sender = Sender::new(TcpBackend::default(), StaticPeers::new([]), fast_config());
    let sent = sender.send(msg("m", 10)).await.expect("send");
    drop(sender);
    assert_eq!(guard("ack", sent.acked()).await, Err(SendError::Closed));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_senders_share_one_receiver() {
    let rec = Recorder::default();
    let receiver = recording_receiver(&rec).await;
    let mut tasks = Vec::new();
    for s in 0..4 {
        let addr = receiver.local_addr();
        tasks.push(tokio::spawn(async move {
            let sender = Sender::new(TcpBackend::default(), StaticPeers::new([addr]), fast_config());
            let mut handles = Vec::new();
            for i in 0..250 {
                handles.push(
                    sender.send(Message::new(format!("s{s}-{i}"), Bytes::from_static(b"x"))).await.expect("send"),
                );
            }
            for h in handles {
                h.acked().await.expect("acked");
            }
            Arc::new(sender)
        }));
    }
    // Keep the senders (and their links) alive while looking at the receiver.
    let mut senders = Vec::new();
    for t in tasks {
        senders.push(guard("sender", t).await.expect("task"));
    }
    assert_eq!(rec.distinct(), 1000);
    assert_eq!(rec.calls(), 1000);
    assert_eq!(receiver.upstream().len(), 4, "four senders by identity");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sender_and_receiver_run_over_shared_memory_with_tcp_fallback() {
    use weft_transport::fallback::Fallback;
    use weft_transport::shm::ShmBackend;
    let node = tempfile::tempdir().expect("dir");
    let backend = || Fallback::new(ShmBackend::new(node.path()).ring_size(16 << 20), TcpBackend::default());
    let rec = Recorder::default();
    // Shared-memory payloads are leases on the ring: a handler that keeps one holds ring space,
    // so this one keeps a copy (the recorder keeps every message).
    let keep = {
        let rec = rec.clone();
        move |mut m: Message| {
            m.payload = Bytes::copy_from_slice(&m.payload);
            rec.record(m);
            std::future::ready(Ok::<(), String>(()))
        }
    };
    let receiver = Receiver::bind(&backend(), loopback(), ReceiverConfig::default(), keep).await.expect("bind");
    let sender = Sender::new(backend(), StaticPeers::new([receiver.local_addr()]), fast_config());
    let mut handles = Vec::new();
    for (i, size) in [0usize, 1, 4096, 519_168, 4 << 20].iter().cycle().take(50).enumerate() {
        handles.push(sender.send(msg(format!("m{i}"), *size)).await.expect("send"));
    }
    for h in handles {
        guard("ack", h.acked()).await.expect("acked");
    }
    assert_eq!(rec.distinct(), 50);
    let by_id: std::collections::HashMap<_, _> = rec.messages().into_iter().map(|m| (m.id.clone(), m)).collect();
    for (i, size) in [0usize, 1, 4096, 519_168, 4 << 20].iter().cycle().take(50).enumerate() {
        assert_eq!(by_id[&format!("m{i}")].payload, msg(format!("m{i}"), *size).payload);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_sending_garbage_is_cut_off_and_others_are_still_served() {
    use weft_transport::{Backend, FrameReader, FrameWriter};
    let rec = Recorder::default();
    let receiver = recording_receiver(&rec).await;
    let tcp = TcpBackend::default();
    // A header that is not the protocol's, and data with no hello first.
    let mut data = bytes::BytesMut::new();
    weft_transport::protocol::encode_data(&mut data, 0, &msg("x", 1), 1024).expect("encode");
    for header in [&b"\x01\x63garbage"[..], &data[..]] {
        let (mut w, mut r) = tcp.connect(receiver.local_addr()).await.expect("connect");
        w.write_frame(header, &Bytes::new()).await.expect("write");
        // The receiver closes the link: the peer reads the end, never an ack.
        assert!(matches!(guard("link closed", r.read_frame()).await, Ok(None) | Err(_)));
    }
    assert_eq!(rec.calls(), 0);
    let sender = Sender::new(TcpBackend::default(), StaticPeers::new([receiver.local_addr()]), fast_config());
    guard("ack", sender.send(msg("fine", 10)).await.expect("send").acked()).await.expect("acked");
    assert_eq!(rec.count("fine"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_a_receiver_acknowledges_what_it_handled_so_nothing_runs_twice() {
    let gate = Gate::closed();
    let (rec_a, rec_b) = (Recorder::default(), Recorder::default());
    let closing = gated_receiver(&rec_a, &gate, ReceiverConfig::default()).await;
    let other = recording_receiver(&rec_b).await;
    let sender =
        Sender::new(TcpBackend::default(), StaticPeers::new([closing.local_addr(), other.local_addr()]), fast_config());
    wait_links(&sender, 2).await;
    let mut handles = Vec::new();
    for i in 0..20 {
        handles.push(sender.send(msg(format!("m{i}"), 10)).await.expect("send"));
    }
    // The closing receiver's handlers hold their messages at the gate while it closes.
    wait_until("handlers running on the closing receiver", || rec_a.calls() > 0).await;
    let running = rec_a.calls();
    let close = tokio::spawn(closing.close());
    gate.open();
    guard("the receiver to close", close).await.expect("close");
    for h in handles {
        guard("ack", h.acked()).await.expect("acked");
    }
    let mut all = rec_a.counts();
    for (id, n) in rec_b.counts() {
        *all.entry(id).or_default() += n;
    }
    assert_eq!(all.len(), 20, "every message handled");
    assert!(all.values().all(|n| *n == 1), "none twice: the closing receiver's acks went out first: {all:?}");
    assert!(rec_a.calls() >= running, "what was running finished there");
}
