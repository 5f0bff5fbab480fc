//! The `weft-cni` executable: a CNI plugin, run by the container runtime (or Multus) once per
//! call with `CNI_*` in the environment and the network configuration on stdin.

use std::io::{IsTerminal, Read, Write};
use std::process::ExitCode;

use weft_cni::NetlinkPfControl;
use weft_cni::version::SUPPORTED;

fn main() -> ExitCode {
    let mut stdin = Vec::new();
    let input = std::io::stdin();
    // A runtime always pipes the configuration; a terminal means a person ran it by hand.
    if !input.is_terminal()
        && let Err(e) = input.lock().read_to_end(&mut stdin)
    {
        let err = weft_cni::CniError::io("reading the network configuration from stdin", &e);
        println!("{}", err.to_json(weft_cni::version::Version::LATEST.as_str()));
        eprintln!("weft-cni: {err}");
        return ExitCode::FAILURE;
    }
    if std::env::var_os("CNI_COMMAND").is_none() {
        eprintln!(
            "weft-cni {}: CNI plugin for SR-IOV VFs; CNI protocol versions supported: {}",
            env!("CARGO_PKG_VERSION"),
            SUPPORTED.join(", ")
        );
    }
    let out = weft_cni::run(|k| std::env::var(k).ok(), &stdin, &NetlinkPfControl);
    if !out.stdout.is_empty() {
        let mut stdout = std::io::stdout().lock();
        let _ = writeln!(stdout, "{}", out.stdout);
        let _ = stdout.flush();
    }
    if let Some(e) = &out.error {
        eprintln!("weft-cni: {e}");
    }
    ExitCode::from(out.exit_code)
}
