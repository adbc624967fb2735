//! Loads every BPF program of every skeleton memtrail builds, with verifier
//! statistics on, and checks each program's stack depth against a budget.
//!
//! Run by `scripts/check-bpf-stack.sh`, which owns the budget and passes it
//! as `--budget BYTES`. A program's depth is its deepest call chain's, the
//! combined frames the kernel caps at 512 bytes: the verifier's `stack
//! depth` line gives each subprogram's frame (`stack depth 24+0+16`, in the
//! order of their first instructions), and the instructions libbpf loaded
//! say which subprogram calls which (BPF-to-BPF calls, and callbacks handed
//! to helpers such as `bpf_loop`, whose frames stack on their caller's).
//! The verifier drops subprograms it found unreachable (given the
//! program's read-only constants) before it prints: where the instructions
//! have more subprograms than the line has frames, every way of matching
//! the frames to them in order is tried and the deepest result stands, an
//! upper bound. (Before, the sum of every frame stood for the program:
//! every helper subprogram counted as if all were on one chain.)
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
use libbpf_rs::skel::{OpenSkel, Skel, SkelBuilder};
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
    let loaded = match loaded {
        Ok(loaded) => loaded,
        Err(err) => bail!("loading {object} failed: {err}\n{log}"),
    };
    names
        .into_iter()
        .map(|program| {
            let frames = stack_depth(&log, &program)
                .with_context(|| format!("no `stack depth` for {object}/{program} in:\n{log}"))?;
            let depths = frames
                .split('+')
                .map(|n| n.trim().parse::<u64>())
                .collect::<Result<Vec<u64>, _>>()
                .with_context(|| format!("bad stack depth {frames:?} for {object}/{program}"))?;
            let insns = loaded
                .object()
                .progs()
                .find(|p| p.name().to_string_lossy() == program)
                .map(|p| p.insns().to_vec())
                .with_context(|| format!("no instructions for {object}/{program}"))?;
            let total = deepest_chain(&insns, &depths).with_context(|| {
                format!("{object}/{program}: its calls do not match the frames {frames}")
            })?;
            Ok(Row {
                object,
                program,
                frames,
                total,
            })
        })
        .collect()
}

/// BPF_JMP | BPF_CALL, and its `src_reg` for a call of a subprogram.
const CALL: u8 = 0x85;
const PSEUDO_CALL: u8 = 1;
/// BPF_LD | BPF_IMM | BPF_DW, and its `src_reg` for a subprogram's address
/// (a callback).
const LD_IMM64: u8 = 0x18;
const PSEUDO_FUNC: u8 = 4;

/// The deepest chain of frames from the program's entry, given the
/// instructions libbpf loaded and the frames the verifier printed for the
/// subprograms it kept (ordered by first instruction). None when there are
/// more frames than subprograms, or the calls form a cycle (the verifier
/// rejects recursion: a misreading).
fn deepest_chain(insns: &[libbpf_sys::bpf_insn], frames: &[u64]) -> Option<u64> {
    // Every call or callback target starts a subprogram; so does 0.
    let target = |i: usize, insn: &libbpf_sys::bpf_insn| {
        let sub = (insn.code == CALL && insn.src_reg() == PSEUDO_CALL)
            || (insn.code == LD_IMM64 && insn.src_reg() == PSEUDO_FUNC);
        sub.then(|| (i as i64 + 1 + i64::from(insn.imm)) as usize)
    };
    let mut starts: Vec<usize> = std::iter::once(0)
        .chain(insns.iter().enumerate().filter_map(|(i, x)| target(i, x)))
        .collect();
    starts.sort_unstable();
    starts.dedup();
    if frames.is_empty() || starts.len() < frames.len() {
        return None;
    }
    let sub_of = |i: usize| starts.partition_point(|&s| s <= i) - 1;
    let mut calls: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); starts.len()];
    for (i, insn) in insns.iter().enumerate() {
        if let Some(t) = target(i, insn) {
            calls[sub_of(i)].insert(sub_of(t));
        }
    }
    fn deepest(
        sub: usize,
        depth: &[u64],
        calls: &[BTreeSet<usize>],
        path: &mut [bool],
    ) -> Option<u64> {
        if std::mem::replace(&mut path[sub], true) {
            return None;
        }
        let mut below = 0;
        for &callee in &calls[sub] {
            below = below.max(deepest(callee, depth, calls, path)?);
        }
        path[sub] = false;
        Some(depth[sub] + below)
    }
    // Subprogram 0 is the entry, never dropped; choose which of the others
    // the verifier kept, in order, the rest with no frame.
    fn each_match(
        next_sub: usize,
        next_frame: usize,
        frames: &[u64],
        depth: &mut Vec<u64>,
        visit: &mut dyn FnMut(&[u64]) -> Option<()>,
    ) -> Option<()> {
        let (subs, left) = (depth.len() - next_sub, frames.len() - next_frame);
        if left == 0 {
            depth[next_sub..].fill(0);
            return visit(depth);
        }
        if subs > left {
            depth[next_sub] = 0;
            each_match(next_sub + 1, next_frame, frames, depth, visit)?;
        }
        depth[next_sub] = frames[next_frame];
        each_match(next_sub + 1, next_frame + 1, frames, depth, visit)
    }
    let mut depth = vec![0; starts.len()];
    depth[0] = frames[0];
    let mut worst = 0;
    each_match(1, 1, frames, &mut depth, &mut |depth| {
        let mut path = vec![false; depth.len()];
        worst = worst.max(deepest(0, depth, &calls, &mut path)?);
        Some(())
    })?;
    Some(worst)
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
