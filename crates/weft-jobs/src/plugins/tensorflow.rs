//! The `tensorflow` plugin: `TF_CONFIG` for every container of a distributed TensorFlow job.
//!
//! Volcano's `pkg/controllers/job/plugins/distributed-framework/tensorflow`:
//! - A job of exactly one task with one replica is left alone.
//! - Otherwise every container (not init container) gets `TF_CONFIG`, Go's compact
//!   `json.Marshal` of `{"cluster":{"ps":[…],"worker":[…],"chief":[…],"evaluator":[…]},
//!   "task":{"type":…,"index":…}}`: roles in that order, empty roles left out, hosts
//!   `<domain name>:<port>`. Tasks named by no role flag are left out of the cluster.
//! - `task.type` is the role of the pod's task (checked in the order chief, worker, ps,
//!   evaluator), or the raw task name when it has none; `task.index` is the pod-name suffix.
//! - Quirk kept: when a template fixes `hostname`, every replica of that task gets the same host.
//!
//! The cluster part is the same for every pod of a job, so it is built once; a pod only adds its
//! task part.
//!
//! weft's flavor rejects what Volcano silently gets wrong: an explicit role flag naming a task
//! the job lacks, two role flags naming the same task, a distributed job whose tasks match no
//! role, a role task with a fixed hostname and several replicas, and ports outside 1..=65535. The
//! Volcano flavor reproduces Volcano's output and says so in warnings.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{EnvVar, Pod};

use crate::flags::{FlagDef, FlagError};
use crate::naming;
use crate::plugin::{BuildInput, Flavor, JobPlugin, PluginError};

/// The plugin's name.
pub const NAME: &str = "tensorflow";

/// The variable set on every container.
pub const TF_CONFIG: &str = "TF_CONFIG";

/// The plugin's flags (Volcano's names and defaults). The role flags name tasks.
pub const FLAGS: &[FlagDef] = &[
    FlagDef::string("ps", "ps"),
    FlagDef::string("worker", "worker"),
    FlagDef::string("chief", "chief"),
    FlagDef::string("evaluator", "evaluator"),
    FlagDef::int("port", "2222"),
];

/// The roles, in the order of `TF_CONFIG`'s cluster fields (and of the role flags).
const CLUSTER_ORDER: [&str; 4] = ["ps", "worker", "chief", "evaluator"];
/// The roles in the order Volcano's `getTaskType` checks a pod's task against them.
const TYPE_ORDER: [&str; 4] = ["chief", "worker", "ps", "evaluator"];

/// Builds the plugin for one job.
pub fn build(input: BuildInput<'_>) -> Result<Box<dyn JobPlugin>, PluginError> {
    let (flags, mut warnings) = super::common::parse_args(NAME, FLAGS, &[], &input)?;
    let strict = input.flavor == Flavor::Weft;
    let job = input.job;
    let job_name = job.job_name();
    let tasks = &job.spec.tasks;
    let single = tasks.len() == 1 && tasks[0].replicas == 1;
    let task_list = || tasks.iter().map(|t| t.name.as_str()).collect::<Vec<_>>().join(", ");

    let port = flags.int("port");
    if !(1..=65535).contains(&port) {
        if strict {
            return Err(PluginError::Args {
                plugin: NAME,
                source: FlagError::BadValue {
                    flag: "port".into(),
                    value: port.to_string(),
                    expected: "a port from 1 to 65535",
                },
            });
        }
        let consequence = format!("TF_CONFIG lists every host with it, so the workers will dial port {port}");
        warnings.extend(super::common::volcano_port_warning(NAME, "port", port, &consequence));
    }

    // Role flag → the task it names.
    let role_task = |role: &str| flags.string(role);

    for role in CLUSTER_ORDER {
        let name = role_task(role);
        if flags.was_given(role) && job.task(name).is_none() {
            if strict {
                return Err(PluginError::missing_task(NAME, role, name, job));
            }
            warnings.push(format!(
                "plugin {NAME}: -{role} names task {name:?}, which the job does not have (its tasks: {}); Volcano leaves the \
                 {role} role out of TF_CONFIG",
                task_list()
            ));
        }
    }
    for (i, a) in CLUSTER_ORDER.iter().enumerate() {
        for b in &CLUSTER_ORDER[i + 1..] {
            let name = role_task(a);
            if name == role_task(b) && job.task(name).is_some() {
                let cluster_role = a;
                let type_role = TYPE_ORDER.iter().find(|r| **r == *a || **r == *b).unwrap_or(a);
                let what = format!("-{a} and -{b} both name task {name:?}");
                if strict {
                    return Err(PluginError::Invalid {
                        plugin: NAME,
                        message: format!("{what}; a task can have one role only"),
                    });
                }
                warnings.push(format!(
                    "plugin {NAME}: {what}; Volcano lists it as {cluster_role} in the cluster but gives its pods task type \
                     {type_role}"
                ));
            }
        }
    }
    if !single {
        let matched = tasks.iter().any(|t| CLUSTER_ORDER.iter().any(|r| role_task(r) == t.name));
        if !matched {
            let roles = CLUSTER_ORDER.iter().map(|r| format!("-{r}={}", role_task(r))).collect::<Vec<_>>().join(", ");
            let what = format!("no task of the job matches a role flag ({roles}; its tasks: {})", task_list());
            if strict {
                return Err(PluginError::Invalid {
                    plugin: NAME,
                    message: format!("{what}; name the job's tasks with the role flags, e.g. --worker=<task>"),
                });
            }
            warnings.push(format!("plugin {NAME}: {what}; Volcano gives every pod an empty cluster"));
        }
        for t in tasks {
            let role = CLUSTER_ORDER.iter().find(|r| role_task(r) == t.name);
            match role {
                Some(role) if naming::template_sets_hostname(t) && t.replicas > 1 => {
                    let host = naming::domain_name(job_name, t, 0);
                    let what = format!(
                        "task {:?} ({role}) fixes its template hostname and has {} replicas: every replica has the \
                         address {host}",
                        t.name, t.replicas
                    );
                    if strict {
                        return Err(PluginError::Invalid {
                            plugin: NAME,
                            message: format!("{what}; remove the hostname or use one replica"),
                        });
                    }
                    warnings.push(format!("plugin {NAME}: {what}; Volcano lists that address {} times", t.replicas));
                }
                Some(_) => {}
                None if !strict && matched => warnings.push(format!(
                    "plugin {NAME}: task {:?} matches no role flag; Volcano leaves it out of the cluster and gives its pods \
                     task type {:?}",
                    t.name, t.name
                )),
                None => {}
            }
        }
    }

    // The cluster, as Go's switch over every task fills it (a later task of the same name wins).
    let mut cluster: [Option<Vec<String>>; 4] = Default::default();
    for t in tasks {
        if let Some(slot) = CLUSTER_ORDER.iter().position(|r| role_task(r) == t.name) {
            let hosts = (0..naming::replicas(t)).map(|i| format!("{}:{port}", naming::domain_name(job_name, t, i)));
            cluster[slot] = Some(hosts.collect());
        }
    }
    let mut prefix = String::from(r#"{"cluster":{"#);
    let mut first = true;
    for (role, hosts) in CLUSTER_ORDER.iter().zip(&cluster) {
        let Some(hosts) = hosts.as_ref().filter(|h| !h.is_empty()) else { continue };
        if !first {
            prefix.push(',');
        }
        first = false;
        prefix.push_str(&format!("\"{role}\":["));
        for (i, h) in hosts.iter().enumerate() {
            if i > 0 {
                prefix.push(',');
            }
            push_go_json_string(&mut prefix, h);
        }
        prefix.push(']');
    }
    prefix.push_str(r#"},"task":{"type":"#);

    // Task name → its role (Volcano's getTaskType order).
    let mut roles = HashMap::new();
    for role in TYPE_ORDER.iter().rev() {
        roles.insert(role_task(role).to_owned(), *role);
    }

    Ok(Box::new(Tensorflow { skip: single, prefix, roles, warnings }))
}

/// Appends `s` as a JSON string exactly as Go's `encoding/json` writes it (HTML-safe: `<`, `>`,
/// `&`, U+2028 and U+2029 as `\u` escapes; `\b`, `\f`, `\n`, `\r`, `\t` short; other control
/// characters as `\u00xx`).
fn push_go_json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '<' | '>' | '&' | '\u{2028}' | '\u{2029}' => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c if u32::from(c) < 0x20 => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
}

#[derive(Debug)]
struct Tensorflow {
    /// One task with one replica: Volcano leaves its pod alone.
    skip: bool,
    /// `{"cluster":{…},"task":{"type":` — everything before the pod's own part.
    prefix: String,
    /// Task name → role, for `task.type`.
    roles: HashMap<String, &'static str>,
    warnings: Vec<String>,
}

impl JobPlugin for Tensorflow {
    fn name(&self) -> &'static str {
        NAME
    }

    fn on_pod_create(&self, pod: &mut Pod) -> Result<(), PluginError> {
        if self.skip {
            return Ok(());
        }
        let pod_name = pod.metadata.name.as_deref().unwrap_or_default();
        let index: i64 = naming::pod_index(pod_name).and_then(|i| i.parse().ok()).ok_or_else(|| PluginError::Pod {
            plugin: NAME,
            pod: pod_name.to_owned(),
            message: "its name does not end in a replica index (<job>-<task>-<index>), which task.index of TF_CONFIG \
                      needs"
                .to_owned(),
        })?;
        // Volcano's GetTaskKey: the task-spec annotation, `default` when there is none.
        let task = naming::pod_task(pod).filter(|t| !t.is_empty()).unwrap_or("default");
        let mut value = String::with_capacity(self.prefix.len() + task.len() + 32);
        value.push_str(&self.prefix);
        match self.roles.get(task) {
            Some(role) => {
                value.push('"');
                value.push_str(role);
                value.push('"');
            }
            None => push_go_json_string(&mut value, task),
        }
        value.push_str(",\"index\":");
        value.push_str(&index.to_string());
        value.push_str("}}");

        let spec = pod.spec.get_or_insert_with(Default::default);
        for c in &mut spec.containers {
            c.env.get_or_insert_with(Vec::new).push(EnvVar {
                name: TF_CONFIG.to_owned(),
                value: Some(value.clone()),
                value_from: None,
            });
        }
        Ok(())
    }

    fn warnings(&self) -> Vec<String> {
        self.warnings.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flags::{self, Mode};

    #[test]
    fn defaults_parse() {
        let (f, w) = flags::parse(FLAGS, &[], Mode::Strict).expect("defaults parse");
        assert!(w.is_none());
        let roles: Vec<&str> = CLUSTER_ORDER.iter().map(|r| f.string(r)).collect();
        assert_eq!(roles, ["ps", "worker", "chief", "evaluator"]);
        assert_eq!(f.int("port"), 2222);
    }

    #[test]
    fn strings_are_escaped_like_go() {
        let mut s = String::new();
        push_go_json_string(&mut s, "a\"b\\c<d>&e\u{2028}\u{1}\u{8}\u{c}\n\r\tz\u{7f}é");
        assert_eq!(s, r#""a\"b\\c\u003cd\u003e\u0026e\u2028\u0001\b\f\n\r\tz"#.to_owned() + "\u{7f}é\"");
    }
}
