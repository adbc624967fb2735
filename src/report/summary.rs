//! The human summary written to stderr after a capture.

use std::collections::HashMap;
use std::io::{self, Write};
use std::path::PathBuf;

use super::profile::{ProbeEntry, Profile};

/// The `tracing` target of notes about a capture: what the capture's
/// profile or summary records too, or what concerns the tracked program
/// alone (an image without unwind tables, probe sites past the counted
/// ones, USDT markers memtrail skips). `-q` silences them (main); warnings
/// about memtrail's own environment (a process it could not resume, a
/// cgroup it could not thaw, BPF maps it could not set up) and errors stay.
pub const NOTE: &str = "memtrail::note";

/// A probe site the kernel single-steps (~14 µs a hit), that the command
/// went through.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlowProbe {
    pub symbol: String,
    pub image: PathBuf,
    /// Times its probe fired in the tracked tree (the profile's `hits`).
    pub hits: u64,
}

/// The single-stepping probes of a profile that were hit, most hits first.
pub fn slow_probes(probes: &[ProbeEntry]) -> Vec<SlowProbe> {
    let mut slow: Vec<SlowProbe> = probes
        .iter()
        .filter(|p| !p.emulated)
        .filter_map(|p| {
            Some(SlowProbe {
                symbol: p.symbol.clone(),
                image: PathBuf::from(&p.image),
                hits: p.hits.filter(|&h| h > 0)?,
            })
        })
        .collect();
    slow.sort_by(|a, b| b.hits.cmp(&a.hits).then(a.symbol.cmp(&b.symbol)));
    slow
}

/// Formats a byte count with a binary unit.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

fn human_ns(ns: u64) -> String {
    if ns >= 1_000_000_000 {
        format!("{:.2} s", ns as f64 / 1e9)
    } else {
        format!("{:.1} ms", ns as f64 / 1e6)
    }
}

/// What became of the command, or of the process memtrail attached to,
/// and when: `exited with code 0 after 1.20 s`, `was killed by signal 9
/// after …`; for an attach window, `still running: detached after 3.00 s`
/// (it had not exited when memtrail detached) or `exited with code 0 after
/// 1.20 s attached`.
pub fn ending(p: &Profile) -> String {
    let after = human_ns(p.duration_ns);
    let attached = if p.attached { " attached" } else { "" };
    match (p.exit.code, p.exit.signal) {
        (_, Some(sig)) => format!("was killed by signal {sig} after {after}{attached}"),
        (Some(code), None) => format!("exited with code {code} after {after}{attached}"),
        (None, None) if p.attached => format!("still running: detached after {after}"),
        (None, None) => format!("ended after {after}"),
    }
}

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
}

/// One line per executable, largest first (highest peak, then most bytes
/// allocated): a wrapper script's dozens of short-lived shells and helpers
/// take a line, not a screen.
fn write_executables(w: &mut impl Write, p: &Profile) -> io::Result<()> {
    let mut groups: Vec<ExeGroup<'_>> = Vec::new();
    let mut index: HashMap<&str, usize> = HashMap::new();
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
        g.leaked += proc.heap.live_bytes_at_exit;
    }
    groups.sort_by(|a, b| {
        (b.peak, b.allocated_bytes, b.processes)
            .cmp(&(a.peak, a.allocated_bytes, a.processes))
            .then(a.exe.cmp(b.exe))
    });
    writeln!(
        w,
        "  {:>9} {:>10} {:>10} {:>12} {:>12}  exe (peak: the highest of one process)",
        "processes",
        "allocs",
        "frees",
        "peak",
        if p.attached { "at detach" } else { "leaked" }
    )?;
    for g in groups.iter().take(EXECUTABLES_SHOWN) {
        writeln!(
            w,
            "  {:>9} {:>10} {:>10} {:>12} {:>12}  {}",
            g.processes,
            g.allocations,
            g.frees,
            human_bytes(g.peak),
            human_bytes(g.leaked),
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
fn temporary_is_large(t: &super::HeapCounters) -> bool {
    t.temporary_allocations > 0
        && t.temporary_allocations as f64 >= TEMPORARY_SHARE_SHOWN * t.allocations as f64
}

/// Writes the summary of `p`; `slow` are the single-stepping probe sites
/// the command went through ([`slow_probes`]).
pub fn write_summary(w: &mut impl Write, p: &Profile, slow: &[SlowProbe]) -> io::Result<()> {
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
        writeln!(
            w,
            "  leaked      {:>10}  {:>12}   (live at exit)",
            t.live_allocations_at_exit,
            human_bytes(t.live_bytes_at_exit)
        )?;
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
    let m = &p.mappings;
    if m.mmaps > 0 || m.brk_peak_bytes > 0 {
        writeln!(
            w,
            "  anon mmap   {:>10}  {:>12}   peak {}; brk peak {}",
            m.mmaps,
            human_bytes(m.mapped_bytes),
            human_bytes(m.peak_mapped_bytes),
            human_bytes(m.brk_peak_bytes)
        )?;
    }
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
    super::regions::write_regions(w, &p.regions)?;
    write_unwind_notes(w, p)?;
    if !slow.is_empty() {
        const SHOWN: usize = 5;
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
    }
    Ok(())
}

/// Says when stacks ended before their outermost frame for another reason
/// than --stack-depth (when that holds 1% of the allocated bytes or more),
/// and which images had no unwind table.
fn write_unwind_notes(w: &mut impl Write, p: &Profile) -> io::Result<()> {
    use crate::unwind::{Outcome, StackEnd};
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
        .filter(|i| !matches!(i.outcome, Outcome::Loaded { .. }))
        .map(|i| {
            let why = match &i.outcome {
                Outcome::NoCfi => "no CFI".to_owned(),
                Outcome::TooBig { rows, room } => format!("{rows} rows, room for {room}"),
                Outcome::Failed { reason } => reason.clone(),
                Outcome::Loaded { .. } => unreachable!("filtered out"),
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
    Ok(())
}
