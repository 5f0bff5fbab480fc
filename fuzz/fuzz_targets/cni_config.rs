//! The network configuration a container runtime (or Multus) writes on weft-cni's stdin,
//! read by `NetConf::parse` for each CNI command. The first byte picks the command and whether
//! `CNI_ARGS` carried a `MAC`; the rest is stdin.
#![no_main]
use libfuzzer_sys::fuzz_target;
use weft_cni::conf::NetConf;
use weft_cni::env::Command;

const COMMANDS: [Command; 6] =
    [Command::Add, Command::Del, Command::Check, Command::Status, Command::Version, Command::Gc];

fuzz_target!(|data: &[u8]| {
    let Some((&knob, stdin)) = data.split_first() else { return };
    let command = COMMANDS[usize::from(knob & 7) % COMMANDS.len()];
    let mac = (knob & 8 != 0).then_some("02:00:00:00:00:01");
    let _ = NetConf::parse(stdin, command, mac);
});
