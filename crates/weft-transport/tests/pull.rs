//! The batch-reading receiver over real TCP on loopback: fetch, ack, nack, the ack wait, close.

mod support;

use std::time::Duration;

use support::{Recorder, fast_config, guard, loopback, msg, recording_receiver, wait_until};
use weft_transport::{PullError, PullReceiver, ReceiverConfig, Sender, Sent, StaticPeers, TcpBackend};

async fn pull(config: ReceiverConfig) -> PullReceiver {
    PullReceiver::bind(&TcpBackend::default(), loopback(), config).await.expect("bind")
}

async fn send_all(sender: &Sender, ids: impl IntoIterator<Item = String>) -> Vec<Sent> {
    let mut sent = Vec::new();
    for id in ids {
        sent.push(sender.send(msg(id, 64)).await.expect("send"));
    }
    sent
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetch_takes_what_is_waiting_up_to_max_and_acks_reach_the_sender() {
    let reader = pull(ReceiverConfig { concurrency: 16, ..ReceiverConfig::default() }).await;
    let sender = Sender::new(TcpBackend::default(), StaticPeers::new([reader.receiver().local_addr()]), fast_config());
    let sent = send_all(&sender, (0..10).map(|i| format!("m{i}"))).await;
    wait_until("all ten waiting", || reader.pending() == 10).await;

    let first = reader.fetch(4, Duration::from_secs(60)).await;
    assert_eq!(first.len(), 4, "a batch of max when that many wait");
    assert_eq!((reader.pending(), reader.in_flight()), (6, 4));
    let rest = reader.fetch(100, Duration::from_secs(60)).await;
    assert_eq!(rest.len(), 6, "what waits, without waiting for more");
    let mut ids: Vec<_> = first.iter().chain(&rest).map(|f| f.message.clone()).collect();
    ids.sort_by(|a, b| a.id.cmp(&b.id));
    let mut want: Vec<_> = (0..10).map(|i| msg(format!("m{i}"), 64)).collect();
    want.sort_by(|a, b| a.id.cmp(&b.id));
    assert_eq!(ids, want, "each message whole, once");
    let offsets: std::collections::HashSet<_> = first.iter().chain(&rest).map(|f| f.offset).collect();
    assert_eq!(offsets.len(), 10, "offsets are unique");

    assert_eq!(sender.stats().acked, 0, "nothing acknowledged before the caller acks");
    for f in first.iter().chain(&rest) {
        reader.ack(f.offset).expect("ack");
    }
    for s in sent {
        assert!(guard("ack", s.acked()).await.expect("acked"));
    }
    assert_eq!(reader.ack(first[0].offset), Err(PullError::Unknown(first[0].offset)), "acked once only");
    assert_eq!(reader.ack(9999), Err(PullError::Unknown(9999)));
    assert_eq!(reader.in_flight(), 0);
    assert_eq!(reader.receiver().stats().handled, 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetch_with_nothing_waiting_is_empty() {
    let reader = pull(ReceiverConfig::default()).await;
    assert!(reader.fetch(8, Duration::from_millis(20)).await.is_empty());
    assert!(reader.fetch(0, Duration::from_secs(60)).await.is_empty(), "max 0 takes nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nacked_message_comes_back_under_a_new_offset() {
    let reader = pull(ReceiverConfig::default()).await;
    let sender = Sender::new(TcpBackend::default(), StaticPeers::new([reader.receiver().local_addr()]), fast_config());
    let sent = sender.send(msg("again", 64)).await.expect("send");
    let first = guard("first delivery", reader.fetch(1, Duration::from_secs(60))).await;
    assert_eq!(first.len(), 1);
    reader.nack(first[0].offset, "GPU busy").expect("nack");
    let second = guard("redelivery", reader.fetch(1, Duration::from_secs(60))).await;
    assert_eq!(second.len(), 1);
    assert_eq!(second[0].message.id, "again");
    assert_ne!(second[0].offset, first[0].offset);
    reader.ack(second[0].offset).expect("ack");
    assert!(guard("ack", sent.acked()).await.expect("acked"));
    assert_eq!(sender.stats().nacked, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_held_past_the_ack_wait_is_delivered_again_and_a_late_ack_says_so() {
    let config = ReceiverConfig { handler_timeout: Some(Duration::from_millis(100)), ..ReceiverConfig::default() };
    let reader = pull(config).await;
    let sender = Sender::new(TcpBackend::default(), StaticPeers::new([reader.receiver().local_addr()]), fast_config());
    let sent = sender.send(msg("slow", 64)).await.expect("send");
    let held = guard("delivery", reader.fetch(1, Duration::from_secs(60))).await;
    // Not acked: the wait runs out, the message is nacked and comes back.
    let again = guard("redelivery", async {
        loop {
            let batch = reader.fetch(1, Duration::from_secs(60)).await;
            if !batch.is_empty() {
                return batch;
            }
        }
    })
    .await;
    assert_eq!(again[0].message.id, "slow");
    assert_eq!(reader.ack(held[0].offset), Err(PullError::Expired(held[0].offset)));
    reader.ack(again[0].offset).expect("ack");
    assert!(guard("ack", sent.acked()).await.expect("acked"));
    assert_eq!(reader.receiver().stats().timed_out, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_gives_back_what_was_not_acked_and_nothing_runs_twice() {
    let reader = pull(ReceiverConfig { concurrency: 16, ..ReceiverConfig::default() }).await;
    let rec = Recorder::default();
    let other = recording_receiver(&rec).await;
    let sender = Sender::new(
        TcpBackend::default(),
        StaticPeers::new([reader.receiver().local_addr(), other.local_addr()]),
        fast_config(),
    );
    guard("two links", sender.wait_for_links(2)).await;
    let sent = send_all(&sender, (0..20).map(|i| format!("m{i}"))).await;
    wait_until("some waiting at the pull receiver", || reader.pending() >= 4).await;
    let batch = reader.fetch(4, Duration::from_secs(60)).await;
    assert_eq!(batch.len(), 4);
    // Two acked, two left unsettled, the rest never fetched.
    reader.ack(batch[0].offset).expect("ack");
    reader.ack(batch[1].offset).expect("ack");
    let acked: Vec<String> = batch[..2].iter().map(|f| f.message.id.clone()).collect();
    guard("close", reader.close()).await;
    for s in sent {
        assert!(guard("ack", s.acked()).await.expect("acked"));
    }
    for id in &acked {
        assert_eq!(rec.count(id), 0, "{id} was acked at the pull receiver and not delivered again");
    }
    assert_eq!(rec.distinct() + acked.len(), 20, "everything else went to the other receiver");
    assert!(rec.counts().values().all(|n| *n == 1));
}
