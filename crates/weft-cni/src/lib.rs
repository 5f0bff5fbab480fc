//! weft-cni: weft's CNI plugin for SR-IOV VFs (CNI spec 1.1; 0.3.0 to 1.1.0 results).
//!
//! One exec per call. [`run`] reads the environment and stdin, does the command and returns what
//! goes to stdout with the exit code; nothing happens before the environment is parsed, VERSION
//! and STATUS need no runtime, and the other commands get a current-thread tokio runtime for
//! netlink (and, in chained mode, the kubelet's PodResources gRPC).
//!
//! - [`env`]: `CNI_*` variables per command, `CNI_ARGS`;
//! - [`conf`]: the network configuration, every field checked by name;
//! - [`plugin`]: ADD, DEL, CHECK, GC, STATUS, with rollback;
//! - [`attach`]: a VF's netdev into a pod's namespace and back (shared with weft's NIC DRA
//!   driver);
//! - [`net`]: namespaces and rtnetlink calls; [`pf`]: the VF's PF-side settings ([`PfControl`]);
//! - [`ipam`], [`delegate`], [`store`]: delegated IPAM and weft's own range;
//! - [`state`]: the cache files; [`result`]: results per version; [`podres`]: chained mode.
//!
//! `docs/cni.md` describes the configuration, the modes and the error codes.

pub mod attach;
pub mod conf;
pub mod delegate;
pub mod env;
pub mod error;
pub mod ipam;
pub mod net;
pub mod pf;
pub mod plugin;
pub mod podres;
pub mod result;
pub mod state;
pub mod store;
pub mod version;

use serde_json::Value;

pub use error::{CniError, code};
pub use pf::{FakePfControl, NetlinkPfControl, PfControl};

use crate::conf::NetConf;
use crate::env::{CniEnv, Command};
use crate::plugin::Plugin;
use crate::version::Version;

/// What the process prints and how it exits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// stdout (empty when the command has no output).
    pub stdout: String,
    /// The exit code.
    pub exit_code: u8,
    /// The error, for stderr.
    pub error: Option<CniError>,
}

/// Run one invocation: the environment through `lookup`, the configuration on `stdin`, the PF
/// through `pf`.
pub fn run<P: PfControl>(lookup: impl Fn(&str) -> Option<String>, stdin: &[u8], pf: &P) -> Outcome {
    match execute(lookup, stdin, pf) {
        Ok(Some(v)) => Outcome { stdout: v.to_string(), exit_code: 0, error: None },
        Ok(None) => Outcome { stdout: String::new(), exit_code: 0, error: None },
        Err(e) => {
            let version = conf::peek_version(stdin).and_then(|v| Version::parse(&v)).unwrap_or(Version::LATEST);
            Outcome { stdout: e.to_json(version.as_str()).to_string(), exit_code: 1, error: Some(e) }
        }
    }
}

/// Run one invocation: the JSON answer (ADD's result, VERSION's), `None` for commands without
/// output, or the error.
pub fn execute<P: PfControl>(
    lookup: impl Fn(&str) -> Option<String>,
    stdin: &[u8],
    pf: &P,
) -> Result<Option<Value>, CniError> {
    let env = CniEnv::from_lookup(lookup)?;
    if env.command == Command::Version {
        return Ok(Some(version::version_answer(stdin)));
    }
    let conf = NetConf::parse(stdin, env.command, env.args.mac.as_deref())?;
    if env.command == Command::Status {
        return plugin::status(&env, &conf, stdin).map(|()| None);
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CniError::io("starting the runtime", &e))?;
    runtime.block_on(async {
        let plugin = Plugin::new(&env, &conf, stdin, pf)?;
        match env.command {
            Command::Add => plugin.add().await.map(|r| Some(r.to_json(conf.version))),
            Command::Del => plugin.del().await.map(|()| None),
            Command::Check => plugin.check().await.map(|()| None),
            Command::Gc => plugin.gc().await.map(|()| None),
            Command::Status | Command::Version => Ok(None),
        }
    })
}

/// Read a configuration (exposed for tools that validate NetworkAttachmentDefinitions).
pub fn parse_config(stdin: &[u8]) -> Result<NetConf, CniError> {
    NetConf::parse(stdin, Command::Add, None)
}
