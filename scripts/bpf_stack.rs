//! Loads every BPF program of every skeleton memtrail builds, with verifier
//! statistics on, and checks each program's stack depth against a budget.
//!
//! Run by `scripts/check-bpf-stack.sh`, which owns the budget and passes it
//! as `--budget BYTES`. A program's depth is the sum of the per-subprogram
//! numbers on the verifier's `stack depth` line (`stack depth 24+0+16`): an
//! upper bound on any call chain's combined frames, which the kernel caps at
//! 512 bytes.
//!
//! Loading is the check that every program verifies on this kernel; nothing
//! is attached or pinned, and everything is unloaded when the process exits.
//!
//! Exit status: 0 when every program loads within the budget, 1 when one is
//! over it or fails to load, 2 on bad usage.

use std::collections::BTreeSet;
use std::io::{self, Write};
use std::mem::MaybeUninit;
use std::process::ExitCode;
use std::sync::Mutex;

use anyhow::{Context, bail};
use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{OpenObject, PrintLevel};
use memtrail::skel;

/// Verifier log level 4 (`BPF_LOG_STATS`): statistics only, no per-insn log.
const LOG_STATS: u32 = 4;

/// What libbpf said while loading the current object.
static LIBBPF_LOG: Mutex<String> = Mutex::new(String::new());

fn capture(_level: PrintLevel, msg: String) {
    LIBBPF_LOG
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .push_str(&msg);
}

/// One program's verdict.
struct Row {
    object: &'static str,
    program: String,
    /// Per-subprogram depths as the verifier printed them.
    frames: String,
    total: u64,
}

/// Opens the skeleton `builder` makes, turns on verifier statistics for
/// every program, loads it, and reads each program's stack depth.
fn check<'obj, B>(
    object: &'static str,
    builder: B,
    storage: &'obj mut MaybeUninit<OpenObject>,
) -> anyhow::Result<Vec<Row>>
where
    B: SkelBuilder<'obj>,
{
    let mut open = builder
        .open(storage)
        .with_context(|| format!("opening {object}"))?;
    let mut names = Vec::new();
    for mut prog in open.open_object_mut().progs_mut() {
        prog.set_log_level(LOG_STATS);
        names.push(prog.name().to_string_lossy().into_owned());
    }
    LIBBPF_LOG
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .clear();
    let loaded = open.load();
    let log = std::mem::take(
        &mut *LIBBPF_LOG
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()),
    );
    if let Err(err) = loaded {
        bail!("loading {object} failed: {err}\n{log}");
    }
    names
        .into_iter()
        .map(|program| {
            let frames = stack_depth(&log, &program)
                .with_context(|| format!("no `stack depth` for {object}/{program} in:\n{log}"))?;
            let total = frames
                .split('+')
                .map(|n| n.trim().parse::<u64>())
                .sum::<Result<u64, _>>()
                .with_context(|| format!("bad stack depth {frames:?} for {object}/{program}"))?;
            Ok(Row {
                object,
                program,
                frames,
                total,
            })
        })
        .collect()
}

/// The `A+B+…` of the `stack depth` line in `program`'s load log.
fn stack_depth(log: &str, program: &str) -> Option<String> {
    let begin = format!("prog '{program}': -- BEGIN PROG LOAD LOG --");
    let start = log.find(&begin)? + begin.len();
    let body = &log[start..];
    let body = &body[..body.find("-- END PROG LOAD LOG --")?];
    body.lines()
        .find_map(|line| line.trim().strip_prefix("stack depth "))
        .map(str::to_owned)
}

/// The `bpf/*.bpf.c` sources, by stem.
fn sources() -> anyhow::Result<BTreeSet<String>> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/bpf");
    let mut out = BTreeSet::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("listing {dir}"))? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if let Some(stem) = name.strip_suffix(".bpf.c") {
            out.insert(stem.to_owned());
        }
    }
    Ok(out)
}

fn budget_arg() -> Option<u64> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [flag, bytes] if flag == "--budget" => bytes.parse().ok(),
        _ => None,
    }
}

fn run(budget: u64) -> anyhow::Result<bool> {
    libbpf_rs::set_print(Some((PrintLevel::Debug, capture)));
    let mut rows = Vec::new();

    // Every skeleton of src/skel.rs; `sources` below catches one missing.
    let mut storage = MaybeUninit::uninit();
    let builder = skel::memtrail::MemtrailSkelBuilder::default();
    rows.extend(check("memtrail", builder, &mut storage)?);
    let mut storage = MaybeUninit::uninit();
    let builder = skel::ringtest::RingtestSkelBuilder::default();
    rows.extend(check("ringtest", builder, &mut storage)?);
    let mut storage = MaybeUninit::uninit();
    let builder = skel::floor::FloorSkelBuilder::default();
    rows.extend(check("floor", builder, &mut storage)?);
    let checked: BTreeSet<&str> = rows.iter().map(|row| row.object).collect();

    let missing: Vec<String> = sources()?
        .into_iter()
        .filter(|stem| !checked.contains(stem.as_str()))
        .collect();
    if !missing.is_empty() {
        bail!(
            "bpf/{{{}}}.bpf.c not checked: add its skeleton to scripts/bpf_stack.rs",
            missing.join(",")
        );
    }

    let mut out = io::stdout().lock();
    let width = rows
        .iter()
        .map(|r| r.object.len() + 1 + r.program.len())
        .max()
        .unwrap_or(0);
    writeln!(out, "{:width$}  {:>5}  frames", "program", "stack")?;
    let mut ok = true;
    for row in &rows {
        let over = row.total > budget;
        ok &= !over;
        writeln!(
            out,
            "{:width$}  {:>5}  {}{}",
            format!("{}/{}", row.object, row.program),
            row.total,
            row.frames,
            if over { "  OVER BUDGET" } else { "" },
        )?;
    }
    writeln!(
        out,
        "{} programs loaded; budget {budget} bytes: {}",
        rows.len(),
        if ok { "all within" } else { "EXCEEDED" }
    )?;
    Ok(ok)
}

fn main() -> ExitCode {
    let Some(budget) = budget_arg() else {
        let _ = writeln!(io::stderr().lock(), "usage: bpf_stack --budget BYTES");
        return ExitCode::from(2);
    };
    match run(budget) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(err) => {
            let _ = writeln!(io::stderr().lock(), "bpf_stack: {err:#}");
            ExitCode::from(1)
        }
    }
}
