//! The house's floors (ARCHITECTURE.md): reads `src/` and checks that no
//! file imports a module of a higher floor, that the files' imports
//! (`crate::`, `super::` and `self::` paths alike, issue 42) form no cycle,
//! and that no function is longer than 100 lines (issue 27).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Top-level modules by floor, bottom first. A module may import its own
/// floor and those below; cycles within a floor are caught by the file
/// graph.
const FLOORS: &[&[&str]] = &[
    &["sys"],
    &["profile", "output"],
    &["bpf"],
    &["ring", "engine", "python", "symbolize", "report"],
    &["proctree", "events", "unwind"],
    &["attach", "pressure", "aggregate"],
    &["session"],
    &["bench", "compare"],
    &["cli", "ffi"],
];

/// Imports that the floors alone would allow but the house does not: the
/// renderers, bench and compare read profiles and never touch a capture;
/// only `session`, `cli`, `ffi` and `lib.rs` name `session`.
const NEVER: &[(&str, &[&str])] = &[
    (
        "report",
        &["session", "attach", "pressure", "engine", "bpf"],
    ),
    ("bench", &["session", "attach", "pressure", "engine", "bpf"]),
    (
        "compare",
        &["session", "attach", "pressure", "engine", "bpf"],
    ),
];

/// The longest function allowed, in lines.
const MAX_FN_LINES: usize = 100;

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The text without comments (line comments, doc comments, block
/// comments), strings kept: a path in a comment is not an import.
fn code(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix("//") {
            rest = after.find('\n').map_or("", |i| &after[i..]);
        } else if let Some(after) = rest.strip_prefix("/*") {
            rest = after.find("*/").map_or("", |i| &after[i + 2..]);
        } else {
            let c = rest.chars().next().expect("not empty");
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    out
}

/// Every `crate::a::b::...`, `super::a::...` and `self::a::...` path in
/// `code`, as its segments, the first one `crate`, `super` or `self`
/// (use-trees are read as their prefix: `crate::a::{b, c}` gives `a`).
fn paths(code: &str) -> Vec<Vec<String>> {
    let mut paths = Vec::new();
    let mut at = 0;
    while let Some(i) = ["crate::", "super::", "self::"]
        .iter()
        .filter_map(|p| code[at..].find(p))
        .min()
    {
        let start = at + i;
        let before = code[..start].chars().next_back();
        let mut text = &code[start..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            at = start + text.find("::").expect("a path") + 2;
            continue; // `mycrate::`, `myself::`
        }
        // Segments up to the first one followed by something other than
        // `::` (the rest of the line).
        let mut kept = Vec::new();
        loop {
            let ident: String = text
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if ident.is_empty() {
                break;
            }
            text = &text[ident.len()..];
            kept.push(ident);
            match text.strip_prefix("::") {
                Some(t) => text = t,
                None => break,
            }
        }
        // On past the whole path: `super::super::a` is one path.
        at = code.len() - text.len();
        if kept.len() > 1 {
            paths.push(kept);
        }
    }
    paths
}

/// The module `file` is (`lib.rs`: the crate, `a/mod.rs`: `a`, `a/b.rs`:
/// `a::b`), as its segments.
fn module_of(root: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(root).expect("under src");
    let mut segs: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let last = segs.pop().expect("a file name");
    if !(segs.is_empty() && ["lib.rs", "main.rs"].contains(&last.as_str()) || last == "mod.rs") {
        segs.push(last.trim_end_matches(".rs").to_owned());
    }
    segs
}

/// `path`, as read in module `me`, from the crate's root: `super::` and
/// `self::` resolved (None when it climbs past the crate).
fn absolute(me: &[String], path: &[String]) -> Option<Vec<String>> {
    let (mut abs, rest) = match path[0].as_str() {
        "crate" => (Vec::new(), &path[1..]),
        "self" => (me.to_vec(), &path[1..]),
        _ => (me.to_vec(), path),
    };
    let supers = rest.iter().take_while(|s| *s == "super").count();
    for _ in 0..supers {
        abs.pop()?;
    }
    abs.extend(rest[supers..].iter().cloned());
    Some(abs)
}

/// The file a path from the crate's root leads to: the deepest module
/// file on it.
fn file_of(root: &Path, segs: &[String]) -> Option<PathBuf> {
    for n in (1..=segs.len()).rev() {
        let rel: PathBuf = segs[..n].iter().collect();
        for candidate in [
            root.join(&rel).with_extension("rs"),
            root.join(&rel).join("mod.rs"),
        ] {
            if candidate.is_file() {
                return Some(candidate);
            }
        }
    }
    None
}

fn top_module(root: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(root).expect("under src");
    let first = rel.components().next().expect("a component");
    first
        .as_os_str()
        .to_string_lossy()
        .trim_end_matches(".rs")
        .to_owned()
}

fn floor_of(module: &str) -> Option<usize> {
    FLOORS.iter().position(|f| f.contains(&module))
}

/// The cycles of `graph` (files): one path per strongly connected
/// component with more than one file.
fn cycles(graph: &BTreeMap<PathBuf, BTreeSet<PathBuf>>) -> Vec<Vec<PathBuf>> {
    // Files that reach each other are in one cycle.
    let reach = |from: &PathBuf| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.clone()];
        while let Some(f) = todo.pop() {
            for next in graph.get(&f).into_iter().flatten() {
                if seen.insert(next.clone()) {
                    todo.push(next.clone());
                }
            }
        }
        seen
    };
    let reached: BTreeMap<_, _> = graph.keys().map(|f| (f.clone(), reach(f))).collect();
    let mut found: Vec<Vec<PathBuf>> = Vec::new();
    for (f, r) in &reached {
        let group: Vec<PathBuf> = r
            .iter()
            .filter(|g| *g != f && reached.get(*g).is_some_and(|rg| rg.contains(f)))
            .cloned()
            .collect();
        if !group.is_empty() && !found.iter().any(|c| c.contains(f)) {
            let mut cycle = vec![f.clone()];
            cycle.extend(group);
            found.push(cycle);
        }
    }
    found
}

/// Check that no file of `src/` imports (through a `crate::`, `super::` or
/// `self::` path) a module of a higher floor than its own, and that the
/// files' imports form no cycle. A file's use of a module it lies in (its
/// parent, which declares it) is no edge of the graph.
#[test]
fn layers_import_only_downward_without_cycles() {
    let root = src();
    let mut all = Vec::new();
    files(&root, &mut all);
    let mut upward = Vec::new();
    let mut graph: BTreeMap<PathBuf, BTreeSet<PathBuf>> = BTreeMap::new();
    for file in &all {
        let me = top_module(&root, file);
        let module = module_of(&root, file);
        let text = std::fs::read_to_string(file).expect("read");
        for path in paths(&code(&text)) {
            let Some(path) = absolute(&module, &path).filter(|p| !p.is_empty()) else {
                continue;
            };
            let target = &path[0];
            if let (Some(mine), Some(theirs)) = (floor_of(&me), floor_of(target))
                && theirs > mine
            {
                upward.push(format!(
                    "{} imports crate::{}",
                    file.display(),
                    path.join("::")
                ));
            }
            if NEVER
                .iter()
                .any(|(from, never)| *from == me && never.contains(&target.as_str()))
            {
                upward.push(format!(
                    "{} imports crate::{}",
                    file.display(),
                    path.join("::")
                ));
            }
            let within = |to: &PathBuf| module.starts_with(&module_of(&root, to));
            if let Some(to) = file_of(&root, &path).filter(|to| to != file && !within(to)) {
                graph.entry(file.clone()).or_default().insert(to);
            }
        }
    }
    assert!(
        upward.is_empty(),
        "imports from a lower floor up: {upward:#?}"
    );
    let found = cycles(&graph);
    assert!(found.is_empty(), "file import cycles: {found:#?}");
    // Every top-level module has a floor (a new one must be placed).
    let unplaced: BTreeSet<String> = all
        .iter()
        .map(|f| top_module(&root, f))
        .filter(|m| !["lib", "main"].contains(&m.as_str()) && floor_of(m).is_none())
        .collect();
    assert!(unplaced.is_empty(), "modules without a floor: {unplaced:?}");
}

/// Check that no function in `src/` is longer than 100 lines.
#[test]
fn layers_no_function_longer_than_100_lines() {
    let root = src();
    let mut all = Vec::new();
    files(&root, &mut all);
    let mut long = Vec::new();
    for file in &all {
        let text = std::fs::read_to_string(file).expect("read");
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let trimmed = line.trim_start();
            let indent = &line[..line.len() - trimmed.len()];
            let is_fn = trimmed.split_whitespace().find(|w| {
                !(w.starts_with("pub")
                    || ["const", "async", "unsafe", "extern", "\"C\""].contains(w))
            }) == Some("fn");
            if !is_fn || line.trim_end().ends_with(';') || line.trim_end().ends_with('}') {
                continue;
            }
            let close = format!("{indent}}}");
            if let Some(end) = lines[i..].iter().position(|l| *l == close) {
                if end + 1 > MAX_FN_LINES {
                    long.push(format!("{}:{} {} lines", file.display(), i + 1, end + 1));
                }
            }
        }
    }
    assert!(
        long.is_empty(),
        "functions over {MAX_FN_LINES} lines: {long:#?}"
    );
}

/// Check that clap, the command line's parser, is used in `cli/` (and
/// `main.rs`) only: the library's enums get their command-line names there.
#[test]
fn layers_clap_only_in_cli() {
    let root = src();
    let mut all = Vec::new();
    files(&root, &mut all);
    let outside: Vec<String> = all
        .iter()
        .filter(|f| !["cli", "main"].contains(&top_module(&root, f).as_str()))
        .filter(|f| code(&std::fs::read_to_string(f).expect("read")).contains("clap::"))
        .map(|f| f.display().to_string())
        .collect();
    assert!(outside.is_empty(), "clap used outside cli/: {outside:#?}");
}

/// The C sides (`bpf/`, `preload/`): function and file sizes (issue 42).
#[path = "layers/c_sizes.rs"]
mod c_sizes;
