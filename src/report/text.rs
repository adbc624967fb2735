//! The text report: a header with the profile's totals, then the top sites
//! by the chosen metric, each with its metrics and its stack, innermost
//! frame first. Sites are grouped by the first frame outside allocator
//! wrappers (see `group`): the stacks through `xmalloc` from one function
//! are one site, with their metrics summed, their number of stacks, and
//! the frames of the largest; with `--no-group`, stacks that show the same
//! frames (they differ only in the addresses of symbolized frames, e.g.
//! the calls of an unrolled loop) are one site. Function names are
//! shortened (`names`). Blocks live at exit that are not leaks (runtime
//! pools, suppressed) are counted apart (`reachable`).

use std::io::{self, Write};

use super::group::{caller_name, group};
use super::names::{module_base, short};
use super::reachable::Reach;
use super::sites::{ranked, truncation, unnamed};
use super::{Metric, Prepared};
use crate::profile::{Frame, Profile, StackMetrics, human_bytes};

pub(super) fn write(
    p: &Prepared<'_>,
    by: Metric,
    limit: Option<usize>,
    w: &mut dyn Write,
) -> io::Result<()> {
    let profile = p.profile;
    write_header(p, w)?;
    if profile.stacks.is_empty() {
        writeln!(w, "  no allocation sites: the profile has no stacks")?;
        return Ok(());
    }
    if let Some(line) = truncated_line(profile) {
        writeln!(w, "{line}")?;
    }
    let grouping = &p.opts.shaping.grouping;
    let merged = group(ranked(p, by, None, true), grouping, by);
    let all = merged.len();
    let groups: Vec<_> = merged
        .into_iter()
        .filter(|g| by.of(&g.site.metrics) > 0)
        .collect();
    let with_value = groups.len();
    if with_value == 0 {
        writeln!(
            w,
            "  {}, none with {}",
            plural(all as u64, "allocation site"),
            by.describe(profile.attached)
        )?;
        return Ok(());
    }
    let shown = limit.map_or(with_value, |n| n.min(with_value));
    write!(
        w,
        "  top {shown} of {} by {}",
        plural(with_value as u64, "allocation site"),
        by.describe(profile.attached)
    )?;
    if all > with_value {
        write!(w, " ({} more with none)", all - with_value)?;
    }
    writeln!(w)?;
    if groups
        .iter()
        .any(|g| g.caller.is_some_and(|c| c > 0) || !g.same_frames)
    {
        writeln!(
            w,
            "  (sites grouped by their first caller outside allocator wrappers; --no-group for \
             whole stacks)"
        )?;
    }
    let total = by.total(profile);
    let leaked = p.reachable.leaked(profile);
    let total = if by == Metric::Leaked {
        leaked.0
    } else {
        total
    };
    for (rank, g) in groups.iter().take(shown).enumerate() {
        let site = &g.site;
        writeln!(w)?;
        write!(
            w,
            "#{}  {}",
            rank + 1,
            metrics_line(&site.metrics, by, total, leaked_word(profile))
        )?;
        let stacks = g.stacks.len();
        match g.caller {
            Some(c) if !g.same_frames => write!(
                w,
                "; {stacks} stacks through {} (the largest shown)",
                caller_name(&site.frames[c])
            )?,
            _ if stacks > 1 => write!(w, "; {stacks} stacks")?,
            _ => {}
        }
        if let Some(note) = reach_note(p, site.reach) {
            write!(w, "; {note}")?;
        }
        writeln!(w)?;
        for frame in site.frames {
            writeln!(w, "    {}", frame_line(frame))?;
        }
        if let Some(truncated) = truncation(profile, site) {
            writeln!(w, "    {truncated}")?;
        }
    }
    Ok(())
}

/// What a site's blocks live at exit are when they are not a leak.
fn reach_note(p: &Prepared<'_>, reach: Reach) -> Option<String> {
    match reach {
        Reach::Leak => None,
        Reach::Runtime(i) => Some(format!(
            "still reachable at exit: runtime ({})",
            super::reachable::RUNTIME_POOLS[i].name
        )),
        Reach::Suppressed(i) => Some(format!(
            "suppressed (leak:{})",
            p.opts.shaping.suppressions[i].pattern
        )),
    }
}

/// The header: the command, its totals, the heap's sparkline, and the
/// blocks live at exit that are not leaks.
pub(super) fn write_header(p: &Prepared<'_>, w: &mut dyn Write) -> io::Result<()> {
    let profile = p.profile;
    let t = &profile.totals;
    let (leaked_bytes, leaked_blocks) = p.reachable.leaked(profile);
    writeln!(
        w,
        "memtrail report: {} ({})",
        profile.command.join(" "),
        crate::profile::ending(profile)
    )?;
    writeln!(
        w,
        "  {} ({}), peak live {}, {} {} ({})",
        plural(t.allocations, "allocation"),
        human_bytes(t.allocated_bytes),
        human_bytes(t.peak_live_bytes),
        leaked_word(profile),
        plural(leaked_blocks, "block"),
        human_bytes(leaked_bytes)
    )?;
    for (what, held) in [
        ("still reachable at exit: runtime", &p.reachable.runtime),
        ("suppressed leaks", &p.reachable.suppressed),
    ] {
        if held.is_empty() {
            continue;
        }
        let (bytes, blocks) = held
            .iter()
            .fold((0, 0), |(b, n), h| (b + h.bytes, n + h.blocks));
        let parts: Vec<String> = held
            .iter()
            .map(|h| format!("{} {}", h.name, human_bytes(h.bytes)))
            .collect();
        writeln!(
            w,
            "  {what} {} ({}): {}",
            plural(blocks, "block"),
            human_bytes(bytes),
            parts.join(", ")
        )?;
    }
    if let Some(spark) = super::timeline::sparkline(profile) {
        writeln!(
            w,
            "  heap over time  {spark}  (--format timeline for the chart)"
        )?;
    }
    Ok(())
}

/// The header's count of allocating stacks whose walk stopped before the
/// program's entry (each shows `[truncated: why]` as its last frame); None
/// when every one reached it.
fn truncated_line(profile: &Profile) -> Option<String> {
    let allocating = profile.stacks.iter().filter(|s| s.metrics.allocations > 0);
    let (mut n, mut bytes, mut all) = (0u64, 0u64, 0u64);
    for stack in allocating {
        all += 1;
        if !stack.end.is_complete() {
            n += 1;
            bytes += stack.metrics.bytes;
        }
    }
    (n > 0).then(|| {
        format!(
            "  {n} of {} ({} of {} allocated) truncated: their walk stopped before the \
             program's entry",
            plural(all, "stack"),
            human_bytes(bytes),
            human_bytes(profile.totals.allocated_bytes)
        )
    })
}

/// How blocks still live at the end are named: "leaked" (live at exit),
/// or "live at detach" in an attach window, where the program may still
/// free them.
pub(super) fn leaked_word(profile: &Profile) -> &'static str {
    if profile.attached {
        "live at detach"
    } else {
        "leaked"
    }
}

/// The site's metrics, the chosen one first with its share of the total;
/// `leaked` names the blocks still live at the end ([`leaked_word`]).
fn metrics_line(m: &StackMetrics, by: Metric, total: u64, leaked: &str) -> String {
    // Parenthesized notes after a value: its share, its blocks.
    let notes = |notes: &[Option<String>]| {
        let notes: Vec<&str> = notes.iter().flatten().map(String::as_str).collect();
        if notes.is_empty() {
            String::new()
        } else {
            format!(" ({})", notes.join(", "))
        }
    };
    let phrase = |metric: Metric| {
        let share = (metric == by && total > 0)
            .then(|| format!("{:.1}%", metric.of(m) as f64 * 100.0 / total as f64));
        match metric {
            Metric::Bytes => format!("{} allocated{}", human_bytes(m.bytes), notes(&[share])),
            Metric::Count => format!("{}{}", plural(m.allocations, "allocation"), notes(&[share])),
            Metric::Peak => format!(
                "{} live at peak{}",
                human_bytes(m.live_bytes_at_peak),
                notes(&[share])
            ),
            Metric::Leaked => format!(
                "{} {leaked}{}",
                human_bytes(m.live_bytes_at_exit),
                notes(&[share, Some(plural(m.live_allocations_at_exit, "block"))])
            ),
            Metric::Temporary => {
                format!("{} temporary{}", m.temporary_allocations, notes(&[share]))
            }
            Metric::Mapped => format!(
                "{} mapped{}",
                human_bytes(m.mapped_bytes),
                notes(&[share, Some(plural(m.mmaps, "mmap"))])
            ),
            Metric::MappedPeak => format!(
                "{} mapped at peak{}",
                human_bytes(m.mapped_bytes_at_peak),
                notes(&[share])
            ),
            Metric::MappedExit => format!(
                "{} mapped at exit{}",
                human_bytes(m.mapped_bytes_at_exit),
                notes(&[share])
            ),
            Metric::Brk => format!("{} brk growth{}", human_bytes(m.brk_bytes), notes(&[share])),
        }
    };
    let mut parts = vec![phrase(by)];
    // A site that only mapped memory or moved the break shows those;
    // the heap metrics show where it allocated or when ranked by one.
    let heap = [Metric::Bytes, Metric::Count, Metric::Peak, Metric::Leaked];
    if m.allocations > 0 || heap.contains(&by) {
        parts.extend(heap.into_iter().filter(|&metric| metric != by).map(phrase));
    }
    // Temporary allocations, mappings and break growth are named only
    // where there are some.
    let named = [
        (Metric::Temporary, m.temporary_allocations),
        (Metric::Mapped, m.mmaps),
        (Metric::MappedPeak, m.mmaps),
        (Metric::MappedExit, m.mmaps),
        (Metric::Brk, m.brk_bytes),
    ];
    for (metric, some) in named {
        if by != metric && some > 0 {
            parts.push(phrase(metric));
        }
    }
    parts.join(", ")
}

/// `function (inlined) at file:line in module`; an unknown function shows
/// as `module+0xOFFSET` (the file offset), or its address outside any file.
/// A frame whose caller the walk found by frame pointer, its image's unwind
/// table having no row for it, ends in `[caller by frame pointer]`.
pub(super) fn frame_line(f: &Frame) -> String {
    let mut s = frame_place(f);
    if f.fp_step {
        s.push_str(" [caller by frame pointer]");
    }
    s
}

fn frame_place(f: &Frame) -> String {
    let mut s = match (f.function.as_deref(), f.module.as_deref()) {
        (Some(func), _) if !func.is_empty() => short(func).into_owned(),
        (_, Some(module)) if f.offset.is_some() => return unnamed(module, f.offset),
        _ => format!("{:#x}", f.addr),
    };
    if f.inlined {
        s.push_str(" (inlined)");
    }
    match (f.file.as_deref(), f.line) {
        (Some(file), Some(line)) => s.push_str(&format!(" at {file}:{line}")),
        (Some(file), None) => s.push_str(&format!(" at {file}")),
        _ => {}
    }
    if let Some(module) = f.module.as_deref() {
        s.push_str(&format!(" in {}", module_base(module)));
    }
    s
}

/// `1 allocation`, `2 allocations`.
pub(super) fn plural(n: u64, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}
