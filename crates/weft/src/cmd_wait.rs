//! `weft wait-for`: the launch-order init container. Waits until every `HOST:PORT` target has
//! resolved and accepted a TCP connection at least once, retrying the others every `--interval`
//! seconds, and gives up after `--timeout` seconds (exit status 1, naming each unready target and
//! why it was not ready).
//!
//! A host may hold one `{A..B}` range (see `weft_jobs::launch::expand_target`), so a pod waiting
//! for 1,000 workers carries one argument. Targets are probed concurrently, at most
//! `--concurrency` at a time, so a round over 1,000 unreachable workers takes
//! `1000 / concurrency × connect-timeout`, not `1000 × connect-timeout`.

use std::fmt;
use std::future::Future;
use std::io::Write as _;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use futures::StreamExt as _;
use tokio::time::Instant;

#[derive(Args, Debug)]
pub struct WaitArgs {
    /// Give up after this long and exit 1 (0 = wait forever). Durations: `10m`, `30s`, or whole
    /// seconds.
    #[arg(long, default_value = "10m", value_name = "DURATION", value_parser = crate::duration_arg::duration)]
    timeout: Duration,
    /// Time between attempts at the targets not ready yet.
    #[arg(long, default_value = "2s", value_name = "DURATION", value_parser = crate::duration_arg::positive)]
    interval: Duration,
    /// Longest wait for one DNS lookup or one TCP connection.
    #[arg(long, default_value = "2s", value_name = "DURATION", value_parser = crate::duration_arg::positive)]
    connect_timeout: Duration,
    /// Targets probed at once.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=4096))]
    concurrency: u64,
    /// Print nothing while waiting (errors are still printed).
    #[arg(long, short)]
    quiet: bool,
    /// What to wait for: `HOST:PORT`, where HOST may hold one `{A..B}` range
    /// (`job-worker-{0..7}.job:22`).
    #[arg(required = true, value_name = "HOST:PORT")]
    targets: Vec<String>,
}

pub fn run(a: WaitArgs) -> anyhow::Result<()> {
    let targets = expand_targets(&a.targets)?;
    let config = WaitConfig {
        timeout: (!a.timeout.is_zero()).then_some(a.timeout),
        interval: a.interval,
        concurrency: usize::try_from(a.concurrency).unwrap_or(64),
    };
    let probe = TcpProbe { timeout: a.connect_timeout };
    let quiet = a.quiet;
    let rt =
        tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the async runtime")?;
    // A progress line when the count of ready targets changes, else every 15th round (30 s at the
    // default interval), so a long wait does not flood the log.
    let mut last_ready = None;
    let result = rt.block_on(wait_for(&targets, &config, &probe, |round| {
        if !quiet && (last_ready != Some(round.ready) || round.attempt.is_multiple_of(15)) {
            eprintln!("weft wait-for: {round}");
            last_ready = Some(round.ready);
        }
    }));
    drop(rt);
    match result {
        Ok(report) => {
            if !quiet {
                eprintln!("weft wait-for: {report}");
            }
            Ok(())
        }
        Err(e) => {
            // Exit 1, as the init container's contract says (2 is for bad arguments).
            eprintln!("error: weft wait-for: {e}");
            let _ = std::io::stderr().flush();
            std::process::exit(1)
        }
    }
}

/// Every target with its range expanded, duplicates dropped (first occurrence kept). An error
/// names the malformed target.
pub fn expand_targets(targets: &[String]) -> anyhow::Result<Vec<String>> {
    let mut out = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for t in targets {
        for one in weft_jobs::launch::expand_target(t).map_err(anyhow::Error::msg)? {
            if seen.insert(one.clone()) {
                out.push(one);
            }
        }
    }
    anyhow::ensure!(!out.is_empty(), "no targets to wait for");
    Ok(out)
}

/// How to wait.
#[derive(Clone, Debug)]
pub struct WaitConfig {
    /// Give up after this long; `None` waits forever.
    pub timeout: Option<Duration>,
    /// Time between the starts of two rounds of attempts.
    pub interval: Duration,
    /// Targets probed at once (at least 1).
    pub concurrency: usize,
}

impl Default for WaitConfig {
    fn default() -> Self {
        WaitConfig { timeout: Some(Duration::from_secs(600)), interval: Duration::from_secs(2), concurrency: 64 }
    }
}

/// One attempt at one target: resolve it and open a TCP connection. `Err` says why it is not
/// ready yet (`no such host`, `connection refused`, …).
pub trait Probe {
    /// Try `target` (`host:port`) once.
    fn probe(&self, target: &str) -> impl Future<Output = Result<(), String>>;
}

/// The real probe: DNS through the system resolver (`tokio::net::lookup_host`), then a TCP
/// connection to each address in turn until one accepts; each step bounded by `timeout`.
#[derive(Clone, Copy, Debug)]
pub struct TcpProbe {
    /// Longest wait for the lookup, and for each connection.
    pub timeout: Duration,
}

impl Probe for TcpProbe {
    async fn probe(&self, target: &str) -> Result<(), String> {
        let addrs = match tokio::time::timeout(self.timeout, tokio::net::lookup_host(target)).await {
            Err(_) => return Err(format!("DNS lookup timed out after {:?}", self.timeout)),
            Ok(Err(e)) => return Err(dns_reason(&e)),
            Ok(Ok(addrs)) => addrs.collect::<Vec<_>>(),
        };
        let mut why = "no such host (no addresses)".to_owned();
        for addr in addrs {
            match tokio::time::timeout(self.timeout, tokio::net::TcpStream::connect(addr)).await {
                Ok(Ok(_stream)) => return Ok(()),
                Ok(Err(e)) => why = connect_reason(addr, &e),
                Err(_) => why = format!("{addr}: connect timed out after {:?}", self.timeout),
            }
        }
        Err(why)
    }
}

fn dns_reason(e: &std::io::Error) -> String {
    let text = e.to_string();
    let detail = text.strip_prefix("failed to lookup address information: ").unwrap_or(&text);
    // glibc's and musl's words for NXDOMAIN / no records.
    let no_such_host =
        ["Name or service not known", "No address associated", "nodename nor servname", "Name does not resolve"];
    if no_such_host.iter().any(|w| detail.contains(w)) {
        "no such host".to_owned()
    } else {
        format!("DNS lookup failed: {detail}")
    }
}

fn connect_reason(addr: std::net::SocketAddr, e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::ConnectionRefused => format!("{addr}: connection refused"),
        _ => format!("{addr}: {e}"),
    }
}

/// The state after one round of attempts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Round {
    /// Rounds so far, this one included.
    pub attempt: u32,
    /// Targets ready so far.
    pub ready: usize,
    /// All targets.
    pub total: usize,
    /// The targets not ready, each with why its last attempt failed, in the order given.
    pub unready: Vec<(String, String)>,
}

/// How many unready targets a progress line names.
const NAMED_IN_PROGRESS: usize = 3;
/// How many unready targets the final error names.
const NAMED_IN_ERROR: usize = 100;

fn list_unready(f: &mut fmt::Formatter<'_>, unready: &[(String, String)], max: usize) -> fmt::Result {
    for (i, (target, why)) in unready.iter().take(max).enumerate() {
        if i > 0 {
            f.write_str(", ")?;
        }
        write!(f, "{target} ({why})")?;
    }
    if unready.len() > max {
        write!(f, ", … and {} more", unready.len() - max)?;
    }
    Ok(())
}

impl fmt::Display for Round {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{} ready", self.ready, self.total)?;
        if !self.unready.is_empty() {
            f.write_str("; waiting for ")?;
            list_unready(f, &self.unready, NAMED_IN_PROGRESS)?;
        }
        Ok(())
    }
}

/// Every target was ready.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    /// The number of targets.
    pub targets: usize,
    /// Rounds of attempts it took.
    pub attempts: u32,
    /// Time from the start to the last target being ready.
    pub elapsed: Duration,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{n}/{n} ready after {a} round{s} ({t:.1}s)",
            n = self.targets,
            a = self.attempts,
            s = if self.attempts == 1 { "" } else { "s" },
            t = self.elapsed.as_secs_f64()
        )
    }
}

/// Some targets were not ready before the timeout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WaitError {
    /// The timeout that ran out.
    pub timeout: Duration,
    /// The last round.
    pub last: Round,
}

impl fmt::Display for WaitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = &self.last;
        write!(
            f,
            "timed out after {}s: {} of {} targets not ready: ",
            self.timeout.as_secs_f64(),
            r.unready.len(),
            r.total
        )?;
        list_unready(f, &r.unready, NAMED_IN_ERROR)
    }
}

impl std::error::Error for WaitError {}

/// Waits until every target in `targets` has passed `probe` once. Rounds start every
/// `config.interval` (on tokio's clock) and try only the targets not ready yet, at most
/// `config.concurrency` at a time; `progress` sees each round that left targets unready. After
/// `config.timeout` one last round runs at the deadline, then the error names what is left.
pub async fn wait_for<P: Probe>(
    targets: &[String],
    config: &WaitConfig,
    probe: &P,
    mut progress: impl FnMut(&Round),
) -> Result<Report, WaitError> {
    let start = Instant::now();
    let deadline = config.timeout.map(|t| start + t);
    let mut pending: Vec<(String, String)> = targets.iter().map(|t| (t.clone(), "not tried yet".to_owned())).collect();
    let mut attempt: u32 = 0;
    loop {
        attempt = attempt.saturating_add(1);
        let round_start = Instant::now();
        let outcomes: Vec<(usize, Result<(), String>)> = futures::stream::iter(
            pending.iter().enumerate().map(|(i, (t, _))| async move { (i, probe.probe(t).await) }),
        )
        .buffer_unordered(config.concurrency.max(1))
        .collect()
        .await;
        let mut failed: Vec<Option<String>> = vec![None; pending.len()];
        for (i, outcome) in outcomes {
            if let Err(why) = outcome {
                failed[i] = Some(why);
            }
        }
        pending = pending.into_iter().zip(failed).filter_map(|((t, _), why)| why.map(|w| (t, w))).collect();
        let round =
            Round { attempt, ready: targets.len() - pending.len(), total: targets.len(), unready: pending.clone() };
        if pending.is_empty() {
            return Ok(Report { targets: targets.len(), attempts: attempt, elapsed: start.elapsed() });
        }
        progress(&round);
        let now = Instant::now();
        if let (Some(deadline), Some(timeout)) = (deadline, config.timeout)
            && now >= deadline
        {
            return Err(WaitError { timeout, last: round });
        }
        let next = round_start + config.interval;
        tokio::time::sleep_until(deadline.map_or(next, |d| next.min(d))).await;
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::net::{SocketAddr, TcpListener as StdListener};
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    fn quick(timeout: Option<Duration>) -> WaitConfig {
        WaitConfig { timeout, interval: Duration::from_millis(5), concurrency: 8 }
    }

    fn listener() -> (StdListener, u16) {
        let l = StdListener::bind("127.0.0.1:0").expect("bind");
        let port = l.local_addr().expect("addr").port();
        (l, port)
    }

    /// A port nothing listens on: bound once to pick it, then closed.
    fn closed_port() -> u16 {
        listener().1
    }

    /// The real probe, counting attempts per target.
    #[derive(Default)]
    struct Counting {
        real: Option<TcpProbe>,
        attempts: Mutex<HashMap<String, u32>>,
    }

    impl Counting {
        fn real() -> Self {
            Counting { real: Some(TcpProbe { timeout: Duration::from_secs(5) }), ..Default::default() }
        }
        fn count(&self, target: &str) -> u32 {
            let mut map = self.attempts.lock().expect("lock");
            let n = map.entry(target.to_owned()).or_default();
            *n += 1;
            *n
        }
        fn attempts(&self, target: &str) -> u32 {
            self.attempts.lock().expect("lock").get(target).copied().unwrap_or(0)
        }
    }

    impl Probe for Counting {
        async fn probe(&self, target: &str) -> Result<(), String> {
            self.count(target);
            match &self.real {
                Some(p) => p.probe(target).await,
                None => Err("never".into()),
            }
        }
    }

    #[tokio::test]
    async fn every_target_listening_is_ready_in_one_round() {
        let (_a, pa) = listener();
        let (_b, pb) = listener();
        let targets = vec![format!("127.0.0.1:{pa}"), format!("localhost:{pb}")];
        let probe = Counting::real();
        let mut rounds = Vec::new();
        let report = wait_for(&targets, &quick(Some(Duration::from_secs(60))), &probe, |r| rounds.push(r.clone()))
            .await
            .expect("all listening");
        assert_eq!((report.targets, report.attempts), (2, 1));
        assert!(rounds.is_empty(), "no progress lines when everything is ready at once: {rounds:?}");
    }

    /// Binds the listener on a closed port from inside the probe after two refused attempts: the
    /// wait retries only that target and succeeds on the third round.
    struct BindsLate {
        inner: Counting,
        late: String,
        port: u16,
        bound: Mutex<Option<StdListener>>,
    }

    impl Probe for BindsLate {
        async fn probe(&self, target: &str) -> Result<(), String> {
            if target == self.late && self.inner.attempts(target) == 2 {
                let addr: SocketAddr = ([127, 0, 0, 1], self.port).into();
                *self.bound.lock().expect("lock") = Some(StdListener::bind(addr).expect("re-bind the closed port"));
            }
            self.inner.probe(target).await
        }
    }

    #[tokio::test]
    async fn a_port_that_starts_listening_while_waiting_is_picked_up_on_a_later_round() {
        let (_up, up_port) = listener();
        let late_port = closed_port();
        let up = format!("127.0.0.1:{up_port}");
        let late = format!("127.0.0.1:{late_port}");
        let probe = BindsLate { inner: Counting::real(), late: late.clone(), port: late_port, bound: Mutex::new(None) };
        let mut rounds = Vec::new();
        let report = wait_for(&[up.clone(), late.clone()], &quick(Some(Duration::from_secs(60))), &probe, |r| {
            rounds.push(r.clone())
        })
        .await
        .expect("ready once bound");
        assert_eq!(report.attempts, 3);
        assert_eq!(probe.inner.attempts(&up), 1, "a ready target is not probed again");
        assert_eq!(probe.inner.attempts(&late), 3);
        assert_eq!(rounds.len(), 2);
        assert_eq!((rounds[0].ready, rounds[0].total), (1, 2));
        assert_eq!(rounds[0].unready[0].0, late);
        assert!(rounds[0].unready[0].1.contains("connection refused"), "{:?}", rounds[0]);
        assert!(rounds[0].to_string().starts_with(&format!("1/2 ready; waiting for {late} (")), "{}", rounds[0]);
    }

    #[tokio::test]
    async fn a_host_that_does_not_resolve_fails_after_the_timeout_naming_it() {
        let (_l, port) = listener();
        let ok = format!("127.0.0.1:{port}");
        let bad = "nonexistent.invalid:80".to_owned();
        let e = wait_for(
            &[ok, bad.clone()],
            &quick(Some(Duration::from_millis(30))),
            &TcpProbe { timeout: Duration::from_secs(5) },
            |_| {},
        )
        .await
        .expect_err("cannot resolve");
        assert_eq!((e.last.ready, e.last.total), (1, 2));
        assert_eq!(e.last.unready.len(), 1);
        assert_eq!(e.last.unready[0].0, bad);
        let text = e.to_string();
        assert!(text.contains("1 of 2 targets not ready: nonexistent.invalid:80 ("), "{text}");
        // The system resolver says no such host, or (offline sandboxes) that the lookup failed.
        assert!(e.last.unready[0].1 == "no such host" || e.last.unready[0].1.contains("DNS"), "{text}");
    }

    #[tokio::test(start_paused = true)]
    async fn rounds_follow_the_interval_until_the_deadline_then_one_last_round() {
        let probe = Counting::default();
        let config =
            WaitConfig { timeout: Some(Duration::from_secs(600)), interval: Duration::from_secs(2), concurrency: 64 };
        let start = Instant::now();
        let e = wait_for(&["a.j:22".to_owned()], &config, &probe, |_| {}).await.expect_err("never ready");
        // Rounds at 0, 2, …, 600 s of tokio's (paused, auto-advancing) clock.
        assert_eq!(probe.attempts("a.j:22"), 301);
        assert_eq!(e.last.attempt, 301);
        assert_eq!(start.elapsed(), Duration::from_secs(600));
        assert_eq!(e.last.unready, vec![("a.j:22".to_owned(), "never".to_owned())]);
    }

    /// Ready on its `n`-th attempt.
    struct ReadyOn(Counting, u32);

    impl Probe for ReadyOn {
        async fn probe(&self, target: &str) -> Result<(), String> {
            if self.0.count(target) >= self.1 { Ok(()) } else { Err("not yet".into()) }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn timeout_none_waits_forever() {
        let probe = ReadyOn(Counting::default(), 5000);
        let config = WaitConfig { timeout: None, ..WaitConfig::default() };
        let report = wait_for(&["a.j:22".to_owned()], &config, &probe, |_| {}).await.expect("eventually");
        assert_eq!(report.attempts, 5000);
        assert_eq!(report.elapsed, Duration::from_secs(2 * 4999));
    }

    /// Counts probes in flight; each stays in flight across a few yields so that the stream has
    /// the chance to start more.
    #[derive(Default)]
    struct InFlight {
        now: AtomicUsize,
        max: AtomicUsize,
        total: AtomicUsize,
    }

    impl Probe for InFlight {
        async fn probe(&self, _target: &str) -> Result<(), String> {
            let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
            self.max.fetch_max(n, Ordering::SeqCst);
            self.total.fetch_add(1, Ordering::SeqCst);
            for _ in 0..3 {
                tokio::task::yield_now().await;
            }
            self.now.fetch_sub(1, Ordering::SeqCst);
            Ok(())
        }
    }

    #[tokio::test]
    async fn at_most_concurrency_probes_run_at_once() {
        let targets = expand_targets(&["w-{0..999}.j:22".to_owned()]).expect("expands");
        let probe = InFlight::default();
        let config = WaitConfig { concurrency: 16, ..WaitConfig::default() };
        wait_for(&targets, &config, &probe, |_| {}).await.expect("all ready");
        assert_eq!(probe.total.load(Ordering::SeqCst), 1000);
        assert_eq!(probe.max.load(Ordering::SeqCst), 16, "the bound is reached and never passed");
    }

    #[test]
    fn ranges_expand_and_duplicates_go() {
        let t = expand_targets(&["j-w-{0..2}.j:22".into(), "j-m-0.j:22".into(), "j-w-1.j:22".into()]).expect("ok");
        assert_eq!(t, ["j-w-0.j:22", "j-w-1.j:22", "j-w-2.j:22", "j-m-0.j:22"]);
        let e = expand_targets(&["ok:1".into(), "bad".into()]).expect_err("bad target");
        assert!(e.to_string().contains("\"bad\"") && e.to_string().contains("HOST:PORT"), "{e}");
    }

    #[test]
    fn error_lists_every_unready_target_with_its_reason_up_to_a_hundred() {
        let unready: Vec<(String, String)> =
            (0..105).map(|i| (format!("h{i}:1"), "connection refused".into())).collect();
        let e = WaitError {
            timeout: Duration::from_secs(600),
            last: Round { attempt: 301, ready: 3, total: 108, unready },
        };
        let text = e.to_string();
        assert!(
            text.starts_with("timed out after 600s: 105 of 108 targets not ready: h0:1 (connection refused), h1:1"),
            "{text}"
        );
        assert!(text.contains("h99:1 (connection refused), … and 5 more"), "{text}");
        assert!(!text.contains("h100:1"));
    }
}
