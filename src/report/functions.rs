//! The function views (`--view functions`, `--view calls`), as
//! heaptrack_print's and pprof's `top` and `peek` show them.
//!
//! - functions: every function of the stacks with its self value (the
//!   stacks it names the site of: the first frame outside allocator
//!   wrappers, or the innermost frame with `--no-group`) and inclusive
//!   value (the stacks it is in, counted once a stack however often it
//!   recurs), ranked by self then inclusive value of `--by`.
//! - calls: for each function `--focus` matches (ranked by inclusive
//!   value), its callers (the frame outside it, once a stack) and callees
//!   (the frame inside it; `[allocator]` where it called the allocator
//!   itself), each with the value that went through it.
//!
//! A function is its name (or `module+0xOFFSET`) and its module's file
//! name, a Python function its name and source file (issue 41); text
//! shortens names, JSON keeps them whole.

use std::collections::{HashMap, HashSet};
use std::io::{self, Write};

use serde::Serialize;

use super::group::{frame_key, python_file};
use super::names::short;
use super::sites::{Site, add, ranked, whole_name};
use super::text::{plural, write_header};
use super::{Metric, Prepared, View};
use crate::profile::{Frame, StackMetrics, human_bytes};

/// A function's identity: its name and its module's file name (a Python
/// function's source file).
type Key = (String, String);

fn key(f: &Frame) -> Key {
    let (name, module) = frame_key(f);
    (name.into_owned(), module.to_owned())
}

/// One function's sums.
#[derive(Clone, Debug, Default)]
struct Function {
    key: Key,
    /// The function as the JSON shows it (whole) and its module path.
    name: String,
    module: Option<String>,
    /// A Python function's source file.
    file: Option<String>,
    self_: StackMetrics,
    inclusive: StackMetrics,
}

/// Every function of the sites with its self and inclusive sums, ranked.
fn functions(p: &Prepared<'_>, sites: &[Site<'_>], by: Metric) -> Vec<Function> {
    let grouping = &p.opts.shaping.grouping;
    let mut index: HashMap<Key, usize> = HashMap::new();
    let mut out: Vec<Function> = Vec::new();
    let mut slot = |f: &Frame, out: &mut Vec<Function>| -> usize {
        let k = key(f);
        *index.entry(k.clone()).or_insert_with(|| {
            out.push(Function {
                key: k,
                name: whole_name(f),
                module: f.module.as_deref().map(str::to_owned),
                file: python_file(f).map(str::to_owned),
                ..Function::default()
            });
            out.len() - 1
        })
    };
    for site in sites {
        if site.frames.is_empty() {
            continue;
        }
        let own = grouping.caller(site.frames).unwrap_or(0);
        let i = slot(&site.frames[own], &mut out);
        add(&mut out[i].self_, &site.metrics);
        let mut seen = HashSet::new();
        for f in site.frames {
            let i = slot(f, &mut out);
            if seen.insert(i) {
                add(&mut out[i].inclusive, &site.metrics);
            }
        }
    }
    out.sort_by(|a, b| {
        by.of(&b.self_)
            .cmp(&by.of(&a.self_))
            .then(by.of(&b.inclusive).cmp(&by.of(&a.inclusive)))
            .then(a.key.cmp(&b.key))
    });
    out
}

/// A caller or callee of a focused function.
#[derive(Clone, Debug, Serialize)]
struct Edge {
    function: String,
    module: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    file: Option<String>,
    #[serde(flatten)]
    metrics: StackMetrics,
}

/// A focused function with its callers and callees, each ranked by `by`.
struct Calls {
    f: Function,
    callers: Vec<(Key, Edge)>,
    callees: Vec<(Key, Edge)>,
}

/// The edge of `f` (None: the allocator itself, or the top of the stack).
fn edge_key(f: Option<&Frame>, none: &str) -> (Key, Edge) {
    match f {
        Some(f) => (
            key(f),
            Edge {
                function: whole_name(f),
                module: f.module.as_deref().map(str::to_owned),
                file: python_file(f).map(str::to_owned),
                metrics: StackMetrics::default(),
            },
        ),
        None => (
            (none.to_owned(), String::new()),
            Edge {
                function: none.to_owned(),
                module: None,
                file: None,
                metrics: StackMetrics::default(),
            },
        ),
    }
}

fn calls(p: &Prepared<'_>, sites: &[Site<'_>], by: Metric) -> Vec<Calls> {
    let Some(focus) = &p.opts.shaping.focus else {
        return Vec::new();
    };
    let mut focused: Vec<Function> = functions(p, sites, by)
        .into_iter()
        .filter(|f| focus.is_match(&f.key.0))
        .collect();
    focused.sort_by(|a, b| {
        by.of(&b.inclusive)
            .cmp(&by.of(&a.inclusive))
            .then(a.key.cmp(&b.key))
    });
    focused
        .into_iter()
        .map(|f| {
            let mut callers: Vec<(Key, Edge)> = Vec::new();
            let mut callees: Vec<(Key, Edge)> = Vec::new();
            for site in sites {
                let mut seen_callers = HashSet::new();
                let mut seen_callees = HashSet::new();
                for (i, frame) in site.frames.iter().enumerate() {
                    if key(frame) != f.key {
                        continue;
                    }
                    let caller =
                        edge_key(site.frames.get(i + 1).map(|f| &**f), "[top of the stack]");
                    let callee =
                        edge_key(i.checked_sub(1).map(|j| &*site.frames[j]), "[allocator]");
                    for (edge, edges, seen) in [
                        (caller, &mut callers, &mut seen_callers),
                        (callee, &mut callees, &mut seen_callees),
                    ] {
                        if !seen.insert(edge.0.clone()) {
                            continue;
                        }
                        let at = match edges.iter().position(|(k, _)| *k == edge.0) {
                            Some(at) => at,
                            None => {
                                edges.push(edge);
                                edges.len() - 1
                            }
                        };
                        add(&mut edges[at].1.metrics, &site.metrics);
                    }
                }
            }
            for edges in [&mut callers, &mut callees] {
                edges.sort_by(|a, b| {
                    by.of(&b.1.metrics)
                        .cmp(&by.of(&a.1.metrics))
                        .then(a.0.cmp(&b.0))
                });
                edges.retain(|e| by.of(&e.1.metrics) > 0);
            }
            Calls {
                f,
                callers,
                callees,
            }
        })
        .collect()
}

/// `metric`'s value as text: bytes with a unit, counts as numbers.
fn value(metric: Metric, m: &StackMetrics) -> String {
    match metric.unit() {
        "bytes" => human_bytes(metric.of(m)),
        _ => metric.of(m).to_string(),
    }
}

fn share(v: u64, total: u64) -> String {
    if total == 0 {
        "-".to_owned()
    } else {
        format!("{:.1}%", v as f64 * 100.0 / total as f64)
    }
}

/// A function as text: its shortened name and its module's file name (a
/// Python function's source file).
fn shown(k: &Key) -> String {
    if k.1.is_empty() {
        short(&k.0).into_owned()
    } else {
        format!("{} in {}", short(&k.0), k.1)
    }
}

/// The second metric of the table: allocations, or bytes when ranking by
/// allocations.
fn second(by: Metric) -> Metric {
    if by == Metric::Count {
        Metric::Bytes
    } else {
        Metric::Count
    }
}

pub(super) fn write_text(
    p: &Prepared<'_>,
    by: Metric,
    limit: Option<usize>,
    w: &mut dyn Write,
) -> io::Result<()> {
    write_header(p, w)?;
    let sites = ranked(p, by, None, false);
    let total = match by {
        Metric::Leaked => p.reachable.leaked(p.profile).0,
        _ => by.total(p.profile),
    };
    let what = by.describe(p.profile.attached);
    if p.opts.shaping.view == View::Calls {
        let all = calls(p, &sites, by);
        if all.is_empty() {
            writeln!(w, "  no function with {what} matches --focus")?;
        }
        let n = limit.map_or(all.len(), |n| n.min(all.len()));
        for c in all.iter().take(n) {
            writeln!(w)?;
            writeln!(
                w,
                "{}: {} inclusive ({}), {} self",
                shown(&c.f.key),
                value(by, &c.f.inclusive),
                share(by.of(&c.f.inclusive), total),
                value(by, &c.f.self_)
            )?;
            let incl = by.of(&c.f.inclusive);
            for (title, edges) in [("callers", &c.callers), ("callees", &c.callees)] {
                writeln!(w, "  {title}:")?;
                for (k, e) in edges {
                    writeln!(
                        w,
                        "    {:>10} {:>6}  {}",
                        value(by, &e.metrics),
                        share(by.of(&e.metrics), incl),
                        shown(k)
                    )?;
                }
            }
        }
        return Ok(());
    }
    let all: Vec<Function> = functions(p, &sites, by)
        .into_iter()
        .filter(|f| by.of(&f.inclusive) > 0)
        .collect();
    let n = limit.map_or(all.len(), |n| n.min(all.len()));
    let other = second(by);
    writeln!(
        w,
        "  top {n} of {} by {what}, self (sites they name) and inclusive",
        plural(all.len() as u64, "function"),
    )?;
    writeln!(w)?;
    let (a, b) = (by.name(), other.name());
    writeln!(
        w,
        "{:>17} {:>17} {:>10} {:>10}  function",
        format!("self {a}"),
        format!("inclusive {a}"),
        format!("self {b}"),
        format!("incl {b}")
    )?;
    for f in all.iter().take(n) {
        writeln!(
            w,
            "{:>10} {:>6} {:>10} {:>6} {:>10} {:>10}  {}",
            value(by, &f.self_),
            share(by.of(&f.self_), total),
            value(by, &f.inclusive),
            share(by.of(&f.inclusive), total),
            value(other, &f.self_),
            value(other, &f.inclusive),
            shown(&f.key)
        )?;
    }
    Ok(())
}

#[derive(Serialize)]
struct FunctionDoc {
    function: String,
    module: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    file: Option<String>,
    #[serde(rename = "self")]
    self_: StackMetrics,
    inclusive: StackMetrics,
    #[serde(skip_serializing_if = "Option::is_none")]
    callers: Option<Vec<Edge>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    callees: Option<Vec<Edge>>,
}

#[derive(Serialize)]
struct Doc<'a> {
    format: &'static str,
    version: u32,
    command: &'a [String],
    view: &'static str,
    by: Metric,
    total: u64,
    functions: Vec<FunctionDoc>,
}

pub(super) fn write_json(
    p: &Prepared<'_>,
    by: Metric,
    limit: Option<usize>,
    w: &mut dyn Write,
) -> io::Result<()> {
    let sites = ranked(p, by, None, false);
    let doc = |f: Function| FunctionDoc {
        function: f.name,
        module: f.module,
        file: f.file,
        self_: f.self_,
        inclusive: f.inclusive,
        callers: None,
        callees: None,
    };
    let mut functions: Vec<FunctionDoc> = match p.opts.shaping.view {
        View::Calls => calls(p, &sites, by)
            .into_iter()
            .map(|c| FunctionDoc {
                callers: Some(c.callers.into_iter().map(|e| e.1).collect()),
                callees: Some(c.callees.into_iter().map(|e| e.1).collect()),
                ..doc(c.f)
            })
            .collect(),
        _ => functions(p, &sites, by)
            .into_iter()
            .filter(|f| by.of(&f.inclusive) > 0)
            .map(doc)
            .collect(),
    };
    if let Some(n) = limit {
        functions.truncate(n);
    }
    let total = match by {
        Metric::Leaked => p.reachable.leaked(p.profile).0,
        _ => by.total(p.profile),
    };
    let report = Doc {
        format: super::json::REPORT_FORMAT,
        version: super::json::REPORT_VERSION,
        command: &p.profile.command,
        view: p.opts.shaping.view.name(),
        by,
        total,
        functions,
    };
    serde_json::to_writer_pretty(&mut *w, &report)?;
    w.write_all(b"\n")
}
