//! Stages of a session's start and finish: tracepoints, unwind tables,
//! stack symbolization, loss advice.

use std::collections::HashMap;
use std::path::PathBuf;

use crate::aggregate::{Aggregator, PseudoSite};
use crate::attach::{self, Links};
use crate::bpf::skel::memtrail::MemtrailSkel;
use crate::pressure::RingRoom;
use crate::profile::{LostEvents, StackEntry, StackMetrics, UnrecordedStacks};
use crate::symbolize::AddressSpaces;

use super::CaptureError;
use crate::session::sinks::Stack;

/// Why a paused capture still lost records, and what ring sizes would do:
/// each live thread of the tree may write two records past a ring's mark
/// before it stops, so a tree with more threads than the ring has room for
/// above its watermark can overrun it before the freeze lands.
pub(crate) fn loss_advice(
    lost: &LostEvents,
    rooms: &[RingRoom],
    percent: u8,
    threads: u64,
) -> String {
    if lost.resumed != 0 {
        return lost.advice();
    }
    let counts = [lost.events, lost.stacks, lost.mappings, lost.attach];
    let needs: Vec<String> = rooms
        .iter()
        .zip(counts)
        .filter(|&(room, n)| n != 0 && room.option != "fixed")
        .map(|(room, _)| {
            let needed = crate::pressure::min_room(room.record, threads, 0);
            let size = crate::pressure::min_ring_size(room.capacity, percent, needed);
            format!("{} {size}", room.option)
        })
        .collect();
    if needs.is_empty() {
        return lost.advice();
    }
    format!(
        "the tree had up to {threads} live threads, and each may write {} records past a \
         ring's watermark before it stops: retry with {} (or a lower --watermark)",
        crate::pressure::RECORDS_PER_THREAD,
        needs.join(" and ")
    )
}

/// Builds the allocation sites: every stack that allocated, symbolized,
/// largest allocated bytes first. `images`: the files the capture read
/// (unwind tables), by full path: a mapping recorded by name only, its
/// process gone before /proc could be asked, is found among them. Frames
/// without source lines are symbolized again from the debug files of
/// `debug_dirs` ([`crate::symbolize::StackSymbolizer::resymbolize`]).
pub(crate) fn symbolize_stacks(
    agg: &Aggregator,
    mut stacks: HashMap<u64, Stack>,
    mut mappings: HashMap<u32, Vec<crate::symbolize::Mapping>>,
    images: &[PathBuf],
    symbolizer: &crate::symbolize::Background,
    debug_dirs: &[PathBuf],
) -> (Vec<StackEntry>, UnrecordedStacks) {
    let hints: Vec<PathBuf> = agg
        .processes()
        .filter_map(|p| std::fs::canonicalize(&p.exe).ok())
        .chain(attach::libc_path().ok())
        .chain(images.iter().cloned())
        .collect();
    crate::symbolize::resolve_paths(&mut mappings, &hints);
    let spaces = AddressSpaces {
        mappings,
        parents: agg.processes().map(|p| (p.pid, p.ppid)).collect(),
    };
    let exes: HashMap<u32, &str> = agg.processes().map(|p| (p.pid, &p.exe[..])).collect();
    let exe_of = |pid: u32| exes.get(&pid).copied().unwrap_or_default().to_owned();
    let (by_pid, mut entries, unrecorded) = sites_by_pid(agg, &mut stacks, &exe_of);
    let by_pid: Vec<(u32, Vec<Site>)> = by_pid.into_iter().collect();
    let request = by_pid
        .iter()
        .map(|(pid, list)| {
            let ips = list.iter().flat_map(|(_, _, stack)| &stack.ips).copied();
            (*pid, ips.collect())
        })
        .collect();
    let mut places = symbolizer.symbolize(spaces, request);
    // Frames without source lines, from debug files by build id, as gdb
    // finds them.
    let again =
        crate::symbolize::StackSymbolizer::new().resymbolize_places(&mut places, debug_dirs);
    tracing::debug!(frames = again, "symbolized again from debug files");
    let mut cold = crate::python::ColdParts::default();
    for ((pid, list), mut places) in by_pid.into_iter().zip(places) {
        let loops = crate::python::loop_addresses(&mut places, &mut cold);
        entries.extend(list.into_iter().map(|(id, metrics, stack)| {
            StackEntry {
                id,
                pid,
                // What ran when the stack was made: a stack from
                // before an exec keeps the executable of then.
                exe: agg
                    .stack_exe(id)
                    .map_or_else(|| exe_of(pid), str::to_owned)
                    .into(),
                frames: crate::python::splice(
                    &stack.ips,
                    &places,
                    &loops,
                    stack.python,
                    stack.end == crate::profile::unwind::StackEnd::DepthLimit,
                    stack.fp_steps,
                ),
                end: stack.end,
                metrics,
            }
        }));
    }
    for entry in &mut entries {
        entry.end_at_loader_entry();
    }
    entries.sort_by(|a, b| b.metrics.bytes.cmp(&a.metrics.bytes).then(a.id.cmp(&b.id)));
    (entries, unrecorded)
}

/// A stack to symbolize: id, metrics, the stack (taken: its Python frames
/// move into the entry).
type Site = (u64, StackMetrics, Stack);

/// The stacks that allocated, by process, taken from `stacks`; the
/// pseudo-sites' entries, made whole; and the stack ids allocations named
/// that were never recorded, counted and logged once (issue 40: one line
/// each made a million).
fn sites_by_pid(
    agg: &Aggregator,
    stacks: &mut HashMap<u64, Stack>,
    exe_of: &impl Fn(u32) -> String,
) -> (HashMap<u32, Vec<Site>>, Vec<StackEntry>, UnrecordedStacks) {
    let mut by_pid: HashMap<u32, Vec<Site>> = HashMap::new();
    let mut entries = Vec::new();
    let mut unrecorded = UnrecordedStacks::default();
    let mut first = None;
    for (id, metrics) in agg.stack_metrics() {
        if metrics.is_empty() {
            continue;
        }
        match (stacks.remove(&id), agg.pseudo_site(id)) {
            (Some(stack), _) => by_pid
                .entry(stack.pid)
                .or_default()
                .push((id, metrics, stack)),
            (None, Some((pid, pseudo))) => entries.push(StackEntry {
                id,
                pid,
                frames: vec![std::sync::Arc::new(match pseudo {
                    PseudoSite::DirectSyscall => crate::profile::Frame::direct_syscall(),
                    PseudoSite::AllocatorArena => crate::profile::Frame::allocator_arena(),
                })],
                exe: agg
                    .stack_exe(id)
                    .map_or_else(|| exe_of(pid), str::to_owned)
                    .into(),
                end: crate::profile::unwind::StackEnd::Complete,
                metrics,
            }),
            (None, None) => {
                first = Some(first.map_or(id, |f: u64| f.min(id)));
                unrecorded.stacks += 1;
                unrecorded.allocations += metrics.allocations;
                unrecorded.bytes += metrics.bytes;
            }
        }
    }
    if let Some(first) = first {
        tracing::warn!(
            target: crate::profile::NOTE,
            stacks = unrecorded.stacks,
            allocations = unrecorded.allocations,
            bytes = unrecorded.bytes,
            first,
            "allocations name stacks that were never recorded: counted in the totals, in no \
             stack (the profile's anomalies.unrecorded_stacks)"
        );
    }
    (by_pid, entries, unrecorded)
}

/// The unwind tables' maps, when stacks are walked with tables; without
/// them (the maps cannot be mapped) stacks take frame-pointer steps.
pub(crate) fn unwind_tables(
    skel: &MemtrailSkel<'_>,
    opts: &super::SessionOptions,
) -> Option<crate::unwind::Tables> {
    if !opts.unwind.uses_tables() || opts.stack_depth == 0 {
        return None;
    }
    use std::os::fd::AsFd;
    let maps = &skel.maps;
    crate::unwind::Tables::new(
        maps.unwind_rows.as_fd(),
        maps.unwind_shards.as_fd(),
        maps.unwind_images.as_fd(),
        opts.python_frames.then(|| maps.py_images.as_fd()),
        crate::unwind::ReleaseMaps {
            known_images: maps.known_images.as_fd(),
            code_maps: maps.code_maps.as_fd(),
            row_cache: maps.row_cache.as_fd(),
        },
    )
    .inspect_err(|err| tracing::warn!(%err, "no unwind tables: stacks take frame-pointer steps"))
    .ok()
    .map(|mut tables| {
        tables.sweep_every_load = opts.faults.sweep_unwind_tables;
        tables
    })
}

/// Attaches the syscall and sched tracepoint programs, `signal_generate`
/// with `signals` (stops and resumes by others), and `shim_signal` (the
/// preload shim's frees a thread leaves buffered when a signal ends it)
/// with `preload`. Returns a descriptor of the `sched_exit` link, for the
/// guardian to hold (see `sys::Guardian`).
pub(crate) fn attach_tracepoints(
    skel: &MemtrailSkel<'_>,
    links: &mut Links,
    signals: bool,
    preload: bool,
) -> Result<std::os::fd::OwnedFd, CaptureError> {
    let p = &skel.progs;
    let attach = |prog: &libbpf_rs::ProgramMut<'_>| {
        prog.attach()
            .map_err(|source| CaptureError::AttachTracepoint {
                what: "syscall and sched tracepoints",
                source,
            })
    };
    let exit = attach(&p.sched_exit)?;
    let exit_fd = std::os::fd::AsFd::as_fd(&exit)
        .try_clone_to_owned()
        .map_err(|source| CaptureError::Io {
            what: "duplicating a BPF link descriptor",
            source,
        })?;
    links.push(exit);
    let held = signals.then_some(&p.signal_generate);
    let rss = crate::bpf::object::rss_supported().then_some(&p.rss_stat);
    let shim = preload.then_some(&p.shim_signal);
    for prog in [&p.sched_fork, &p.sched_exec, &p.sys_enter, &p.sys_exit]
        .into_iter()
        .chain(held)
        .chain(rss)
        .chain(shim)
    {
        links.push(attach(prog)?);
    }
    Ok(exit_fd)
}
