//! The side-by-side transport benchmark (issue #16): on loopback, in one run, for each message
//! size, the memcpy and raw-socket limits, the ISB path through a real JetStream, and weft's own
//! backends; then latency at half load, and the issue's targets as met / not met.
//!
//! ```text
//! cargo bench -p weft-transport --bench transport
//! cargo bench -p weft-transport --bench transport -- --sizes 1k,64k,512k,4m --seconds 2 \
//!     --paths memcpy,raw,jetstream,tcp,shm
//! cargo bench -p weft-transport --bench transport -- --quick      # a smoke run, no measurement
//! ```
//!
//! Run any other way than by `cargo bench` (which passes `--bench`), e.g. `cargo test --benches`,
//! it does a quick smoke run. Output is markdown on stdout; progress goes to stderr.
//! The JetStream path needs `nats-server` (Debian: `apt-get install -y nats-server`); without it
//! the path is reported as not available, a skip through `weft_testkit::require` (so a failure
//! under `WEFT_TEST_REQUIRE_ALL=1`).

#[path = "transport/harness.rs"]
mod harness;
// Shared with tests/isb_jetstream.rs; each uses part of it.
#[allow(dead_code)]
#[path = "common/isb.rs"]
mod isb;
#[path = "transport/jetstream.rs"]
mod jetstream;
#[path = "transport/raw.rs"]
mod raw;
#[path = "transport/weft.rs"]
mod weft;

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::process::ExitCode;
use std::rc::Rc;
use std::time::Duration;

use clap::{Parser, ValueEnum};

use harness::{Latency, Link, Pauses, Throughput};

/// One 416×416×3 video frame: what the issue calls 512 KiB, measured at exactly this size.
const FRAME: usize = 416 * 416 * 3;
const KIB: usize = 1024;
const MIB: usize = 1024 * 1024;

#[derive(Parser, Debug)]
#[command(
    name = "transport",
    about = "weft-transport side by side with the ISB (JetStream) and the raw limits, on loopback"
)]
struct Opts {
    /// Message sizes: a number of bytes with an optional k/m (KiB/MiB) suffix; `512k` and `frame`
    /// mean one 416x416x3 video frame (519168 B).
    #[arg(long, value_delimiter = ',', value_parser = parse_size, default_value = "1k,64k,512k,4m")]
    sizes: Vec<usize>,
    /// Seconds per throughput point (default 2; 0.2 with --quick).
    #[arg(long)]
    seconds: Option<f64>,
    /// Rounds of throughput runs; each point reports the median (default 3; 1 with --quick).
    #[arg(long)]
    repeat: Option<usize>,
    /// Seconds of the half-load latency run (default: --seconds).
    #[arg(long)]
    latency_seconds: Option<f64>,
    /// Paths to run.
    #[arg(long, value_delimiter = ',', default_value = "memcpy,raw,jetstream,tcp-frames,tcp,shm-frames,shm")]
    paths: Vec<PathName>,
    /// Size of the latency run, sent at half its measured maximum rate.
    #[arg(long, value_parser = parse_size, default_value = "4k")]
    latency_size: usize,
    /// The latency run's load: this fraction of the path's measured maximum msg/s (the issue's
    /// target is at half load).
    #[arg(long, default_value_t = 0.5)]
    latency_load: f64,
    /// Skip the latency runs.
    #[arg(long)]
    no_latency: bool,
    /// JetStream: publishes awaiting their ack at once.
    #[arg(long, default_value_t = 500)]
    js_window: usize,
    /// A smoke run: short durations, the results are not measurements.
    #[arg(long)]
    quick: bool,
    /// Passed by `cargo bench`; without it the run is a quick smoke run.
    #[arg(long, hide = true)]
    bench: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, ValueEnum)]
pub(crate) enum PathName {
    Memcpy,
    Raw,
    Jetstream,
    TcpFrames,
    Tcp,
    ShmFrames,
    Shm,
}

impl PathName {
    fn label(self) -> &'static str {
        match self {
            PathName::Memcpy => "memcpy (limit)",
            PathName::Raw => "raw TCP socket (limit)",
            PathName::Jetstream => "ISB: JetStream",
            PathName::TcpFrames => "weft TCP, frames only",
            PathName::Tcp => "weft direct TCP",
            PathName::ShmFrames => "weft shm, frames only",
            PathName::Shm => "weft shared memory",
        }
    }
}

fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim().to_ascii_lowercase();
    if t == "512k" || t == "frame" {
        return Ok(FRAME);
    }
    let (num, mult) = if let Some(n) = t.strip_suffix("kib").or_else(|| t.strip_suffix('k')) {
        (n, KIB)
    } else if let Some(n) = t.strip_suffix("mib").or_else(|| t.strip_suffix('m')) {
        (n, MIB)
    } else {
        (t.as_str(), 1)
    };
    let n: usize = num.parse().map_err(|_| format!("size {s:?}: expected bytes with an optional k or m suffix"))?;
    let size = n.checked_mul(mult).ok_or_else(|| format!("size {s:?} is too large"))?;
    if !(16..=64 * MIB).contains(&size) {
        return Err(format!("size {s:?}: must be 16 B to 64 MiB"));
    }
    Ok(size)
}

fn size_label(size: usize) -> String {
    match size {
        FRAME => "512 KiB frame".to_string(),
        s if s % MIB == 0 => format!("{} MiB", s / MIB),
        s if s % KIB == 0 => format!("{} KiB", s / KIB),
        s => format!("{s} B"),
    }
}

enum Outcome<T> {
    Measured(T),
    Unavailable(String),
    Failed(String),
}

/// The runs of one (path, size) point.
struct Samples {
    runs: Vec<Throughput>,
}

impl Samples {
    /// The median run by throughput (the lower middle one of an even count).
    fn median(&self) -> Throughput {
        let mut runs = self.runs.clone();
        runs.sort_by(|a, b| a.bytes_per_s().total_cmp(&b.bytes_per_s()));
        runs[(runs.len() - 1) / 2]
    }
    fn min_max(&self) -> (f64, f64) {
        self.runs.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), t| (lo.min(t.bytes_per_s()), hi.max(t.bytes_per_s())))
    }
}

struct LatencyRow {
    /// The maximum rate measured for the latency size (the "full load"): the median run.
    max_rate: f64,
    latency: Latency,
}

type ThroughputFn<'a> = Box<dyn FnMut(usize, Duration) -> anyhow::Result<Throughput> + 'a>;
type LatencyFn<'a> = Box<dyn FnMut(usize, f64, Duration) -> anyhow::Result<Latency> + 'a>;

/// One path, ready to run, or why it cannot.
pub(crate) enum Entry<'a> {
    Ready { throughput: ThroughputFn<'a>, latency: Option<LatencyFn<'a>> },
    Unavailable(String),
    Failed(String),
}

impl<'a> Entry<'a> {
    /// A path over links that `make` builds, a fresh one for each run of the given message size.
    pub(crate) fn link<L: Link>(make: impl FnMut(usize) -> anyhow::Result<L> + 'a) -> Self {
        let make = Rc::new(RefCell::new(make));
        let make2 = Rc::clone(&make);
        Entry::Ready {
            throughput: Box::new(move |size, duration| {
                let link = (make.borrow_mut())(size)?;
                harness::throughput(&link, size, duration)
            }),
            latency: Some(Box::new(move |size, rate, duration| {
                let link = (make2.borrow_mut())(size)?;
                harness::latency(&link, size, rate, duration)
            })),
        }
    }
}

/// Runs the paths and keeps what they measured.
struct Runner {
    sizes: Vec<usize>,
    repeat: usize,
    duration: Duration,
    latency_duration: Duration,
    latency_size: Option<usize>,
    latency_load: f64,
    throughput: BTreeMap<(PathName, usize), Outcome<Samples>>,
    latency: BTreeMap<PathName, Outcome<LatencyRow>>,
    /// The machine's pauses, probed before the latency runs.
    pauses: Option<Pauses>,
    failed: bool,
}

/// Pauses longer than this count against the latency target.
const PAUSE_THRESHOLD: Duration = Duration::from_micros(100);

impl Runner {
    /// Throughput: `repeat` rounds; each round measures every size, and at each size every path
    /// one after the other, so the paths compared at a size ran close together in time (the
    /// load of a shared machine drifts). A point that failed once is not run again.
    fn run_throughput(&mut self, entries: &mut [(PathName, Entry<'_>)]) {
        let mut sizes = self.sizes.clone();
        if let Some(size) = self.latency_size
            && !sizes.contains(&size)
        {
            sizes.push(size);
            sizes.sort();
        }
        for round in 0..self.repeat {
            for &size in &sizes {
                for (path, entry) in entries.iter_mut() {
                    let path = *path;
                    match entry {
                        Entry::Ready { throughput, .. } => {
                            if matches!(self.throughput.get(&(path, size)), Some(Outcome::Failed(_))) {
                                continue;
                            }
                            let outcome = throughput(size, self.duration);
                            self.record(path, size, round, outcome);
                        }
                        Entry::Unavailable(why) => {
                            self.throughput.insert((path, size), Outcome::Unavailable(why.clone()));
                        }
                        Entry::Failed(why) => {
                            self.failed = true;
                            self.throughput.insert((path, size), Outcome::Failed(why.clone()));
                        }
                    }
                }
            }
        }
    }

    /// Latency: each path at `latency_load` of its own median maximum msg/s at the latency size.
    fn run_latency(&mut self, entries: &mut [(PathName, Entry<'_>)]) {
        let Some(size) = self.latency_size else {
            return;
        };
        // Two threads, as a path's sender and receiver.
        let probe = harness::pauses(2, self.latency_duration.min(Duration::from_secs(5)), PAUSE_THRESHOLD);
        eprintln!(
            "machine pauses over {} us: {:.2} % of each core's time, {} pauses, longest {:.1} ms",
            PAUSE_THRESHOLD.as_micros(),
            100.0 * probe.fraction(),
            probe.count,
            probe.largest.as_secs_f64() * 1e3
        );
        self.pauses = Some(probe);
        for (path, entry) in entries.iter_mut() {
            let path = *path;
            let outcome = match entry {
                Entry::Ready { latency: None, .. } => continue,
                Entry::Ready { latency: Some(latency), .. } => {
                    let row = self.measured(path, size).map_err(anyhow::Error::msg).and_then(|max| {
                        let rate = max.msgs_per_s() * self.latency_load;
                        let latency = latency(size, rate, self.latency_duration)?;
                        Ok(LatencyRow { max_rate: max.msgs_per_s(), latency })
                    });
                    match row {
                        Ok(row) => {
                            eprintln!(
                                "{:<24} latency {} at {:.0} msg/s: p50 {:.1} us, p99 {:.1} us",
                                path.label(),
                                size_label(size),
                                row.latency.rate,
                                us(row.latency.hist.value_at_quantile(0.5)),
                                us(row.latency.hist.value_at_quantile(0.99)),
                            );
                            Outcome::Measured(row)
                        }
                        Err(e) => {
                            eprintln!("{:<24} latency FAILED: {e:#}", path.label());
                            self.failed = true;
                            Outcome::Failed(format!("{e:#}"))
                        }
                    }
                }
                Entry::Unavailable(why) => Outcome::Unavailable(why.clone()),
                Entry::Failed(why) => Outcome::Failed(why.clone()),
            };
            self.latency.insert(path, outcome);
        }
    }

    fn record(&mut self, path: PathName, size: usize, round: usize, outcome: anyhow::Result<Throughput>) {
        match outcome {
            Ok(t) => {
                eprintln!(
                    "{:<24} {:>14} (run {}): {:>10.1} MB/s {:>12.0} msg/s",
                    path.label(),
                    size_label(size),
                    round + 1,
                    t.bytes_per_s() / 1e6,
                    t.msgs_per_s()
                );
                match self.throughput.get_mut(&(path, size)) {
                    Some(Outcome::Measured(samples)) => samples.runs.push(t),
                    _ => {
                        self.throughput.insert((path, size), Outcome::Measured(Samples { runs: vec![t] }));
                    }
                }
            }
            Err(e) => {
                eprintln!("{:<24} {:>14}: FAILED: {e:#}", path.label(), size_label(size));
                self.failed = true;
                self.throughput.insert((path, size), Outcome::Failed(format!("{e:#}")));
            }
        }
    }

    /// The median run of a point, or why there is none.
    fn measured(&self, path: PathName, size: usize) -> Result<Throughput, String> {
        match self.throughput.get(&(path, size)) {
            Some(Outcome::Measured(s)) => Ok(s.median()),
            Some(Outcome::Unavailable(why)) => Err(format!("{} {why}", path.label())),
            Some(Outcome::Failed(_)) => Err(format!("{} failed", path.label())),
            None => Err(format!("{} was not run", path.label())),
        }
    }
}

fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

fn main() -> ExitCode {
    let opts = Opts::parse();
    let quick = opts.quick || !opts.bench;
    let seconds = opts.seconds.unwrap_or(if quick { 0.2 } else { 2.0 });
    let latency_seconds = opts.latency_seconds.unwrap_or(seconds);
    let repeat = opts.repeat.unwrap_or(if quick { 1 } else { 3 });
    if !(opts.latency_load > 0.0 && opts.latency_load <= 1.0) {
        eprintln!("--latency-load {}: must be a fraction in (0, 1]", opts.latency_load);
        return ExitCode::from(2);
    }
    if !(1..=100).contains(&repeat) {
        eprintln!("--repeat {repeat}: must be 1 to 100");
        return ExitCode::from(2);
    }
    for (name, s) in [("--seconds", seconds), ("--latency-seconds", latency_seconds)] {
        if !(s.is_finite() && s > 0.0 && s <= 3600.0) {
            eprintln!("{name} {s}: must be a positive number of seconds, at most 3600");
            return ExitCode::from(2);
        }
    }
    let mut paths = opts.paths.clone();
    paths.sort();
    paths.dedup();
    let mut sizes = opts.sizes.clone();
    sizes.sort();
    sizes.dedup();

    let mut runner = Runner {
        sizes,
        repeat,
        duration: Duration::from_secs_f64(seconds),
        latency_duration: Duration::from_secs_f64(latency_seconds),
        latency_size: (!opts.no_latency).then_some(opts.latency_size),
        latency_load: opts.latency_load,
        throughput: BTreeMap::new(),
        latency: BTreeMap::new(),
        pauses: None,
        failed: false,
    };

    // The JetStream server lives until the report is written.
    let mut nats_version = None;
    let nats = if paths.contains(&PathName::Jetstream) {
        match isb::find_nats_server() {
            None => {
                // A skip of the path through weft_testkit::require: a failure of the run under
                // WEFT_TEST_REQUIRE_ALL=1, else the path is reported as not available.
                weft_testkit::require(false, "nats-server (apt-get install -y nats-server, or set NATS_SERVER)");
                None
            }
            Some(bin) => {
                nats_version = Some(nats_server_version(&bin));
                Some(isb::NatsServer::start(&bin).map_err(|e| format!("nats-server failed to start: {e:#}")))
            }
        }
    } else {
        None
    };
    let nats_url = match &nats {
        Some(Ok(server)) => server.url().to_string(),
        _ => String::new(),
    };

    let mut entries: Vec<(PathName, Entry<'_>)> = Vec::new();
    for &path in &paths {
        let entry = match path {
            PathName::Memcpy => Entry::Ready {
                throughput: Box::new(|size, duration| Ok(harness::memcpy(size, duration))),
                latency: None,
            },
            PathName::Raw => Entry::link(|_| Ok(raw::RawTcp)),
            PathName::Jetstream => match &nats {
                Some(Ok(_)) => {
                    let (url, window) = (nats_url.as_str(), opts.js_window);
                    Entry::link(move |size| Ok(jetstream::JetStreamLink::new(url, size, window)))
                }
                Some(Err(why)) => Entry::Failed(why.clone()),
                None => Entry::Unavailable("not available: nats-server not found".to_string()),
            },
            PathName::TcpFrames => weft::tcp_frames(),
            PathName::Tcp => weft::tcp(),
            PathName::ShmFrames => weft::shm_frames(),
            PathName::Shm => weft::shm(),
        };
        if let Entry::Unavailable(why) | Entry::Failed(why) = &entry {
            eprintln!("{:<24} {why}", path.label());
        }
        entries.push((path, entry));
    }

    runner.run_throughput(&mut entries);
    runner.run_latency(&mut entries);
    drop(entries);

    if let Some(Ok(server)) = &nats {
        let js_failed =
            runner.throughput.iter().any(|((p, _), o)| *p == PathName::Jetstream && matches!(o, Outcome::Failed(_)))
                || matches!(runner.latency.get(&PathName::Jetstream), Some(Outcome::Failed(_)));
        if js_failed {
            eprintln!("nats-server log (tail):\n{}", server.log_tail());
        }
    }

    print!("{}", report(&runner, &opts, &paths, quick, seconds, latency_seconds, nats_version));
    if runner.failed { ExitCode::FAILURE } else { ExitCode::SUCCESS }
}

fn nats_server_version(bin: &std::path::Path) -> String {
    match std::process::Command::new(bin).arg("--version").output() {
        Ok(out) => {
            let v = String::from_utf8_lossy(&out.stdout).trim().to_string();
            format!("{v} ({})", bin.display())
        }
        Err(e) => format!("{} (--version failed: {e})", bin.display()),
    }
}

fn machine() -> String {
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, m)| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".to_string());
    format!("{cores} CPUs, {model}")
}

fn report(
    r: &Runner,
    opts: &Opts,
    paths: &[PathName],
    quick: bool,
    seconds: f64,
    latency_seconds: f64,
    nats_version: Option<String>,
) -> String {
    let mut o = String::new();
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    let _ = writeln!(o, "# weft-transport side by side (loopback)\n");
    let _ = writeln!(
        o,
        "- command: `cargo bench -p weft-transport --bench transport{}{}`",
        if args.is_empty() { "" } else { " -- " },
        args.join(" ")
    );
    let _ = writeln!(o, "- machine: {}", machine());
    if quick {
        let _ = writeln!(o, "- mode: QUICK SMOKE RUN ({seconds} s per point): the numbers below are not measurements");
    } else {
        let _ = writeln!(
            o,
            "- mode: {} rounds of {seconds} s per throughput point (paths interleaved at each \
             size), {latency_seconds} s per latency run; sender and receiver on one thread and \
             single-threaded tokio runtime each, so a broker competes with them for the cores",
            r.repeat
        );
    }
    let _ = writeln!(
        o,
        "- sizes: {} (512 KiB frame = 416x416x3 = {FRAME} B)",
        r.sizes.iter().map(|&s| format!("{} = {s} B", size_label(s))).collect::<Vec<_>>().join(", ")
    );
    if paths.contains(&PathName::Jetstream) {
        let _ = writeln!(
            o,
            "- ISB: {}; stream as Numaflow creates it (Interest retention, discard old, max_msgs \
             {}, max_age 168h, max_bytes -1, file storage, 1 replica, duplicate window 60s), \
             durable pull consumer (deliver all, explicit ack, ack_wait 60s, max_ack_pending {}); \
             publish with Nats-Msg-Id, {} publishes awaiting ack at most; writer stops at 80 % of \
             max_msgs unacked (and at {} MiB unacked); reads pull {} messages (at most {} MiB: a bigger batch overruns nats-server's \
             64 MB per-client max_pending, which drops the reader as a slow consumer) / {:?} \
             and ack each",
            nats_version.as_deref().unwrap_or("nats-server"),
            isb::MAX_MSGS,
            isb::MAX_ACK_PENDING,
            opts.js_window,
            jetstream::MAX_OUTSTANDING_BYTES / MIB,
            isb::READ_BATCH,
            isb::READ_MAX_BYTES / MIB,
            isb::READ_TIMEOUT,
        );
        let _ = writeln!(
            o,
            "- ISB max_payload: raised to {} MiB for this run; Numaflow's default is {} MiB, so \
             the 4 MiB messages would not fit an ISB as deployed",
            isb::MAX_PAYLOAD / MIB,
            isb::NUMAFLOW_DEFAULT_MAX_PAYLOAD / MIB
        );
    }

    let _ = writeln!(o, "\n## Throughput\n");
    let _ = writeln!(
        o,
        "Each point is the median of its runs; the last column is the range of MB/s over the runs \
         (and their count). \"vs raw\" compares medians.\n"
    );
    let _ = writeln!(o, "| size | path | MB/s | msg/s | vs raw | MB/s range (runs) |");
    let _ = writeln!(o, "| --- | --- | ---: | ---: | ---: | ---: |");
    let mut sizes: Vec<usize> = r.throughput.keys().map(|&(_, s)| s).collect();
    sizes.sort();
    sizes.dedup();
    for &size in &sizes {
        for &path in paths {
            let Some(outcome) = r.throughput.get(&(path, size)) else {
                continue;
            };
            let cells = match outcome {
                Outcome::Measured(samples) => {
                    let t = samples.median();
                    let vs_raw = match r.measured(PathName::Raw, size) {
                        Ok(raw) if path != PathName::Raw => {
                            format!("{:.0} %", 100.0 * t.bytes_per_s() / raw.bytes_per_s())
                        }
                        Ok(_) => "100 %".to_string(),
                        Err(_) => "-".to_string(),
                    };
                    let (lo, hi) = samples.min_max();
                    format!(
                        "{:.1} | {:.0} | {vs_raw} | {:.0}–{:.0} ({})",
                        t.bytes_per_s() / 1e6,
                        t.msgs_per_s(),
                        lo / 1e6,
                        hi / 1e6,
                        samples.runs.len()
                    )
                }
                Outcome::Unavailable(why) => format!("{why} | | | "),
                Outcome::Failed(why) => format!("FAILED: {} | | | ", one_line(why)),
            };
            let _ = writeln!(o, "| {} | {} | {cells} |", size_label(size), path.label());
        }
    }

    if let Some(size) = r.latency_size {
        let _ = writeln!(
            o,
            "\n## Latency at {} load ({}, open loop at {:.0} % of the path's own maximum msg/s)\n",
            if r.latency_load == 0.5 { "half".to_string() } else { format!("{:.0} %", 100.0 * r.latency_load) },
            size_label(size),
            100.0 * r.latency_load
        );
        let _ = writeln!(
            o,
            "Latency is arrival at the receiver (the handler, for Sender → Receiver) minus the time \
             the message was due to be sent. \"sender late p99\" is how late the paced sender itself \
             started its sends: where it is large, the sender could not keep the rate and the \
             latencies include its backlog.\n"
        );
        let _ = writeln!(
            o,
            "| path | max msg/s | offered msg/s | messages | p50 µs | p90 µs | p99 µs | p99.9 µs | max µs | sender late p99 µs |"
        );
        let _ = writeln!(o, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
        for &path in paths {
            let Some(outcome) = r.latency.get(&path) else {
                continue;
            };
            let cells = match outcome {
                Outcome::Measured(row) => {
                    let h = &row.latency.hist;
                    format!(
                        "{:.0} | {:.0} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1}",
                        row.max_rate,
                        row.latency.rate,
                        row.latency.messages,
                        us(h.value_at_quantile(0.5)),
                        us(h.value_at_quantile(0.9)),
                        us(h.value_at_quantile(0.99)),
                        us(h.value_at_quantile(0.999)),
                        us(h.max()),
                        us(row.latency.sender_lag.value_at_quantile(0.99)),
                    )
                }
                Outcome::Unavailable(why) => format!("{why} | | | | | | | | "),
                Outcome::Failed(why) => format!("FAILED: {} | | | | | | | | ", one_line(why)),
            };
            let _ = writeln!(o, "| {} | {cells} |", path.label());
        }
        if let Some(p) = &r.pauses {
            let _ = writeln!(
                o,
                "\nMachine pauses, probed just before (two threads reading the clock in a loop for {:.1} s): \
                 {:.2} % of each thread's time went in {} pauses longer than {} µs, the longest {:.1} ms. \
                 A message waits out a pause of its sender or its receiver, and at load ρ the backlog \
                 a pause leaves takes ρ/(1−ρ) of the pause again to drain, so about {:.1} % of the \
                 messages at this load are late by more than {} µs whatever the path, the raw socket \
                 included (both threads' share ÷ (1 − ρ)). Where that is over 1 %, a p99 of 100 µs \
                 cannot be judged on this machine.",
                p.duration.as_secs_f64(),
                100.0 * p.fraction(),
                p.count,
                p.threshold.as_micros(),
                p.largest.as_secs_f64() * 1e3,
                100.0 * p.late_share(r.latency_load),
                p.threshold.as_micros(),
            );
        }
    }

    let _ = writeln!(o, "\n## Targets (issue #16)\n");
    if quick {
        let _ = writeln!(o, "(quick smoke run: verdicts below are not meaningful)\n");
    }
    for line in targets(r) {
        let _ = writeln!(o, "- {line}");
    }
    o
}

fn one_line(s: &str) -> String {
    s.replace(['\n', '|'], " ")
}

fn verdict(ok: bool) -> &'static str {
    if ok { "**met**" } else { "**not met**" }
}

/// "a is at least `min` times b" at each of `sizes`: the verdict and the numbers.
fn ratio_target(r: &Runner, what: &str, a: PathName, b: PathName, sizes: &[usize], min: f64, percent: bool) -> String {
    if sizes.is_empty() {
        return format!("{what}: **not measured** (no such size in --sizes)");
    }
    let mut parts = Vec::new();
    let mut all = Some(true);
    for &size in sizes {
        match (r.measured(a, size), r.measured(b, size)) {
            (Ok(x), Ok(y)) => {
                let ratio = x.bytes_per_s() / y.bytes_per_s();
                all = all.map(|ok| ok && ratio >= min);
                let shown = if percent { format!("{:.0} %", 100.0 * ratio) } else { format!("{ratio:.1}×") };
                parts.push(format!(
                    "{}: {:.0} / {:.0} MB/s = {shown}",
                    size_label(size),
                    x.bytes_per_s() / 1e6,
                    y.bytes_per_s() / 1e6,
                ));
            }
            (Err(e), _) | (_, Err(e)) => {
                all = None;
                parts.push(format!("{}: not measured ({e})", size_label(size)));
            }
        }
    }
    let v = match all {
        Some(ok) => verdict(ok),
        None => "**not measured**",
    };
    format!("{what}: {v} — {}", parts.join("; "))
}

fn p99_target(r: &Runner, what: &str, path: PathName) -> String {
    match (r.latency_size, r.latency.get(&path)) {
        (None, _) => format!("{what}: **not measured** (--no-latency)"),
        (Some(size), _) if size != 4 * KIB => {
            format!("{what}: **not measured** (--latency-size is {})", size_label(size))
        }
        _ if r.latency_load != 0.5 => {
            format!("{what}: **not measured** (--latency-load is {}, not half)", r.latency_load)
        }
        (_, Some(Outcome::Measured(row))) => {
            let p99 = us(row.latency.hist.value_at_quantile(0.99));
            let late = us(row.latency.sender_lag.value_at_quantile(0.99));
            let mut caveat = if late > 20.0 {
                format!(" (the paced sender itself ran late: p99 {late:.1} µs)")
            } else {
                String::new()
            };
            if let Some(p) = r.pauses.as_ref().filter(|p| p.late_share(r.latency_load) > 0.01) {
                caveat.push_str(&format!(
                    "; not judgeable on this machine: its pauses over {} µs (longest {:.1} ms) make \
                     about {:.1} % of messages late on any path, more than the 1 % a p99 allows",
                    p.threshold.as_micros(),
                    p.largest.as_secs_f64() * 1e3,
                    100.0 * p.late_share(r.latency_load),
                ));
            }
            format!("{what}: {} — p99 {p99:.1} µs at {:.0} msg/s{caveat}", verdict(p99 <= 100.0), row.latency.rate)
        }
        (_, Some(Outcome::Unavailable(why))) => format!("{what}: **not measured** ({why})"),
        (_, Some(Outcome::Failed(_))) => format!("{what}: **not measured** (the run failed)"),
        (_, None) => format!("{what}: **not measured** ({} not run)", path.label()),
    }
}

/// The issue's targets, for the library as a UDF uses it (Sender → Receiver, acked), and the
/// same comparisons for the backends alone.
fn targets(r: &Runner) -> Vec<String> {
    let big: Vec<usize> = r.sizes.iter().copied().filter(|&s| s >= FRAME).collect();
    let frame: Vec<usize> = r.sizes.iter().copied().filter(|&s| s == FRAME).collect();
    let four: Vec<usize> = r.sizes.iter().copied().filter(|&s| s == 4 * MIB).collect();
    let mut out = Vec::new();
    for (level, tcp, shm) in
        [("", PathName::Tcp, PathName::Shm), ("frames only, informational: ", PathName::TcpFrames, PathName::ShmFrames)]
    {
        out.push(ratio_target(
            r,
            &format!("{level}direct TCP ≥ 85 % of raw loopback throughput at ≥ 512 KiB"),
            tcp,
            PathName::Raw,
            &big,
            0.85,
            true,
        ));
        out.push(ratio_target(
            r,
            &format!("{level}direct TCP ≥ 10× JetStream throughput at 512 KiB"),
            tcp,
            PathName::Jetstream,
            &frame,
            10.0,
            false,
        ));
        out.push(p99_target(r, &format!("{level}direct TCP p99 latency at 4 KiB ≤ 100 µs at half load"), tcp));
        out.push(ratio_target(
            r,
            &format!("{level}shared memory ≥ 2× direct TCP throughput at 4 MiB"),
            shm,
            tcp,
            &four,
            2.0,
            false,
        ));
    }
    out
}
