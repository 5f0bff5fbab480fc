//! Helpers the plugins share: argument parsing in either flavor, role tasks, ports, GPU counts.

use k8s_openapi::api::core::v1::{Container, ContainerPort, EnvVar};

use crate::flags::{self, FlagDef, FlagError, Flags, Mode};
use crate::job::{Job, TaskSpec};
use crate::plugin::{BuildInput, Flavor, PluginError};

/// The extended resource weft counts as GPUs.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";

/// Parses a plugin's arguments: Volcano's flags leniently for [`Flavor::Volcano`] (the error, if
/// any, comes back as a warning); Volcano's flags followed by `weft_extra` strictly for
/// [`Flavor::Weft`].
pub(crate) fn parse_args(
    plugin: &'static str,
    volcano_flags: &[FlagDef],
    weft_extra: &[FlagDef],
    input: &BuildInput<'_>,
) -> Result<(Flags, Vec<String>), PluginError> {
    let weft_flags: Vec<FlagDef>;
    let (defs, mode) = match input.flavor {
        Flavor::Weft if !weft_extra.is_empty() => {
            weft_flags = volcano_flags.iter().chain(weft_extra).cloned().collect();
            (weft_flags.as_slice(), Mode::Strict)
        }
        Flavor::Weft => (volcano_flags, Mode::Strict),
        Flavor::Volcano => (volcano_flags, Mode::Lenient),
    };
    let (flags, warning) =
        flags::parse(defs, input.args, mode).map_err(|source| PluginError::Args { plugin, source })?;
    let warnings = warning.iter().map(|e| lenient_warning(plugin, e, &flags)).collect();
    Ok((flags, warnings))
}

/// The warning for an argument problem Volcano goes on from, saying what it goes on with.
fn lenient_warning(plugin: &str, e: &FlagError, flags: &Flags) -> String {
    match e {
        FlagError::BadValue { flag, .. } | FlagError::OutOfRange { flag, .. } => format!(
            "plugin {plugin}: {e}; Volcano only logs this and goes on with -{flag}={} (what Go's flag package stores \
             for it), the flags before it as given and the rest at their defaults",
            flags.display(flag)
        ),
        FlagError::Positional { .. } => {
            format!("plugin {plugin}: {e}; Volcano goes on with the flags before it, the rest at their defaults")
        }
        _ => format!(
            "plugin {plugin}: {e}; Volcano only logs this and goes on: flags before it keep their values, the rest their \
             defaults"
        ),
    }
}

/// In Volcano's flavor, what a port flag outside 1..=65535 does to the pods (`None` for a port).
pub(crate) fn volcano_port_warning(plugin: &str, flag: &str, port: i64, consequence: &str) -> Option<String> {
    (!(1..=65535).contains(&port)).then(|| {
        format!("plugin {plugin}: Volcano will use port {port} (-{flag}), which is no TCP port: {consequence}")
    })
}

/// The consequence of a port outside 1..=65535 that Volcano puts on a container.
pub(crate) const CONTAINER_PORT_REJECTED: &str =
    "the API server rejects the pod (containerPort must be between 1 and 65535)";

/// Rejects a port flag outside 1..=65535.
pub(crate) fn check_port(plugin: &'static str, flag: &str, port: i64) -> Result<(), PluginError> {
    if (1..=65535).contains(&port) {
        Ok(())
    } else {
        Err(PluginError::Invalid {
            plugin,
            message: format!("flag -{flag} must be a port from 1 to 65535, not {port}"),
        })
    }
}

/// `s` as one shell word: unchanged when it needs no quoting (every DNS name does, so Volcano's
/// command lines stay byte for byte), single-quoted otherwise.
pub(crate) fn shell_word(s: &str) -> String {
    // try_quote fails only on a NUL byte, which no Kubernetes name contains; drop it then.
    shlex::try_quote(s).map_or_else(|_| shell_word(&s.replace('\0', "")), std::borrow::Cow::into_owned)
}

/// Go's `int32(n)`: the low 32 bits (Volcano converts its int port flags this way).
pub(crate) fn go_int32(n: i64) -> i32 {
    n as i32
}

/// A literal env var.
pub(crate) fn env(name: &str, value: &str) -> EnvVar {
    EnvVar { name: name.to_owned(), value: Some(value.to_owned()), value_from: None }
}

/// Adds `{name, containerPort: port}` to the container unless it already exposes that port number
/// (what Volcano's plugins do).
pub(crate) fn open_port(c: &mut Container, name: &str, port: i32) {
    let ports = c.ports.get_or_insert_with(Vec::new);
    if !ports.iter().any(|p| p.container_port == port) {
        ports.push(ContainerPort { name: Some(name.to_owned()), container_port: port, ..Default::default() });
    }
}

/// The container's `nvidia.com/gpu` limit, else its request, when it is a whole number > 0.
pub(crate) fn container_gpus(c: &Container) -> Option<u64> {
    let resources = c.resources.as_ref()?;
    let quantity = resources
        .limits
        .as_ref()
        .and_then(|l| l.get(GPU_RESOURCE))
        .or_else(|| resources.requests.as_ref().and_then(|r| r.get(GPU_RESOURCE)))?;
    quantity.0.trim().parse::<u64>().ok().filter(|n| *n > 0)
}

/// GPUs per pod of a task: the sum over its template's containers of [`container_gpus`].
pub(crate) fn task_gpus(task: &TaskSpec) -> u64 {
    task.template.spec.as_ref().map_or(0, |s| s.containers.iter().filter_map(container_gpus).sum())
}

/// The job's task named `name`, or the strict error naming the flag.
pub(crate) fn require_task<'j>(
    plugin: &'static str,
    flag: &'static str,
    name: &str,
    job: &'j Job,
) -> Result<&'j TaskSpec, PluginError> {
    job.task(name).ok_or_else(|| PluginError::missing_task(plugin, flag, name, job))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_words_leave_dns_names_alone_and_quote_the_rest() {
        assert_eq!(shell_word("j-head-0.j:6379"), "j-head-0.j:6379");
        assert_eq!(shell_word("h$(id)"), "'h$(id)'");
        // Whatever it is, a shell reads it back as the one word it was.
        for s in ["h$(id)", "a b", "it's", "`rm -rf /`", "x;y&&z|w", "\"q\"", "$HOME"] {
            assert_eq!(shlex::split(&shell_word(s)), Some(vec![s.to_owned()]), "{s}");
        }
    }
}
