//! `weft`: one binary, one subcommand per component. See `weft --help`.

#[macro_use]
mod output;

mod cmd_agent;
mod cmd_controller;
mod cmd_crds;
mod cmd_extender;
mod cmd_gpu;
mod cmd_install_cni;
mod cmd_jobs;
mod cmd_sim;
mod cmd_sim_jobs;
mod cmd_sim_matrix;
mod cmd_sim_optimum;
mod cmd_sim_report;
mod cmd_topo;
mod cmd_wait;
mod cmd_webhook;
mod component;
mod cpu_gate;
mod duration_arg;
mod kube_args;

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// weft places and wires accelerated workloads on Kubernetes.
///
/// It picks nodes and GPU sets from the real NVLink/PCIe topology, serves that decision to
/// kube-scheduler, and simulates it on an embedded cluster so you can see what it would do.
///
/// Start with `weft simulate` (no cluster needed), then look at a node with
/// `weft topo show <nvidia-smi-topo-m.txt>`.
#[derive(Parser, Debug)]
#[command(name = "weft", version, propagate_version = true, max_term_width = 110)]
struct Cli {
    /// Log filter (tracing EnvFilter syntax), e.g. `info` or `weft_extender=debug`. Logs go to stderr.
    #[arg(long, global = true, env = "WEFT_LOG", default_value = "warn")]
    log: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Simulate weft's GPU placement on a cluster model against topology-blind baselines.
    ///
    /// With no arguments, runs the embedded default: 88 nodes of 8 kinds (DGX-1 V100, DGX/HGX A100,
    /// HGX H100, NVLink-bridged and PCIe-only nodes) and 5,000 pods of 1, 2, 4 and 8 GPUs arriving
    /// and leaving. Reports per policy: pods placed, the bandwidth between the GPUs each pod got,
    /// fragmentation and run time.
    Simulate(cmd_sim::SimulateArgs),
    /// Read, convert and draw node topologies; discover and publish the local one.
    #[command(subcommand)]
    Topo(cmd_topo::TopoCommand),
    /// Allocate GPU sets on a node and score nodes for a pod.
    #[command(subcommand)]
    Gpu(cmd_gpu::GpuCommand),
    /// Serve kube-scheduler's extender verbs (`/filter`, `/prioritize`, `/bind`) and vc-scheduler's
    /// extender plugin (`/volcano/predicate`, `/volcano/prioritize`, `/volcano/allocate`,
    /// `/volcano/deallocate`) from node topology annotations and the pods bound to each node.
    ///
    /// weft binds the GPU pods it manages, writing their GPU decision (`weft.io/gpu-ids`) with the
    /// Binding: kube-scheduler's extender stanza needs `filterVerb: filter`, `prioritizeVerb:
    /// prioritize` and `bindVerb: bind`. Without `bindVerb` kube-scheduler binds the pods itself and
    /// none gets its GPUs. See docs/scheduler-extender.md for the whole KubeSchedulerConfiguration
    /// (deploy/base/scheduler-extender/kube-scheduler-config.yaml).
    SchedulerExtender(cmd_extender::ExtenderArgs),
    /// The node agent (DaemonSet): keeps this node's `weft.io/gpu-topology` annotation current
    /// (discovered at start, every --interval, and whenever someone changes the annotation), and
    /// with --mode runs the resource manager: exclusive CPUs for Guaranteed integer-CPU pods aligned
    /// with their GPUs and NICs, enforced through NRI or cgroup files (docs/agent.md). Serves
    /// /healthz, /readyz and /metrics on --ops-listen.
    Agent(Box<cmd_agent::AgentArgs>),
    /// The cluster controllers (Deployment): the NumaNetwork controller, which validates each
    /// NumaNetwork, makes its ResourceClaimTemplates where pipelines use it and accounts its
    /// addresses (docs/numanetwork.md); the job controller, which keeps the job-level objects of
    /// weft's plugins on Volcano Jobs (annotation `weft.io/job-plugins`: hosts and hostfile
    /// ConfigMaps, the ssh Secret, Services, NetworkPolicies) in line with each job and deletes them
    /// when it ends; and, when asked, the DNS registrar (docs/dns.md). --controllers picks which
    /// run. With --leader-elect only the replica holding the Lease acts. Serves /healthz, /readyz
    /// and /metrics on --ops-listen; --dranet-profile-provider also serves dranet's profile provider.
    Controller(cmd_controller::ControllerArgs),
    /// Print weft's CustomResourceDefinitions (NumaNetwork), generated from its Rust types, or
    /// write or check a committed copy (`weft crds --check deploy/base/crds/<name>.yaml`).
    Crds(cmd_crds::CrdsArgs),
    /// Admission webhook (Deployment) for Volcano Jobs and their pods: Job defaults and plugin
    /// dependencies, strict validation of weft's plugins (annotation `weft.io/job-plugins`), and
    /// weft's plugins applied to each pod. HTTPS on --listen; /healthz, /readyz, /metrics on
    /// --ops-listen.
    Webhook(cmd_webhook::WebhookArgs),
    /// See the pods and objects a Volcano Job will get from Volcano's plugins and weft's.
    #[command(subcommand)]
    Jobs(cmd_jobs::JobsCommand),
    /// Wait until every HOST:PORT resolves and accepts a TCP connection (the launch-order init
    /// container weft's job plugins add). Exits 1 after --timeout seconds.
    WaitFor(cmd_wait::WaitArgs),
    /// Install the CNI plugin binary on the host: copy --from (the image's weft-cni) into --to (the
    /// host's CNI bin dir, mounted) as --name, atomically (temporary file, fsync, 0755, rename), and
    /// leave an identical file alone. The SR-IOV component's init container (docs/sriov.md).
    InstallCni(cmd_install_cni::InstallCniArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter =
        tracing_subscriber::EnvFilter::try_new(&cli.log).unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    // Colour only for a person at a terminal (not in `kubectl logs`); a log line that cannot be
    // written (stderr closed) is dropped, never reported on that same stderr (which would panic).
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .log_internal_errors(false)
        .init();
    let result = match cli.command {
        Command::Simulate(args) => cmd_sim::run(args),
        Command::Topo(cmd) => cmd_topo::run(cmd),
        Command::Gpu(cmd) => cmd_gpu::run(cmd),
        Command::SchedulerExtender(a) => cmd_extender::run(a),
        Command::Agent(a) => cmd_agent::run(*a),
        Command::Controller(a) => cmd_controller::run(a),
        Command::Crds(a) => cmd_crds::run(a),
        Command::Webhook(a) => cmd_webhook::run(a),
        Command::Jobs(c) => cmd_jobs::run(c),
        Command::WaitFor(a) => cmd_wait::run(a),
        Command::InstallCni(a) => cmd_install_cni::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // The reader of our output went away (`weft … | head`): nothing left to say, and no one
        // to say it to.
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            // The error and its causes, each cause left out when the message already holds its text.
            let err: &(dyn std::error::Error + 'static) = e.as_ref();
            component::note(format_args!("error: {}", weft_kube::controller::ErrorChain(err)));
            ExitCode::from(2)
        }
    }
}

/// Whether `e` (or one of its causes) is a write to a closed pipe.
fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe))
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn command_line_definition_is_consistent() {
        // clap checks argument names, ids, defaults and conflicts here rather than at first use.
        super::Cli::command().debug_assert();
    }
}
