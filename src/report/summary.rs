//! The human summary written to stderr after a capture.

use std::io::{self, Write};

use super::profile::Profile;

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

/// Writes the summary of `p`.
pub fn write_summary(w: &mut impl Write, p: &Profile) -> io::Result<()> {
    let t = &p.totals;
    let how = match (p.exit.code, p.exit.signal) {
        (_, Some(sig)) => format!("was killed by signal {sig}"),
        (Some(code), None) => format!("exited with code {code}"),
        (None, None) => "ended".to_owned(),
    };
    writeln!(
        w,
        "memtrail: {} {how} after {}",
        p.command.first().map_or("command", String::as_str),
        human_ns(p.duration_ns)
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
    writeln!(
        w,
        "  leaked      {:>10}  {:>12}   (live at exit)",
        t.live_allocations_at_exit,
        human_bytes(t.live_bytes_at_exit)
    )?;
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
        writeln!(
            w,
            "  {:>8} {:>8} {:>10} {:>10} {:>12} {:>12}  exe",
            "pid", "ppid", "allocs", "frees", "peak", "leaked"
        )?;
        for proc in &p.processes {
            writeln!(
                w,
                "  {:>8} {:>8} {:>10} {:>10} {:>12} {:>12}  {}",
                proc.pid,
                proc.ppid,
                proc.heap.allocations,
                proc.heap.frees,
                human_bytes(proc.heap.peak_live_bytes),
                human_bytes(proc.heap.live_bytes_at_exit),
                proc.exe
            )?;
        }
    }
    write_unwind_notes(w, p)?;
    let slow: Vec<&str> = p
        .probes
        .iter()
        .filter(|s| !s.emulated)
        .map(|s| s.symbol.as_str())
        .collect();
    if !slow.is_empty() {
        const SHOWN: usize = 5;
        let more = slow.len().saturating_sub(SHOWN);
        writeln!(
            w,
            "  note: {} probe sites single-step their first instruction (~14 µs a call): {}{}",
            slow.len(),
            slow[..slow.len().min(SHOWN)].join(", "),
            if more > 0 {
                format!(" and {more} more (the profile's probes list them)")
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
