//! Where BPF load time goes: loads memtrail's BPF object once per unwind
//! mode with the verifier's statistics on (`BPF_LOG_STATS`) and prints, per
//! program, the verification time and the instructions it processed.
//!
//! ```sh
//! cargo bench --bench verifier_stats            # auto, dwarf and fp
//! ```
//! Needs root (or CAP_BPF + CAP_PERFMON). Numbers in perf/RESULTS.md.

#![allow(clippy::print_stdout)]

use std::collections::BTreeMap;
use std::io::Write;
use std::mem::MaybeUninit;
use std::sync::Mutex;
use std::time::Instant;

use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{OpenObject, PrintLevel};
use memtrail::internals::bpf::skel::memtrail::MemtrailSkelBuilder;
use memtrail::internals::profile::unwind::Mode as UnwindMode;

/// The logs libbpf printed since the last take.
static LOG: Mutex<String> = Mutex::new(String::new());

fn capture(_level: PrintLevel, msg: String) {
    LOG.lock().unwrap_or_else(|e| e.into_inner()).push_str(&msg);
}

/// (verification µs, processed insns) per program, from libbpf's print of
/// each program's load log.
fn stats(log: &str) -> BTreeMap<String, (u64, u64)> {
    let mut out = BTreeMap::new();
    let mut prog = None;
    for line in log.lines() {
        if let Some(rest) = line.strip_prefix("libbpf: prog '") {
            prog = rest.split('\'').next().map(str::to_owned);
        }
        let Some(name) = prog.clone() else { continue };
        let entry = out.entry(name).or_insert((0, 0));
        if let Some(t) = line.strip_prefix("verification time ") {
            entry.0 = t
                .split(' ')
                .next()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
        }
        if let Some(p) = line.strip_prefix("processed ") {
            entry.1 = p
                .split(' ')
                .next()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
        }
    }
    out
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    libbpf_rs::set_print(Some((PrintLevel::Debug, capture)));
    let mut out = std::io::stdout().lock();
    writeln!(out, "| mode | program | verification | processed insns |")?;
    writeln!(out, "|---|---|---:|---:|")?;
    for (name, mode) in [
        ("auto", UnwindMode::Auto),
        ("dwarf", UnwindMode::Dwarf),
        ("fp", UnwindMode::Fp),
    ] {
        LOG.lock().unwrap_or_else(|e| e.into_inner()).clear();
        let mut storage = MaybeUninit::<OpenObject>::uninit();
        let mut open = MemtrailSkelBuilder::default().open(&mut storage)?;
        open.maps
            .rodata_data
            .as_deref_mut()
            .expect("the BPF object has .rodata tunables")
            .unwind_mode = memtrail::internals::bpf::record::unwind_mode(mode);
        for mut prog in open.open_object_mut().progs_mut() {
            prog.set_log_level(4);
        }
        let started = Instant::now();
        let skel = open.load()?;
        let took = started.elapsed();
        drop(skel);
        let log = std::mem::take(&mut *LOG.lock().unwrap_or_else(|e| e.into_inner()));
        let mut total = (0, 0);
        for (prog, (us, insns)) in stats(&log) {
            total = (total.0 + us, total.1 + insns);
            writeln!(
                out,
                "| {name} | {prog} | {:.1} ms | {insns} |",
                us as f64 / 1e3
            )?;
        }
        writeln!(
            out,
            "| {name} | **all ({:.1} ms wall)** | {:.1} ms | {} |",
            took.as_secs_f64() * 1e3,
            total.0 as f64 / 1e3,
            total.1
        )?;
    }
    Ok(())
}
