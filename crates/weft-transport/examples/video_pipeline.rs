//! The seed's pipeline shape on one machine: `in → filter-resize → inference → out`, every edge a
//! direct weft-transport edge over TCP on loopback, every stage a [`Receiver`] with a handler
//! and a [`Sender`] to the next stage.
//!
//! ```text
//! cargo run --release -p weft-transport --example video_pipeline [-- --frames 2000]
//! ```
//!
//! - `in` makes synthetic 416×416×3 frames (the demo's video frames) with an event time and a
//!   watermark, and sends them to the two `filter-resize` replicas (round robin).
//! - `filter-resize` smooths and halves each frame (2×2 box filter → 208×208×3) and forwards
//!   it, same id, to `inference`; it acknowledges upstream only after `inference` acknowledged.
//! - `inference` stands in for a model that runs on batches, as a GPU model does: it reads with
//!   a [`PullReceiver`] (up to 8 frames per fetch), computes per-channel means and the brightest
//!   cell of a 13×13 grid (YOLO's grid on 416 pixels) for the whole batch at once, sends each
//!   result on, and acknowledges each input once `out` acknowledged its result.
//! - `out` counts results and keeps the end-to-end latency.
//!
//! In a cluster each stage runs in its own pod: the receiver from `Receiver::from_env` (the
//! second NIC's address in `WEFT_TRANSPORT_LISTEN`), the sender from
//! `DnsPeers::targets_from_env` (the vertex domains in `VERTEX_DOMAIN_TARGETS`). Here the peers
//! are the loopback addresses of the stages.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use weft_transport::{Message, PullReceiver, Receiver, ReceiverConfig, Sender, SenderConfig, StaticPeers, TcpBackend};

/// The largest batch `inference` takes at once.
const BATCH: usize = 8;

const WIDTH: usize = 416;
const HEIGHT: usize = 416;
const CHANNELS: usize = 3;
const FRAME_BYTES: usize = WIDTH * HEIGHT * CHANNELS;

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// A synthetic frame: a moving gradient, so every frame differs.
fn synthetic_frame(n: usize) -> Bytes {
    let mut f = vec![0u8; FRAME_BYTES];
    for y in 0..HEIGHT {
        for x in 0..WIDTH {
            let p = (y * WIDTH + x) * CHANNELS;
            f[p] = (x + n) as u8;
            f[p + 1] = (y + 2 * n) as u8;
            f[p + 2] = ((x ^ y) + n) as u8;
        }
    }
    Bytes::from(f)
}

/// 2×2 box filter: smooths and halves a `w`×`h`×3 frame.
fn filter_resize(frame: &[u8], w: usize, h: usize) -> Vec<u8> {
    let (ow, oh) = (w / 2, h / 2);
    let mut out = vec![0u8; ow * oh * CHANNELS];
    for y in 0..oh {
        for x in 0..ow {
            for c in 0..CHANNELS {
                let at = |dx: usize, dy: usize| u32::from(frame[((2 * y + dy) * w + 2 * x + dx) * CHANNELS + c]);
                let sum = at(0, 0) + at(1, 0) + at(0, 1) + at(1, 1);
                out[(y * ow + x) * CHANNELS + c] = (sum / 4) as u8;
            }
        }
    }
    out
}

/// The stand-in model: channel means and the brightest cell of a 13×13 grid.
fn infer(frame: &[u8], w: usize, h: usize) -> String {
    const GRID: usize = 13;
    let mut means = [0u64; CHANNELS];
    let mut cells = vec![0u64; GRID * GRID];
    for y in 0..h {
        for x in 0..w {
            let p = (y * w + x) * CHANNELS;
            let mut lum = 0u64;
            for (c, m) in means.iter_mut().enumerate() {
                *m += u64::from(frame[p + c]);
                lum += u64::from(frame[p + c]);
            }
            cells[(y * GRID / h) * GRID + x * GRID / w] += lum;
        }
    }
    let px = (w * h) as u64;
    let (best, _) = cells.iter().enumerate().max_by_key(|(_, v)| **v).unwrap_or((0, &0));
    format!(
        "mean rgb {} {} {}; brightest cell ({}, {})",
        means[0] / px,
        means[1] / px,
        means[2] / px,
        best % GRID,
        best / GRID
    )
}

/// Forwards `derived` (the next stage's payload) under the input's id, keys, event time and
/// watermark, and waits for the next stage's ack: the caller acknowledges upstream after that.
async fn forward(to: &Sender, input: &Message, payload: Bytes) -> Result<(), String> {
    let mut next = input.clone();
    next.payload = payload;
    to.send(next).await.map_err(|e| e.to_string())?.acked().await.map_err(|e| e.to_string())?;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut frames = 1000usize;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--frames" => {
                frames = args.next().ok_or("--frames needs a number")?.parse().map_err(|e| format!("--frames: {e}"))?;
            }
            other => return Err(format!("unknown argument {other}; usage: [--frames N]").into()),
        }
    }
    let tcp = TcpBackend::default();
    let local = "127.0.0.1:0".parse()?;
    let config = ReceiverConfig { concurrency: 4, ..ReceiverConfig::default() };

    // out
    let out_count = Arc::new(AtomicU64::new(0));
    let latency_ms_sum = Arc::new(AtomicU64::new(0));
    let out = {
        let (count, lat) = (out_count.clone(), latency_ms_sum.clone());
        Receiver::bind(&tcp, local, config.clone(), move |m: Message| {
            let (count, lat) = (count.clone(), lat.clone());
            async move {
                count.fetch_add(1, Ordering::Relaxed);
                lat.fetch_add((now_ms() - m.event_time).max(0) as u64, Ordering::Relaxed);
                Ok::<(), String>(())
            }
        })
        .await?
    };

    // inference: batches
    let inference_count = Arc::new(AtomicU64::new(0));
    let batches = Arc::new(AtomicU64::new(0));
    let to_out = Sender::new(tcp.clone(), StaticPeers::new([out.local_addr()]), SenderConfig::default());
    // Read-ahead of two batches, so the next one fills while one is inferred.
    let inference =
        Arc::new(PullReceiver::bind(&tcp, local, ReceiverConfig { concurrency: 2 * BATCH, ..config.clone() }).await?);
    let inference_addr = inference.receiver().local_addr();
    {
        let (reader, count, batches) = (inference.clone(), inference_count.clone(), batches.clone());
        tokio::spawn(async move {
            loop {
                let batch = reader.fetch(BATCH, Duration::from_millis(100)).await;
                if batch.is_empty() {
                    continue;
                }
                batches.fetch_add(1, Ordering::Relaxed);
                let inputs: Vec<Bytes> = batch.iter().map(|f| f.message.payload.clone()).collect();
                let results = tokio::task::spawn_blocking(move || {
                    inputs.iter().map(|p| infer(p, WIDTH / 2, HEIGHT / 2)).collect::<Vec<_>>()
                })
                .await;
                let Ok(results) = results else {
                    for f in &batch {
                        let _ = reader.nack(f.offset, "inference failed");
                    }
                    continue;
                };
                // Send every result, then wait for all of out's acks together.
                let sends = batch.iter().zip(results).map(|(f, r)| forward(&to_out, &f.message, Bytes::from(r)));
                for (f, sent) in batch.iter().zip(futures::future::join_all(sends).await) {
                    let settled = match sent {
                        Ok(()) => reader.ack(f.offset),
                        Err(why) => reader.nack(f.offset, &why),
                    };
                    if settled.is_ok() {
                        count.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        });
    }

    // filter-resize, two replicas
    let resize_counts: Vec<Arc<AtomicU64>> = (0..2).map(|_| Arc::new(AtomicU64::new(0))).collect();
    let mut resizers = Vec::new();
    for count in &resize_counts {
        let to_inference = Sender::new(tcp.clone(), StaticPeers::new([inference_addr]), SenderConfig::default());
        let count = count.clone();
        resizers.push(
            Receiver::bind(&tcp, local, config.clone(), move |m: Message| {
                let (count, to_inference) = (count.clone(), to_inference.clone());
                async move {
                    let small = tokio::task::spawn_blocking({
                        let payload = m.payload.clone();
                        move || filter_resize(&payload, WIDTH, HEIGHT)
                    })
                    .await
                    .map_err(|e| e.to_string())?;
                    forward(&to_inference, &m, Bytes::from(small)).await?;
                    count.fetch_add(1, Ordering::Relaxed);
                    Ok::<(), String>(())
                }
            })
            .await?,
        );
    }

    // in
    let source =
        Sender::new(tcp.clone(), StaticPeers::new(resizers.iter().map(Receiver::local_addr)), SenderConfig::default());
    source.wait_for_links(resizers.len()).await;
    // A few distinct frames, reused: making frames is not what is measured.
    let samples: Vec<Bytes> = (0..8).map(synthetic_frame).collect();
    let start = Instant::now();
    let mut acks = Vec::with_capacity(frames);
    for n in 0..frames {
        let t = now_ms();
        let mut m = Message::new(format!("in-{n}-0"), samples[n % samples.len()].clone());
        m.keys = vec![format!("camera-{}", n % 4)];
        m.event_time = t;
        m.watermark = t - 1;
        acks.push(source.send(m).await?);
    }
    for a in acks {
        a.acked().await?;
    }
    let elapsed = start.elapsed();
    // The source is done: its watermark moves on with no data, and so does the next stage's.
    source.set_watermark(now_ms());

    let secs = elapsed.as_secs_f64();
    println!("frames: {frames} of {FRAME_BYTES} bytes (416x416x3) in {secs:.2} s");
    println!(
        "throughput: {:.1} frames/s, {:.1} MB/s into filter-resize",
        frames as f64 / secs,
        (frames * FRAME_BYTES) as f64 / secs / 1e6
    );
    println!(
        "per stage: filter-resize {:?}, inference {} in {} batches (at most {BATCH}), out {}",
        resize_counts.iter().map(|c| c.load(Ordering::Relaxed)).collect::<Vec<_>>(),
        inference_count.load(Ordering::Relaxed),
        batches.load(Ordering::Relaxed),
        out_count.load(Ordering::Relaxed)
    );
    println!(
        "mean end-to-end latency: {:.1} ms (queueing included: every frame is sent at once)",
        latency_ms_sum.load(Ordering::Relaxed) as f64 / frames.max(1) as f64
    );
    let mut wm = resizers[0].watch_watermark();
    let _ = tokio::time::timeout(Duration::from_secs(5), wm.wait_for(|w| *w >= 0)).await;
    println!("filter-resize input watermarks (ms): {:?}", resizers.iter().map(Receiver::watermark).collect::<Vec<_>>());
    println!("inference on frame 0: {}", infer(&filter_resize(&samples[0], WIDTH, HEIGHT), WIDTH / 2, HEIGHT / 2));
    Ok(())
}
