//! A receiver killed mid-stream (SIGKILL of a real process): nothing is lost and the handler at
//! the next hop sees every message exactly once.
//!
//! The chain is sender → {R1, R2} → sink S. R1 and R2 are relays in child processes (this test
//! binary started again as `relay_child`); each acknowledges a message only after S
//! acknowledged its forwarded copy (same id). S's handler records every call.
//!
//! What exactly-once means here: delivery to a handler is at-least-once. R1 may have run its
//! handler — forwarded a message to S — and be killed before its ack reached the sender; the
//! sender then resends the message to R2, which forwards it again. S drops that second copy by
//! its id (if S already finished the first copy it acks at once; if the first copy is still in
//! S's handler, the second waits for its outcome). So the *output* of the edge is exactly-once,
//! as it is for Numaflow, where JetStream drops the second publish by its `Nats-Msg-Id`.
//!
//! To make sure the kill hits messages in flight, S's handler stops (a gate) after 100
//! messages; R1 then holds forwarded, unacknowledged messages when it is killed, and the sender
//! must resend them.

mod support;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use support::{Recorder, guard, loopback, msg, wait_until};
use tokio::sync::watch;
use weft_transport::{
    Backoff, Message, Receiver, ReceiverConfig, Selection, Sender, SenderConfig, Sent, StaticPeers, TcpBackend,
};

const SINK_ENV: &str = "WEFT_TEST_RELAY_SINK";
const TOTAL: usize = 400;
const GATE_AFTER: usize = 100;

fn fast(identity: &str) -> SenderConfig {
    SenderConfig {
        identity: identity.to_string(),
        backoff: Backoff { initial: Duration::from_millis(5), max: Duration::from_millis(100), jitter: 0.5 },
        min_resolve_interval: Duration::from_millis(10),
        redeliver_delay: Duration::from_millis(1),
        ..SenderConfig::default()
    }
}

/// The relay process `receiver_killed_mid_stream` starts; it does nothing unless started so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the child process of receiver_killed_mid_stream, started by it with its environment"]
async fn relay_child() {
    let Ok(sink) = std::env::var(SINK_ENV) else {
        return;
    };
    let sink: SocketAddr = sink.parse().expect("sink address");
    let forward =
        Sender::new(TcpBackend::default(), StaticPeers::new([sink]), fast(&format!("relay-{}", std::process::id())));
    let receiver = Receiver::bind(&TcpBackend::default(), loopback(), ReceiverConfig::default(), move |m: Message| {
        let forward = forward.clone();
        async move {
            // Acknowledge upstream only after the next hop acknowledged.
            forward.send(m).await.map_err(|e| e.to_string())?.acked().await.map_err(|e| e.to_string())?;
            Ok::<(), String>(())
        }
    })
    .await
    .expect("bind relay");
    println!("LISTEN {}", receiver.local_addr());
    std::future::pending::<()>().await;
}

/// A child process killed and reaped when dropped (also when the test fails).
struct Relay {
    child: Child,
    addr: SocketAddr,
}

impl Relay {
    fn start(sink: SocketAddr) -> Self {
        let exe = std::env::current_exe().expect("test binary");
        let mut child = Command::new(exe)
            .args(["relay_child", "--exact", "--ignored", "--nocapture"])
            .env(SINK_ENV, sink.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start relay");
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = BufReader::new(stdout).lines();
        let addr = loop {
            let line = lines.next().expect("relay exited before listening").expect("read relay output");
            if let Some(addr) = line.strip_prefix("LISTEN ") {
                break addr.parse().expect("relay address");
            }
        };
        // Keep draining its output so it never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        Self { child, addr }
    }

    fn kill(&mut self) {
        // std's kill is SIGKILL on Unix.
        self.child.kill().expect("kill relay");
        self.child.wait().expect("reap relay");
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receiver_killed_mid_stream_loses_nothing_and_the_sink_sees_each_id_once() {
    let (gate, _) = watch::channel(false);
    let gate = Arc::new(gate);
    let sink_rec = Recorder::default();
    let sink = {
        let (rec, gate) = (sink_rec.clone(), gate.clone());
        Receiver::bind(
            &TcpBackend::default(),
            loopback(),
            ReceiverConfig { concurrency: 16, ..ReceiverConfig::default() },
            move |m: Message| {
                let (rec, gate) = (rec.clone(), gate.clone());
                async move {
                    rec.record(m);
                    if rec.calls() > GATE_AFTER {
                        let mut open = gate.subscribe();
                        let _ = open.wait_for(|o| *o).await;
                    }
                    Ok::<(), String>(())
                }
            },
        )
        .await
        .expect("bind sink")
    };
    let mut r1 = Relay::start(sink.local_addr());
    let r2 = Relay::start(sink.local_addr());
    let sender = Sender::new(
        TcpBackend::default(),
        StaticPeers::new([r1.addr, r2.addr]),
        SenderConfig { selection: Selection::RoundRobin, ..fast("source") },
    );
    guard("links to both relays", sender.wait_for_links(2)).await;

    let mut handles = Vec::new();
    for i in 0..TOTAL {
        match sender.send(msg(format!("in-{i}-0"), 1024)).await.expect("send") {
            Sent::Queued(h) => handles.push(h),
            Sent::Dropped => panic!("dropped under RetryUntilSuccess"),
        }
    }
    // The sink is gated; R1 holds messages it forwarded and cannot acknowledge.
    wait_until("the sink gated with R1 holding messages", || {
        sink_rec.calls() > GATE_AFTER && sender.stats().links.iter().any(|l| l.peer == r1.addr && l.outstanding > 0)
    })
    .await;
    let held_by_r1 = sender.stats().links.iter().find(|l| l.peer == r1.addr).map_or(0, |l| l.outstanding);
    r1.kill();
    gate.send_replace(true);

    for h in handles {
        guard("every message acknowledged", h).await.expect("acked");
    }
    let counts = sink_rec.counts();
    assert_eq!(counts.len(), TOTAL, "every id reached the sink");
    let repeated: Vec<_> = counts.iter().filter(|(_, n)| **n != 1).collect();
    assert!(repeated.is_empty(), "ids handled more than once: {repeated:?}");
    let stats = sender.stats();
    assert!(
        stats.resent >= 1,
        "the kill hit messages in flight ({held_by_r1} held by R1), which were resent: {stats:?}"
    );
    assert_eq!(stats.acked as usize, TOTAL);
    eprintln!(
        "R1 held {held_by_r1} when killed; sender resent {}, sink dropped {} duplicates",
        stats.resent,
        sink.stats().duplicates
    );
    drop(r2);
}
