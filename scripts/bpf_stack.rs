//! Loads every BPF program of every skeleton memtrail builds, with verifier
//! statistics on, and checks each program's stack depth against a budget.
//!
//! Run by `scripts/check-bpf-stack.sh`, which owns the budget and passes it
//! as `--budget BYTES`. A program's depth is its deepest call chain's, the
//! combined frames the kernel caps at 512 bytes. The verifier's `stack
//! depth` line gives the frame of each subprogram it kept (`stack depth
//! 24+0+16`), in the order of the kernel's `func_info` for the loaded
//! program, whose BTF type ids name them; libbpf's `func_info` and
//! instructions for the same program say where each subprogram starts and
//! which calls which (BPF-to-BPF calls, and callbacks handed to helpers
//! such as `bpf_loop`, whose frames stack on their caller's). A subprogram
//! the verifier dropped as unreachable has no frame. (Before, the sum of
//! every frame stood for the program, as if all were on one chain.)
//!
//! memtrail's object is loaded with every feature its read-only constants
//! switch on (per-CPU rings, per-process probes, pressure, PID namespace
//! translation): the deepest configuration is the one checked.
//!
//! Loading is the check that every program verifies on this kernel; nothing
//! is attached or pinned, and everything is unloaded when the process exits.
//!
//! Exit status: 0 when every program loads within the budget, 1 when one is
//! over it or fails to load, 2 on bad usage.

use std::collections::BTreeSet;
use std::io::{self, Write};
use std::mem::MaybeUninit;
use std::os::fd::AsFd;
use std::process::ExitCode;
use std::sync::Mutex;

use anyhow::{Context, bail};
use libbpf_rs::skel::{OpenSkel, Skel, SkelBuilder};
use libbpf_rs::{AsRawLibbpf, OpenObject, PrintLevel};
use memtrail::internals::bpf::skel;

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
    configure: impl FnOnce(&mut B::Output),
) -> anyhow::Result<Vec<Row>>
where
    B: SkelBuilder<'obj>,
{
    let mut open = builder
        .open(storage)
        .with_context(|| format!("opening {object}"))?;
    configure(&mut open);
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
            let prog = loaded
                .object()
                .progs()
                .find(|p| p.name().to_string_lossy() == program)
                .with_context(|| format!("no program {object}/{program} after loading"))?;
            let subprograms = libbpf_subprograms(&prog);
            let kept = kernel_subprograms(prog.as_fd())
                .with_context(|| format!("reading {object}/{program}'s func_info"))?;
            let total =
                deepest_chain(prog.insns(), &subprograms, &kept, &depths).with_context(|| {
                    format!("{object}/{program}: its subprograms do not match the frames {frames}")
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

/// Each subprogram of a loaded program as libbpf loaded it: (first
/// instruction, BTF type id), in instruction order.
fn libbpf_subprograms(prog: &libbpf_rs::Program<'_>) -> Vec<(usize, u32)> {
    let raw = prog.as_libbpf_object().as_ptr();
    // SAFETY: `raw` is a live, loaded program of a live object; libbpf
    // returns its func_info array and that array's length.
    let (info, count) = unsafe {
        (
            libbpf_sys::bpf_program__func_info(raw),
            libbpf_sys::bpf_program__func_info_cnt(raw),
        )
    };
    if info.is_null() {
        return vec![(0, 0)];
    }
    // SAFETY: libbpf's array of `count` records, alive with the program.
    let info = unsafe { std::slice::from_raw_parts(info, count as usize) };
    let mut subs: Vec<(usize, u32)> = info
        .iter()
        .map(|f| (f.insn_off as usize, f.type_id))
        .collect();
    subs.sort_unstable();
    subs
}

/// The BTF type ids of the subprograms the kernel kept, in its order (the
/// order of the verifier's `stack depth` line).
fn kernel_subprograms(fd: std::os::fd::BorrowedFd<'_>) -> anyhow::Result<Vec<u32>> {
    use std::os::fd::AsRawFd;
    let query = |info: &mut libbpf_sys::bpf_prog_info| {
        let mut len = std::mem::size_of::<libbpf_sys::bpf_prog_info>() as u32;
        // SAFETY: `info` is a bpf_prog_info of `len` bytes whose pointers,
        // if any, point to buffers of the counts it gives.
        let ret = unsafe {
            libbpf_sys::bpf_prog_get_info_by_fd(fd.as_raw_fd(), std::ptr::from_mut(info), &mut len)
        };
        if ret == 0 {
            Ok(())
        } else {
            Err(io::Error::from_raw_os_error(-ret))
        }
    };
    let mut info = libbpf_sys::bpf_prog_info::default();
    query(&mut info).context("BPF_OBJ_GET_INFO_BY_FD")?;
    let mut records = vec![libbpf_sys::bpf_func_info::default(); info.nr_func_info as usize];
    let mut info = libbpf_sys::bpf_prog_info {
        nr_func_info: records.len() as u32,
        func_info_rec_size: std::mem::size_of::<libbpf_sys::bpf_func_info>() as u32,
        func_info: records.as_mut_ptr() as u64,
        ..Default::default()
    };
    query(&mut info).context("BPF_OBJ_GET_INFO_BY_FD (func_info)")?;
    Ok(records.iter().map(|f| f.type_id).collect())
}

/// BPF_JMP | BPF_CALL, and its `src_reg` for a call of a subprogram.
const CALL: u8 = 0x85;
const PSEUDO_CALL: u8 = 1;
/// BPF_LD | BPF_IMM | BPF_DW, and its `src_reg` for a subprogram's address
/// (a callback).
const LD_IMM64: u8 = 0x18;
const PSEUDO_FUNC: u8 = 4;

/// The deepest chain of frames from the program's entry: `subprograms`
/// (libbpf's, by first instruction, with their type ids), `kept` (the type
/// ids of those the kernel kept, in the order of `frames`), the
/// instructions for the calls. None when the kernel's and the line's
/// counts differ, a kept subprogram is not libbpf's, or the calls form a
/// cycle (the verifier rejects recursion: a misreading).
fn deepest_chain(
    insns: &[libbpf_sys::bpf_insn],
    subprograms: &[(usize, u32)],
    kept: &[u32],
    frames: &[u64],
) -> Option<u64> {
    if kept.len() != frames.len() || subprograms.first()?.0 != 0 {
        return None;
    }
    let mut depth = vec![0; subprograms.len()];
    for (type_id, &frame) in kept.iter().zip(frames) {
        let sub = subprograms.iter().position(|&(_, t)| t == *type_id)?;
        depth[sub] = frame;
    }
    let sub_of = |i: usize| subprograms.partition_point(|&(start, _)| start <= i) - 1;
    let mut calls: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); subprograms.len()];
    for (i, insn) in insns.iter().enumerate() {
        let sub = (insn.code == CALL && insn.src_reg() == PSEUDO_CALL)
            || (insn.code == LD_IMM64 && insn.src_reg() == PSEUDO_FUNC);
        if sub {
            let target = usize::try_from(i as i64 + 1 + i64::from(insn.imm)).ok()?;
            calls[sub_of(i)].insert(sub_of(target));
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
    deepest(0, &depth, &calls, &mut vec![false; subprograms.len()])
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

    // Every skeleton of src/bpf/skel.rs; `sources` below catches one missing.
    let mut storage = MaybeUninit::uninit();
    let builder = skel::memtrail::MemtrailSkelBuilder::default();
    rows.extend(check("memtrail", builder, &mut storage, |open| {
        let ro = open
            .maps
            .rodata_data
            .as_deref_mut()
            .expect("memtrail's .rodata");
        ro.cpu_rings = true;
        ro.per_process = true;
        ro.pressure_enabled = true;
        ro.pidns_translate = true;
        ro.attach_hold = true;
    })?);
    let mut storage = MaybeUninit::uninit();
    let builder = skel::ringtest::RingtestSkelBuilder::default();
    rows.extend(check("ringtest", builder, &mut storage, |_| {})?);
    let mut storage = MaybeUninit::uninit();
    let builder = skel::floor::FloorSkelBuilder::default();
    rows.extend(check("floor", builder, &mut storage, |_| {})?);
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
