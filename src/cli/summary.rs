//! The human summary written to stderr after a capture, and where the
//! profile went.

use crate::profile::regions::RegionEntry;
use crate::profile::{
    HeapCounters, MapCounters, Profile, SlowProbe, ending, human_bytes, human_ns,
};
use std::collections::HashMap;
use std::io::{self, Write};

/// Executables shown in the summary; the profile lists every process.
const EXECUTABLES_SHOWN: usize = 10;

/// The processes of one executable.
#[derive(Debug, Default)]
struct ExeGroup<'a> {
    exe: &'a str,
    processes: u64,
    allocations: u64,
    allocated_bytes: u64,
    frees: u64,
    /// The highest peak of any one of them.
    peak: u64,
    leaked: u64,
    /// The highest RSS of any one of them.
    rss: u64,
}

/// One line per executable, largest first (highest peak, then most bytes
/// allocated): a wrapper script's dozens of short-lived shells and helpers
/// take a line, not a screen.
fn write_executables(w: &mut impl Write, p: &Profile) -> io::Result<()> {
    let mut groups: Vec<ExeGroup<'_>> = Vec::new();
    let mut index: HashMap<&str, usize> = HashMap::new();
    // Leaked as the totals' line counts it: live at exit, less what is
    // still reachable (not in an attach window: live at detach).
    let reachable = if p.attached {
        Default::default()
    } else {
        crate::report::runtime_at_exit_by_pid(p)
    };
    for proc in &p.processes {
        let i = *index.entry(proc.exe.as_str()).or_insert_with(|| {
            groups.push(ExeGroup {
                exe: &proc.exe,
                ..ExeGroup::default()
            });
            groups.len() - 1
        });
        let g = &mut groups[i];
        g.processes += 1;
        g.allocations += proc.heap.allocations;
        g.allocated_bytes += proc.heap.allocated_bytes;
        g.frees += proc.heap.frees;
        g.peak = g.peak.max(proc.heap.peak_live_bytes);
        let held = reachable.get(&proc.pid).map_or(0, |&(bytes, _)| bytes);
        g.leaked += proc.heap.live_bytes_at_exit.saturating_sub(held);
        g.rss = g.rss.max(proc.resident.peak_rss_bytes);
    }
    groups.sort_by(|a, b| {
        (b.peak, b.allocated_bytes, b.processes)
            .cmp(&(a.peak, a.allocated_bytes, a.processes))
            .then(a.exe.cmp(b.exe))
    });
    writeln!(
        w,
        "  {:>9} {:>10} {:>10} {:>12} {:>12} {:>12}  exe (peaks: the highest of one process)",
        "processes",
        "allocs",
        "frees",
        "peak",
        if p.attached { "at detach" } else { "leaked" },
        "peak RSS"
    )?;
    for g in groups.iter().take(EXECUTABLES_SHOWN) {
        writeln!(
            w,
            "  {:>9} {:>10} {:>10} {:>12} {:>12} {:>12}  {}",
            g.processes,
            g.allocations,
            g.frees,
            human_bytes(g.peak),
            human_bytes(g.leaked),
            human_bytes(g.rss),
            g.exe
        )?;
    }
    if groups.len() > EXECUTABLES_SHOWN {
        writeln!(
            w,
            "  and {} more executables (the profile lists every process)",
            groups.len() - EXECUTABLES_SHOWN
        )?;
    }
    Ok(())
}

/// The share of temporary allocations from which the summary names them:
/// a tenth of all allocations (a program in which one allocation in ten
/// lives only until the next allocator call has churn worth a look).
pub const TEMPORARY_SHARE_SHOWN: f64 = 0.10;

/// Whether temporary allocations are a large enough share to be named.
fn temporary_is_large(t: &HeapCounters) -> bool {
    t.temporary_allocations > 0
        && t.temporary_allocations as f64 >= TEMPORARY_SHARE_SHOWN * t.allocations as f64
}

/// Writes the summary of `p`; `slow` are the single-stepping probe sites
/// the command went through ([`crate::profile::slow_probes`]).
pub fn write_summary(w: &mut impl Write, p: &Profile, slow: &[SlowProbe]) -> io::Result<()> {
    write_totals(w, p)?;
    write_mappings(w, &p.mappings)?;
    write_system_view(w, p)?;
    let pr = &p.pressure;
    if pr.episodes > 0 {
        writeln!(
            w,
            "  pressure    {:>10} pauses, {} in all, longest {}",
            pr.episodes,
            human_ns(pr.total_pause_ns),
            human_ns(pr.longest_pause_ns)
        )?;
    }
    if p.processes.len() > 1 {
        write_executables(w, p)?;
    }
    write_regions(w, &p.regions)?;
    write_unwind_notes(w, p)?;
    write_uncounted_heaps(w, p)?;
    write_anomalies(w, p)?;
    write_slow_probes(w, slow)
}

/// How the command ended, and the heap's totals: allocations, frees, the
/// peak, what was left live (leaked, or not freed before detach) and,
/// when they are many, the temporary allocations.
fn write_totals(w: &mut impl Write, p: &Profile) -> io::Result<()> {
    let t = &p.totals;
    writeln!(
        w,
        "memtrail: {} {}",
        p.command.first().map_or("command", String::as_str),
        ending(p)
    )?;
    writeln!(
        w,
        "  allocations {:>10}  {:>12}   reallocs {}",
        t.allocations,
        human_bytes(t.allocated_bytes),
        t.reallocs
    )?;
    writeln!(
        w,
        "  frees       {:>10}  {:>12}{}",
        t.frees,
        human_bytes(t.freed_bytes),
        if t.unmatched_frees > 0 {
            format!("   (+{} of blocks not seen allocated)", t.unmatched_frees)
        } else {
            String::new()
        }
    )?;
    writeln!(
        w,
        "  peak live               {:>12}   at {}",
        human_bytes(t.peak_live_bytes),
        human_ns(t.peak_live_at_ns)
    )?;
    if p.attached {
        // An attach window: what is still live was allocated inside it and
        // not freed before detach; the program may free it later.
        writeln!(
            w,
            "  not freed   {:>10}  {:>12}   (live at detach: allocated while attached, not freed \
             before detach)",
            t.live_allocations_at_exit,
            human_bytes(t.live_bytes_at_exit)
        )?;
    } else {
        write_leaked(w, p)?;
    }
    if temporary_is_large(t) {
        writeln!(
            w,
            "  temporary   {:>10}  {:>11.1}%   of allocations freed before their thread allocated \
             again (memtrail report --by temporary)",
            t.temporary_allocations,
            t.temporary_allocations as f64 * 100.0 / t.allocations as f64
        )?;
    }
    Ok(())
}

/// Anonymous memory mapped outside allocator calls, and the program
/// break, when there was any.
fn write_mappings(w: &mut impl Write, m: &MapCounters) -> io::Result<()> {
    if m.mmaps > 0 || m.brk_peak_bytes > 0 {
        writeln!(
            w,
            "  anon mmap   {:>10}  {:>12}   mapped in all by {} outside allocator calls, at most \
             {} at once; program break grown at most {}",
            m.mmaps,
            human_bytes(m.mapped_bytes),
            if m.mmaps == 1 {
                "1 mmap".to_owned()
            } else {
                format!("{} mmaps", m.mmaps)
            },
            human_bytes(m.peak_mapped_bytes),
            human_bytes(m.brk_peak_bytes)
        )?;
    }
    Ok(())
}

/// The single-stepping probes the command went through, the most hit
/// first (at most five named).
fn write_slow_probes(w: &mut impl Write, slow: &[SlowProbe]) -> io::Result<()> {
    const SHOWN: usize = 5;
    if slow.is_empty() {
        return Ok(());
    }
    let shown: Vec<String> = slow
        .iter()
        .take(SHOWN)
        .map(|s| {
            let image = s.image.file_name().unwrap_or(s.image.as_os_str());
            format!(
                "{} ({}) {} hit{}",
                s.symbol,
                image.to_string_lossy(),
                s.hits,
                if s.hits == 1 { "" } else { "s" }
            )
        })
        .collect();
    let more = slow.len().saturating_sub(SHOWN);
    writeln!(
        w,
        "  note: probes that single-step their first instruction (~14 µs a hit) were hit: {}{}",
        shown.join(", "),
        if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        }
    )?;
    Ok(())
}

/// The blocks live at exit, in the one meaning the reports give "leaked"
/// (docs/reports.md, "Leaked, still reachable, suppressed"): leaked are
/// those live at exit that are not still reachable; still reachable, those
/// in a known runtime pool (libstdc++'s emergency exception pool, glibc's
/// locale data...), shown on a line of their own when there are some.
fn write_leaked(w: &mut impl Write, p: &Profile) -> io::Result<()> {
    let t = &p.totals;
    let (bytes, blocks) = crate::report::runtime_at_exit(p);
    writeln!(
        w,
        "  leaked      {:>10}  {:>12}   (live at exit{})",
        t.live_allocations_at_exit.saturating_sub(blocks),
        human_bytes(t.live_bytes_at_exit.saturating_sub(bytes)),
        if blocks > 0 {
            ", not still reachable"
        } else {
            ""
        }
    )?;
    if blocks > 0 {
        writeln!(
            w,
            "  reachable   {blocks:>10}  {:>12}   (still reachable at exit: runtime pools, not \
             leaks; memtrail report names them)",
            human_bytes(bytes)
        )?;
    }
    Ok(())
}

/// Memory as the system sees it: reservations (address space without
/// access rights, apart from the anon mmap line's committed bytes), the
/// allocator's arenas, and resident memory.
fn write_system_view(w: &mut impl Write, p: &Profile) -> io::Result<()> {
    let m = &p.mappings;
    if m.peak_reserved_bytes > 0 {
        writeln!(
            w,
            "  {:<24}{:>12}   peak of PROT_NONE address space (not in anon mmap); {} mprotect{} \
             committed or reserved part of it",
            "reserved",
            human_bytes(m.peak_reserved_bytes),
            m.mprotects,
            if m.mprotects == 1 { "" } else { "s" }
        )?;
    }
    if m.arena_mmaps > 0 {
        writeln!(
            w,
            "  arenas      {:>10}  {:>12}   peak address space; {} at exit, {} committed (the \
             allocator's own: the heap counts its blocks)",
            m.arena_mmaps,
            human_bytes(m.peak_arena_bytes),
            human_bytes(m.arena_bytes_at_exit),
            human_bytes(m.arena_committed_bytes_at_exit)
        )?;
    }
    let r = &p.resident;
    if r.samples > 0 {
        writeln!(
            w,
            "  {:<24}{:>12}   peak; {} at the heap's peak",
            "resident (RSS)",
            human_bytes(r.peak_rss_bytes),
            human_bytes(r.rss_at_heap_peak_bytes)
        )?;
    }
    Ok(())
}

/// Says when stacks ended before their outermost frame for another reason
/// than --stack-depth (when that holds 1% of the allocated bytes or more),
/// and which images had no unwind table.
/// The processes whose own rings held records memtrail could not read,
/// and allocations naming stacks never recorded (issue 40).
fn write_anomalies(w: &mut impl Write, p: &Profile) -> io::Result<()> {
    for c in &p.anomalies.corrupt_rings {
        writeln!(
            w,
            "  incomplete: process {} ({}): its ring{} held {} record{} memtrail could not read \
             (first: {}); its counts miss them",
            c.pid,
            c.exe,
            c.ring.map(|r| format!(" {r}")).unwrap_or_default(),
            c.records,
            if c.records == 1 { "" } else { "s" },
            c.first
        )?;
    }
    let u = &p.anomalies.unrecorded_stacks;
    if u.stacks > 0 {
        writeln!(
            w,
            "  note: {} allocations ({}) name {}{} stacks never recorded: in the totals, in no \
             stack",
            u.allocations,
            human_bytes(u.bytes),
            if u.more_stacks { "more than " } else { "" },
            u.stacks
        )?;
    }
    Ok(())
}

/// A line per statically linked image whose allocator was not found
/// (issue 41): its heap is not in the totals, its brk and mmap calls are.
fn write_uncounted_heaps(w: &mut impl Write, p: &Profile) -> io::Result<()> {
    let m = &p.mappings;
    for skipped in p
        .skipped_images
        .iter()
        .filter(|s| s.reason == crate::profile::STATIC_HEAP_UNCOUNTED)
    {
        writeln!(
            w,
            "  note: {} is statically linked and memtrail found no allocator it knows in it: its \
             heap is not counted (allocations and frees leave it out); what it took from the \
             system is: brk peak {}, anon mmap {} ({})",
            skipped.image,
            human_bytes(m.brk_peak_bytes),
            m.mmaps,
            human_bytes(m.mapped_bytes),
        )?;
    }
    Ok(())
}

fn write_unwind_notes(w: &mut impl Write, p: &Profile) -> io::Result<()> {
    use crate::profile::unwind::{Outcome, StackEnd};
    let u = &p.unwind;
    let early: Vec<_> = u
        .ended_early
        .iter()
        .filter(|e| e.reason != StackEnd::DepthLimit)
        .collect();
    let (stacks, bytes): (u64, u64) = early
        .iter()
        .fold((0, 0), |(s, b), e| (s + e.stacks, b + e.bytes));
    if stacks > 0 && bytes.saturating_mul(100) >= u.bytes {
        let reasons: Vec<String> = early
            .iter()
            .map(|e| format!("{} {}", e.stacks, e.reason.describe()))
            .collect();
        writeln!(
            w,
            "  note: {stacks} of {} stacks ({} of {} allocated) end before the program's entry \
             (--unwind {}): {}",
            u.stacks,
            human_bytes(bytes),
            human_bytes(u.bytes),
            u.mode,
            reasons.join(", ")
        )?;
    }
    let without: Vec<String> = u
        .images
        .iter()
        // A data-only library has no code a stack goes through.
        .filter(|i| !matches!(i.outcome, Outcome::Loaded { .. } | Outcome::NoCode))
        .map(|i| {
            let why = match &i.outcome {
                Outcome::NoCfi => "no CFI".to_owned(),
                Outcome::TooBig { rows, room } => format!("{rows} rows, room for {room}"),
                Outcome::Failed { reason } => reason.clone(),
                Outcome::Loaded { .. } | Outcome::NoCode => unreachable!("filtered out"),
            };
            format!("{} ({why})", i.image.display())
        })
        .collect();
    if !without.is_empty() {
        writeln!(
            w,
            "  note: no unwind table for {}: stacks through them use frame pointers",
            without.join(", ")
        )?;
    }
    let t = &u.tables;
    if t.released > 0 {
        writeln!(
            w,
            "  unwind tables: {} released (no process mapped their images) and their slots reused; \
             at most {} slots in use at once, {} locked",
            t.released,
            t.peak_slots,
            human_bytes(t.locked_bytes)
        )?;
    }
    Ok(())
}

/// Regions shown in the summary; the profile lists every one.
const REGIONS_SHOWN: usize = 20;

/// The summary's table of regions, by name (nothing without markers).
pub(crate) fn write_regions(
    w: &mut impl std::io::Write,
    regions: &[RegionEntry],
) -> std::io::Result<()> {
    if regions.is_empty() {
        return Ok(());
    }
    let human = human_bytes;
    writeln!(
        w,
        "  {:<20} {:>8} {:>10} {:>10} {:>12} {:>12} {:>8} {:>12}",
        "region", "entries", "allocs", "frees", "allocated", "peak", "live", "live bytes"
    )?;
    for r in regions.iter().take(REGIONS_SHOWN) {
        writeln!(
            w,
            "  {:<20} {:>8} {:>10} {:>10} {:>12} {:>12} {:>8} {:>12}",
            r.name,
            r.entries,
            r.counts.allocations,
            r.counts.frees,
            human(r.counts.allocated_bytes),
            human(r.counts.peak_live_bytes),
            r.counts.live_allocations,
            human(r.counts.live_bytes)
        )?;
    }
    if regions.len() > REGIONS_SHOWN {
        writeln!(
            w,
            "  and {} more regions (the profile lists every one)",
            regions.len() - REGIONS_SHOWN
        )?;
    }
    Ok(())
}

/// The capture's summary, then where the profile went when it is a file
/// (not a stream) and was written. A closed stderr must not turn a good
/// capture into a failure: what cannot be written is left out.
pub fn write_summary_and_where(
    stderr: &mut impl Write,
    profile: &Profile,
    slow: &[SlowProbe],
    output: Option<&std::path::Path>,
    written: bool,
) {
    let _ = write_summary(stderr, profile, slow);
    if let Some(path) = output.filter(|p| written && p.as_os_str() != "-" && p.is_file()) {
        let _ = writeln!(
            stderr,
            "memtrail: profile written to {} (memtrail report {0} ranks its allocation sites)",
            path.display()
        );
    }
}
