//! Launch order: init containers that hold a pod until the pods of the tasks it depends on answer
//! (their DNS name resolves and a TCP port accepts a connection), with a timeout.
//!
//! Unlike Volcano's `dependsOn` (which does not create the dependent pods until their
//! dependencies run, and so deadlocks with gang scheduling: the PodGroup waits for pods that are
//! never created), every pod is created and scheduled together; only its containers wait.
//!
//! The init container runs `weft wait-for` from weft's image. Targets are `host:port`; a host may
//! hold one inclusive range `{A..B}` that `weft wait-for` expands, so a pod waiting for 1,000
//! workers carries one argument, not 1,000.

use k8s_openapi::api::core::v1::{Container, PodSpec, ResourceRequirements, SecurityContext};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::flags::{FlagDef, Flags};
use crate::job::TaskSpec;
use crate::naming;

/// Name prefix of launch-order init containers: `weft-wait-for-<task>`.
pub const WAIT_CONTAINER_PREFIX: &str = "weft-wait-for-";

/// Default time a pod waits for its dependencies before its init container fails, seconds.
pub const DEFAULT_WAIT_TIMEOUT_SECS: i64 = 600;

/// `--wait` (bool, default true): whether a framework plugin adds its launch-order init container.
pub const WAIT_FLAG: FlagDef = FlagDef::bool("wait", "true");

/// `--wait-timeout` (seconds, default [`DEFAULT_WAIT_TIMEOUT_SECS`], must be > 0).
pub const WAIT_TIMEOUT_FLAG: FlagDef = FlagDef::int("wait-timeout", "600");

/// The timeout from [`WAIT_FLAG`] and [`WAIT_TIMEOUT_FLAG`]: `None` when `--wait=false`; an error
/// naming the flag when the timeout is not positive.
pub fn wait_timeout(flags: &Flags) -> Result<Option<i64>, String> {
    if !flags.bool(WAIT_FLAG.name) {
        return Ok(None);
    }
    match flags.int(WAIT_TIMEOUT_FLAG.name) {
        t if t > 0 => Ok(Some(t)),
        t => Err(format!("flag -{} must be a number of seconds > 0, not {t}", WAIT_TIMEOUT_FLAG.name)),
    }
}

/// Appends `container` to the pod's init containers unless one of the same name is there (a pod
/// mutated twice, e.g. on webhook reinvocation, keeps one).
pub fn add_init_container(spec: &mut PodSpec, container: &Container) {
    let init = spec.init_containers.get_or_insert_with(Vec::new);
    if !init.iter().any(|c| c.name == container.name) {
        init.push(container.clone());
    }
}

/// What one launch-order init container waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wait {
    /// The task waited for (names the container).
    pub task: String,
    /// `host:port` targets, possibly with one `{A..B}` range each.
    pub targets: Vec<String>,
    /// Give up after this many seconds (the container exits 1 and the kubelet restarts it per the
    /// pod's restartPolicy).
    pub timeout_secs: i64,
    /// Image that has `weft` on its PATH.
    pub image: String,
}

/// The targets for every replica of `task` on `port`: one ranged target when the replicas have
/// Volcano's default names (`<job>-<task>-{0..N-1}.<subdomain>`), one target when the template
/// fixes the hostname, none for a task with no replicas.
pub fn task_targets(job: &str, task: &TaskSpec, port: i64) -> Vec<String> {
    let n = naming::replicas(task);
    if n == 0 {
        return Vec::new();
    }
    if naming::template_sets_hostname(task) || n == 1 {
        return vec![format!("{}:{port}", naming::domain_name(job, task, 0))];
    }
    // Default hostnames: `<job>-<task>-<i>.<subdomain>`; the subdomain is what follows replica 0's
    // pod name in its domain name.
    let first = naming::domain_name(job, task, 0);
    let subdomain = first.strip_prefix(&naming::pod_name(job, &task.name, 0)).unwrap_or_default();
    vec![format!("{job}-{}-{{0..{}}}{subdomain}:{port}", task.name, n - 1)]
}

/// The init container for `wait`.
pub fn wait_container(wait: &Wait) -> Container {
    let mut args = vec![format!("--timeout={}", wait.timeout_secs)];
    args.extend(wait.targets.iter().cloned());
    Container {
        name: wait_container_name(&wait.task),
        image: Some(wait.image.clone()),
        command: Some(vec!["weft".to_owned(), "wait-for".to_owned()]),
        args: Some(args),
        resources: Some(ResourceRequirements {
            requests: Some(
                [("cpu".to_owned(), Quantity("10m".into())), ("memory".to_owned(), Quantity("16Mi".into()))].into(),
            ),
            limits: Some([("memory".to_owned(), Quantity("64Mi".into()))].into()),
            ..Default::default()
        }),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            run_as_non_root: Some(true),
            run_as_user: Some(65532),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// `weft-wait-for-<task>`, cut to the 63 characters a container name may have (task names may be
/// longer than the 49 that leaves), without a trailing `-`.
pub fn wait_container_name(task: &str) -> String {
    let mut name = format!("{WAIT_CONTAINER_PREFIX}{task}");
    name.truncate(MAX_CONTAINER_NAME);
    name.trim_end_matches('-').to_owned()
}

/// Longest container name Kubernetes accepts (a DNS label).
const MAX_CONTAINER_NAME: usize = 63;

/// Expands one target: `host-{0..2}.j:22` → `host-0.j:22`, `host-1.j:22`, `host-2.j:22`. A
/// target without a range is returned as is. Errors name the target and what is wrong.
pub fn expand_target(target: &str) -> Result<Vec<String>, String> {
    let (host, port) = target.rsplit_once(':').ok_or_else(|| format!("target {target:?}: expected HOST:PORT"))?;
    if host.is_empty() {
        return Err(format!("target {target:?}: empty host"));
    }
    port.parse::<u16>()
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| format!("target {target:?}: port {port:?} is not a number from 1 to 65535"))?;
    let Some(open) = host.find('{') else {
        if host.contains('}') {
            return Err(format!("target {target:?}: '}}' without '{{'"));
        }
        return Ok(vec![target.to_owned()]);
    };
    let close =
        host[open..].find('}').map(|c| c + open).ok_or_else(|| format!("target {target:?}: '{{' without '}}'"))?;
    let (before, range, after) = (&host[..open], &host[open + 1..close], &host[close + 1..]);
    if after.contains('{') || after.contains('}') {
        return Err(format!("target {target:?}: at most one {{A..B}} range"));
    }
    let (a, b) = range.split_once("..").ok_or_else(|| format!("target {target:?}: range {{{range}}} is not A..B"))?;
    let (a, b): (u32, u32) = match (a.parse(), b.parse()) {
        (Ok(a), Ok(b)) if a <= b => (a, b),
        _ => return Err(format!("target {target:?}: range {{{range}}} needs numbers A <= B")),
    };
    if b - a >= 100_000 {
        return Err(format!("target {target:?}: range {{{range}}} has more than 100000 hosts"));
    }
    Ok((a..=b).map(|i| format!("{before}{i}{after}:{port}")).collect())
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{PodSpec, PodTemplateSpec};

    use super::*;

    fn task(name: &str, replicas: i32, hostname: Option<&str>) -> TaskSpec {
        TaskSpec {
            name: name.into(),
            replicas,
            template: PodTemplateSpec {
                metadata: None,
                spec: Some(PodSpec { hostname: hostname.map(Into::into), ..Default::default() }),
            },
            ..Default::default()
        }
    }

    #[test]
    fn targets_cover_every_replica_by_its_domain_name() {
        let t = task("mpi-worker", 3, None);
        let targets = task_targets("my-job", &t, 22);
        assert_eq!(targets, vec!["my-job-mpi-worker-{0..2}.my-job:22".to_owned()]);
        let expanded = expand_target(&targets[0]).expect("expands");
        let expected: Vec<String> = (0..3).map(|i| format!("{}:22", naming::domain_name("my-job", &t, i))).collect();
        assert_eq!(expanded, expected);
    }

    #[test]
    fn fixed_hostname_and_single_replica_give_one_plain_target() {
        assert_eq!(task_targets("j", &task("m", 3, Some("head")), 6379), vec!["head.j:6379".to_owned()]);
        assert_eq!(task_targets("j", &task("m", 1, None), 23456), vec!["j-m-0.j:23456".to_owned()]);
        assert!(task_targets("j", &task("m", 0, None), 1).is_empty());
    }

    #[test]
    fn expand_rejects_malformed_targets_with_the_reason() {
        assert_eq!(expand_target("a.b:80").expect("plain"), vec!["a.b:80".to_owned()]);
        for (bad, why) in [
            ("a.b", "HOST:PORT"),
            ("a.b:0", "port"),
            ("a.b:x", "port"),
            (":80", "empty host"),
            ("a{0..2:80", "without"),
            ("a}:80", "without"),
            ("a{2..1}:80", "A <= B"),
            ("a{0-2}:80", "A..B"),
            ("a{0..1}{0..1}:80", "at most one"),
            ("a{0..100000}:80", "more than"),
        ] {
            let e = expand_target(bad).expect_err(bad);
            assert!(e.contains(why) && e.contains(bad), "{bad}: {e}");
        }
    }

    #[test]
    fn wait_timeout_flag_defaults_to_the_default_timeout() {
        assert_eq!(WAIT_TIMEOUT_FLAG.default, DEFAULT_WAIT_TIMEOUT_SECS.to_string());
        let defs = [WAIT_FLAG, WAIT_TIMEOUT_FLAG];
        let parse = |a: &[&str]| {
            let args: Vec<String> = a.iter().map(|s| (*s).to_owned()).collect();
            crate::flags::parse(&defs, &args, crate::flags::Mode::Strict).expect("parses").0
        };
        assert_eq!(wait_timeout(&parse(&[])), Ok(Some(DEFAULT_WAIT_TIMEOUT_SECS)));
        assert_eq!(wait_timeout(&parse(&["--wait=false", "--wait-timeout=0"])), Ok(None));
        let e = wait_timeout(&parse(&["--wait-timeout=0"])).expect_err("zero");
        assert!(e.contains("-wait-timeout") && e.contains("> 0"), "{e}");
    }

    #[test]
    fn wait_container_names_stay_valid_dns_labels_for_long_task_names() {
        assert_eq!(wait_container_name("master"), "weft-wait-for-master");
        let long = format!("{}-{}", "a".repeat(48), "b".repeat(10));
        let name = wait_container_name(&long);
        assert_eq!(name.len(), 62, "cut at 63, then the trailing '-' dropped: {name}");
        assert_eq!(name, format!("weft-wait-for-{}", "a".repeat(48)));
        assert_eq!(wait_container_name(&"x".repeat(59)).len(), 63);
    }

    #[test]
    fn wait_container_runs_weft_wait_for_with_the_timeout_first() {
        let c = wait_container(&Wait {
            task: "worker".into(),
            targets: vec!["a:1".into()],
            timeout_secs: 30,
            image: "img".into(),
        });
        assert_eq!(c.name, "weft-wait-for-worker");
        assert_eq!(c.command, Some(vec!["weft".to_owned(), "wait-for".to_owned()]));
        assert_eq!(c.args, Some(vec!["--timeout=30".to_owned(), "a:1".to_owned()]));
    }
}
