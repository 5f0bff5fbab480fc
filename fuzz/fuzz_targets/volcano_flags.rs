//! The arguments of a Volcano Job's plugins (`spec.plugins`), read as Go's flag package reads
//! them (`weft_jobs::flags::parse`) against each plugin's flags, in both modes: Volcano's own
//! (lenient) and weft's flavour (Volcano's flags plus weft's, strict). The first byte picks the
//! plugin and the mode; the rest is the arguments, separated by NUL bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;
use weft_jobs::flags::{self, FlagDef, Mode};
use weft_jobs::plugins;

fn defs(which: u8) -> Vec<FlagDef> {
    let (volcano, extra): (&[FlagDef], &[FlagDef]) = match which % 9 {
        0 => (plugins::env::FLAGS, &[]),
        1 => (plugins::hcclrank::FLAGS, &[]),
        2 => (plugins::mpi::FLAGS, plugins::mpi::WEFT_EXTRA_FLAGS),
        3 => (plugins::mxnet::FLAGS, &[]),
        4 => (plugins::pytorch::FLAGS, plugins::pytorch::WEFT_EXTRA_FLAGS),
        5 => (plugins::ray::FLAGS, plugins::ray::WEFT_EXTRA_FLAGS),
        6 => (plugins::ssh::FLAGS, &[]),
        7 => (plugins::svc::FLAGS, &[]),
        _ => (plugins::tensorflow::FLAGS, &[]),
    };
    volcano.iter().chain(extra).cloned().collect()
}

fuzz_target!(|data: &[u8]| {
    let Some((&knob, rest)) = data.split_first() else { return };
    // The arguments arrive as JSON strings in the Job, so they are valid UTF-8.
    let Ok(text) = std::str::from_utf8(rest) else { return };
    let args: Vec<String> = if text.is_empty() { Vec::new() } else { text.split('\0').map(str::to_owned).collect() };
    let mode = if knob & 0x80 == 0 { Mode::Lenient } else { Mode::Strict };
    let defs = defs(knob & 0x7f);
    if let Ok((flags, _)) = flags::parse(&defs, &args, mode) {
        for d in &defs {
            let _ = flags.display(d.name);
        }
    }
});
