//! The ISB baseline the bench measures, checked against a real `nats-server -js`: the buffer is
//! created with Numaflow's settings and the server reports exactly those back, the server drops a
//! resend with the same `Nats-Msg-Id`, and the pull/ack loop delivers every message once.
//!
//! Needs `nats-server` (Debian: `apt-get install -y nats-server`; or `NATS_SERVER=/path`). Without
//! it each test skips through `weft_testkit::require` (a failure under `WEFT_TEST_REQUIRE_ALL=1`).

// The bench's ISB helpers; the bench uses parts this test does not, and the other way round.
#[allow(dead_code)]
#[path = "../benches/common/isb.rs"]
mod isb;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use async_nats::jetstream::consumer::{AckPolicy, DeliverPolicy};
use async_nats::jetstream::stream::{DiscardPolicy, RetentionPolicy, StorageType};
use bytes::Bytes;

/// A hang guard for conditions the server reaches asynchronously (acks applied).
const DEADLINE: Duration = Duration::from_secs(30);

/// The server, or `None` when nats-server is not installed (a skip through
/// `weft_testkit::require`). `test` names the check in a start failure.
fn server(test: &str) -> Option<isb::NatsServer> {
    let bin = isb::find_nats_server().ok_or("nats-server (apt-get install -y nats-server, or set NATS_SERVER)");
    let bin = weft_testkit::require_ok(bin)?;
    match isb::NatsServer::start(&bin) {
        Ok(s) => Some(s),
        Err(e) => panic!("{test}: nats-server is installed but did not start: {e:#}"),
    }
}

#[tokio::test]
async fn the_server_reports_numaflows_stream_and_consumer_settings() {
    let Some(server) = server("settings") else {
        return;
    };
    let js = isb::connect(server.url()).await.expect("connect");
    let name = "default-p1-in-out-0";
    let mut consumer = isb::create_buffer(&js, name).await.expect("create buffer");

    let mut stream = js.get_stream(name).await.expect("stream");
    let info = stream.info().await.expect("stream info");
    let c = &info.config;
    assert_eq!(c.name, name);
    assert_eq!(c.subjects, vec![name.to_string()]);
    assert_eq!(c.retention, RetentionPolicy::Interest);
    assert_eq!(c.discard, DiscardPolicy::Old);
    assert_eq!(c.max_messages, 30_000);
    assert_eq!(c.max_age, Duration::from_secs(168 * 3600));
    assert_eq!(c.max_bytes, -1);
    assert_eq!(c.storage, StorageType::File);
    assert_eq!(c.num_replicas, 1);
    assert_eq!(c.duplicate_window, Duration::from_secs(60));

    let info = consumer.info().await.expect("consumer info");
    assert_eq!(info.stream_name, name);
    assert_eq!(info.name, name);
    let c = &info.config;
    assert_eq!(c.durable_name.as_deref(), Some(name));
    assert_eq!(c.deliver_policy, DeliverPolicy::All);
    assert_eq!(c.ack_policy, AckPolicy::Explicit);
    assert_eq!(c.ack_wait, Duration::from_secs(60));
    assert_eq!(c.max_ack_pending, 20_000);
    assert_eq!(c.filter_subject, name);
}

#[tokio::test]
async fn a_resend_with_the_same_msg_id_is_stored_once() {
    let Some(server) = server("dedup") else {
        return;
    };
    let js = isb::connect(server.url()).await.expect("connect");
    let name = "default-p1-in-out-dedup";
    let consumer = isb::create_buffer(&js, name).await.expect("create buffer");

    let mut publisher = isb::WindowedPublisher::new(js.clone(), name, 10);
    publisher.publish("msg-1", Bytes::from_static(b"first")).await.expect("publish");
    publisher.flush().await.expect("ack of the first publish");
    publisher.publish("msg-1", Bytes::from_static(b"resend")).await.expect("publish the resend");
    publisher.publish("msg-2", Bytes::from_static(b"second")).await.expect("publish");
    publisher.flush().await.expect("acks");
    assert_eq!(publisher.acked(), 3, "every publish is acknowledged");
    assert_eq!(publisher.duplicates(), 1, "the resend is acknowledged as a duplicate");

    let mut stream = js.get_stream(name).await.expect("stream");
    assert_eq!(stream.info().await.expect("stream info").state.messages, 2, "the stream holds msg-1 once and msg-2");

    // The reader sees msg-1 once, with the first payload.
    let mut reader = isb::BatchReader::new(consumer);
    let mut got = Vec::new();
    for _ in 0..2 {
        let msg =
            tokio::time::timeout(DEADLINE, reader.next()).await.expect("a message within the deadline").expect("pull");
        got.push((isb::message_id(&msg).expect("id").to_string(), msg.payload.clone()));
        isb::ack(&msg).await.expect("ack");
    }
    assert_eq!(
        got,
        vec![("msg-1".to_string(), Bytes::from_static(b"first")), ("msg-2".to_string(), Bytes::from_static(b"second")),]
    );
}

#[tokio::test]
async fn the_pull_ack_loop_delivers_every_message_once_and_empties_the_buffer() {
    let Some(server) = server("pull/ack") else {
        return;
    };
    let js = isb::connect(server.url()).await.expect("connect");
    let name = "default-p1-in-out-pull";
    let consumer = isb::create_buffer(&js, name).await.expect("create buffer");
    // More than one read batch (500), fewer than max_ack_pending.
    const N: usize = 1_234;

    let publish = {
        let js = js.clone();
        async move {
            let mut publisher = isb::WindowedPublisher::new(js, name, 100);
            for i in 0..N {
                publisher.publish(&format!("id-{i}"), Bytes::from(format!("payload-{i}"))).await?;
            }
            publisher.flush().await?;
            anyhow::Ok((publisher.acked(), publisher.duplicates()))
        }
    };
    let read = async move {
        let mut reader = isb::BatchReader::new(consumer);
        let mut seen = BTreeSet::new();
        for _ in 0..N {
            let msg = reader.next().await?;
            let id = isb::message_id(&msg).ok_or_else(|| anyhow::anyhow!("a message without Nats-Msg-Id"))?.to_string();
            let i: usize = id
                .strip_prefix("id-")
                .and_then(|i| i.parse().ok())
                .ok_or_else(|| anyhow::anyhow!("unexpected id {id}"))?;
            anyhow::ensure!(msg.payload == format!("payload-{i}").as_bytes(), "payload of {id}");
            anyhow::ensure!(seen.insert(i), "{id} delivered twice");
            isb::ack(&msg).await?;
        }
        anyhow::Ok(seen)
    };
    let (published, seen) = tokio::time::timeout(DEADLINE, async { tokio::join!(publish, read) })
        .await
        .expect("publish and read within the deadline");
    let (acked, duplicates) = published.expect("publish");
    assert_eq!(acked, N as u64);
    assert_eq!(duplicates, 0);
    let seen = seen.expect("read");
    assert_eq!(seen, (0..N).collect::<BTreeSet<_>>(), "every message, once");

    // Interest retention: once every message is acked the stream is empty and nothing is pending.
    let mut stream = js.get_stream(name).await.expect("stream");
    let mut consumer =
        stream.get_consumer::<async_nats::jetstream::consumer::pull::Config>(name).await.expect("consumer");
    let deadline = Instant::now() + DEADLINE;
    loop {
        let messages = stream.info().await.expect("stream info").state.messages;
        let info = consumer.info().await.expect("consumer info");
        if messages == 0 && info.num_ack_pending == 0 && info.num_pending == 0 {
            assert_eq!(info.delivered.stream_sequence, N as u64);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "after all acks the stream still holds {messages} messages, consumer: {} ack \
             pending, {} pending",
            info.num_ack_pending,
            info.num_pending
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_batch_of_large_messages_stays_under_the_servers_slow_consumer_limit() {
    let Some(server) = server("large batch") else {
        return;
    };
    let js = isb::connect(server.url()).await.expect("connect");
    let name = "default-p1-in-out-large";
    let consumer = isb::create_buffer(&js, name).await.expect("create buffer");
    // 24 x 4 MiB = 96 MiB waiting: one uncapped batch of them would exceed the server's 64 MB
    // max_pending towards the reader, which then loses them until ack_wait (60 s).
    const N: usize = 24;
    let payload = Bytes::from(vec![7u8; 4 * 1024 * 1024]);
    let mut publisher = isb::WindowedPublisher::new(js.clone(), name, 8);
    for i in 0..N {
        publisher.publish(&format!("big-{i}"), payload.clone()).await.expect("publish");
    }
    publisher.flush().await.expect("acks");
    let mut reader = isb::BatchReader::new(consumer);
    for i in 0..N {
        let msg = tokio::time::timeout(DEADLINE, reader.next())
            .await
            .unwrap_or_else(|_| panic!("message {i} within the deadline"))
            .expect("pull");
        assert_eq!(isb::message_id(&msg), Some(format!("big-{i}").as_str()), "in order, none lost");
        assert_eq!(msg.payload.len(), payload.len());
        isb::ack(&msg).await.expect("ack");
    }
    assert!(!server.log_tail().contains("Slow Consumer"), "the server saw a slow consumer:\n{}", server.log_tail());
}

#[tokio::test]
async fn a_4_mib_message_fits_the_raised_max_payload() {
    let Some(server) = server("max_payload") else {
        return;
    };
    let js = isb::connect(server.url()).await.expect("connect");
    assert_eq!(js.client().server_info().max_payload, isb::MAX_PAYLOAD, "the server announces the raised max_payload");
    let name = "default-p1-in-out-big";
    let consumer = isb::create_buffer(&js, name).await.expect("create buffer");
    let payload = Bytes::from((0..4 * 1024 * 1024).map(|i| (i % 251) as u8).collect::<Vec<u8>>());
    let mut publisher = isb::WindowedPublisher::new(js.clone(), name, 1);
    publisher.publish("big", payload.clone()).await.expect("publish 4 MiB");
    publisher.flush().await.expect("ack");
    let mut reader = isb::BatchReader::new(consumer);
    let msg = tokio::time::timeout(DEADLINE, reader.next()).await.expect("within the deadline").expect("pull");
    assert_eq!(isb::message_id(&msg), Some("big"));
    assert!(msg.payload == payload, "the 4 MiB payload arrives intact");
    isb::ack(&msg).await.expect("ack");
}
