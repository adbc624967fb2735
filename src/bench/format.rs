//! Renderings of bench results: a text table, a Markdown table, our JSON,
//! the Bencher Metric Format and github-action-benchmark's
//! `customSmallerIsBetter` JSON (docs/bench.md has the mapping).

use std::io::{self, Write};

use serde_json::{Map, Value, json};

use super::results::{BenchResult, Metric, REGION_ENTRIES, Results};
use crate::profile::ExitInfo;

/// A format of `memtrail bench --format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BenchFormat {
    /// A table for a terminal.
    Text,
    /// The results document (docs/bench.md).
    Json,
    /// A Markdown table, for a pull-request comment.
    Markdown,
    /// Bencher Metric Format JSON (`bencher run --adapter json`).
    Bmf,
    /// github-action-benchmark's `customSmallerIsBetter` JSON.
    Gab,
}

/// `1234567` → `1,234,567`.
pub fn grouped(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A metric's value as shown in tables: grouped digits, ` B` for bytes.
pub fn shown(m: Metric, v: u64) -> String {
    if m.is_bytes() {
        format!("{} B", grouped(v))
    } else {
        grouped(v)
    }
}

/// A metric's short title in tables.
pub fn title(m: Metric) -> &'static str {
    match m {
        Metric::Allocations => "allocations",
        Metric::Frees => "frees",
        Metric::AllocatedBytes => "allocated",
        Metric::PeakLiveBytes => "peak live",
        Metric::LeakedBytes => "leaked",
        Metric::LeakedBlocks => "leaked blocks",
        Metric::MmapPeakBytes => "mmap peak",
        Metric::TemporaryAllocations => "temporary",
    }
}

/// A metric's title for a region: `leaked` is what was still live at the
/// region's end.
fn region_title(m: Metric) -> &'static str {
    match m {
        Metric::LeakedBytes => "live at end",
        Metric::LeakedBlocks => "live blocks at end",
        m => title(m),
    }
}

/// `code 0`, `signal 9`.
pub fn exit_text(e: &ExitInfo) -> String {
    match (e.code, e.signal) {
        (_, Some(sig)) => format!("signal {sig}"),
        (Some(code), None) => format!("code {code}"),
        (None, None) => "unknown".to_owned(),
    }
}

/// A cell: the value, with the range when runs differed.
fn cell(r: &BenchResult, m: Metric) -> String {
    match r.metrics.get(m.key()) {
        Some(s) if s.spread() != 0 => format!(
            "{} ({}..{})",
            shown(m, s.value),
            grouped(s.min),
            grouped(s.max)
        ),
        Some(s) => shown(m, s.value),
        None => "-".to_owned(),
    }
}

fn notes(r: &BenchResult) -> String {
    let mut notes = Vec::new();
    if !r.deterministic {
        notes.push(format!("non-deterministic over {} runs", r.runs));
    }
    if !r.exit_consistent {
        notes.push("exit status differed between runs".to_owned());
    }
    notes.join("; ")
}

/// Every benchmark followed by its regions, each region `R` of `B` as a
/// benchmark `B/R` (see [`BenchResult::region_results`]).
fn with_regions(results: &Results) -> Vec<BenchResult> {
    results
        .benchmarks
        .iter()
        .flat_map(|r| std::iter::once(r.clone()).chain(r.region_results()))
        .collect()
}

/// A region's entry count (benchmarks have none).
fn entries(r: &BenchResult) -> Option<&super::results::Stat> {
    r.metrics.get(REGION_ENTRIES)
}

pub fn write(results: &Results, format: BenchFormat, w: &mut dyn Write) -> io::Result<()> {
    match format {
        BenchFormat::Json => {
            serde_json::to_writer_pretty(&mut *w, results)?;
            writeln!(w)
        }
        BenchFormat::Text => write_text(results, w),
        BenchFormat::Markdown => write_markdown(results, w),
        BenchFormat::Bmf => {
            serde_json::to_writer_pretty(&mut *w, &bmf(results))?;
            writeln!(w)
        }
        BenchFormat::Gab => {
            serde_json::to_writer_pretty(&mut *w, &gab(results))?;
            writeln!(w)
        }
    }
}

fn write_text(results: &Results, w: &mut dyn Write) -> io::Result<()> {
    for r in &results.benchmarks {
        writeln!(
            w,
            "{} ({} run{}, exit {}){}",
            r.name,
            r.runs,
            if r.runs == 1 { "" } else { "s" },
            exit_text(&r.exit),
            match notes(r) {
                n if n.is_empty() => String::new(),
                n => format!(" — {n}"),
            }
        )?;
        for m in Metric::ALL {
            writeln!(w, "  {:<14} {:>20}", title(m), cell(r, m))?;
        }
        for region in r.region_results() {
            let name = &region.name[r.name.len() + 1..];
            let mut cols = vec![format!(
                "entries {}",
                entries(&region).map_or(0, |s| s.value)
            )];
            for m in Metric::ALL {
                if region.metrics.contains_key(m.key()) {
                    cols.push(format!("{} {}", region_title(m), cell(&region, m)));
                }
            }
            writeln!(w, "  region {name}: {}", cols.join(", "))?;
        }
        for s in &r.differing_sites {
            writeln!(
                w,
                "  differs: {} allocations {:?}, bytes {:?}",
                s.site, s.allocations, s.bytes
            )?;
        }
        writeln!(
            w,
            "  profile        {}",
            results.profile_dir.join(&r.profile).display()
        )?;
    }
    Ok(())
}

fn write_markdown(results: &Results, w: &mut dyn Write) -> io::Result<()> {
    write!(w, "| benchmark |")?;
    for m in Metric::ALL {
        write!(w, " {} |", title(m))?;
    }
    writeln!(w, " exit | runs |")?;
    write!(w, "| --- |")?;
    for _ in Metric::ALL {
        write!(w, " ---: |")?;
    }
    writeln!(w, " --- | ---: |")?;
    for r in &with_regions(results) {
        let name = match notes(r) {
            n if n.is_empty() => format!("`{}`", r.name),
            n => format!("`{}` ({n})", r.name),
        };
        write!(w, "| {name} |")?;
        for m in Metric::ALL {
            write!(w, " {} |", cell(r, m))?;
        }
        writeln!(w, " {} | {} |", exit_text(&r.exit), r.runs)?;
    }
    Ok(())
}

/// A BMF measure slug: kebab case of the metric key.
pub fn bmf_measure(m: Metric) -> String {
    m.key().replace('_', "-")
}

/// Bencher Metric Format: `{ BENCH: { MEASURE: { value, lower_value,
/// upper_value } } }`; the bounds are the lowest and highest run.
pub fn bmf(results: &Results) -> Value {
    let mut doc = Map::new();
    for r in &with_regions(results) {
        let mut measures = Map::new();
        if let Some(s) = entries(r) {
            measures.insert(REGION_ENTRIES.into(), json!({ "value": s.value as f64 }));
        }
        for m in Metric::ALL {
            let Some(s) = r.metrics.get(m.key()) else {
                continue;
            };
            let mut metric = Map::new();
            metric.insert("value".into(), json!(s.value as f64));
            if r.runs > 1 {
                metric.insert("lower_value".into(), json!(s.min as f64));
                metric.insert("upper_value".into(), json!(s.max as f64));
            }
            measures.insert(bmf_measure(m), Value::Object(metric));
        }
        doc.insert(r.name.clone(), Value::Object(measures));
    }
    Value::Object(doc)
}

/// github-action-benchmark `customSmallerIsBetter`: an array of `{ name,
/// unit, value, range?, extra? }`, one entry per benchmark and judged
/// metric named `BENCH - METRIC`. Metrics that are not smaller-is-better
/// (frees, temporary allocations, a region's entries: [`Metric::judged`])
/// are left out, or its alerts would fire on a leak fixed (issue 26).
pub fn gab(results: &Results) -> Value {
    let mut out = Vec::new();
    for r in &with_regions(results) {
        let keys = Metric::ALL
            .into_iter()
            .filter(|m| m.judged())
            .map(|m| (m.key(), m.unit()));
        for (key, unit) in keys {
            let Some(s) = r.metrics.get(key) else {
                continue;
            };
            let mut e = Map::new();
            e.insert("name".into(), json!(format!("{} - {}", r.name, key)));
            e.insert("unit".into(), json!(unit));
            e.insert("value".into(), json!(s.value));
            if r.runs > 1 {
                e.insert("range".into(), json!(format!("{}..{}", s.min, s.max)));
            }
            e.insert(
                "extra".into(),
                json!(format!(
                    "runs: {}\nexit: {}{}",
                    r.runs,
                    exit_text(&r.exit),
                    if r.deterministic {
                        ""
                    } else {
                        "\nnon-deterministic"
                    }
                )),
            );
            out.push(Value::Object(e));
        }
    }
    Value::Array(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grouping() {
        assert_eq!(grouped(0), "0");
        assert_eq!(grouped(999), "999");
        assert_eq!(grouped(6400), "6,400");
        assert_eq!(grouped(1_234_567), "1,234,567");
    }
}
