//! Temporary allocations: blocks their thread frees before allocating or
//! freeing anything else (heaptrack's rule, kept per thread), exactly, in
//! totals, per process and per site (issue 15).

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::path::Path;

use serde_json::Value;

use crate::support::{capture, cmd, field, memtrail, num, process, stream_root};

/// (allocations, temporary allocations) summed per innermost function.
fn by_function(profile: &Value) -> BTreeMap<String, (u64, u64)> {
    let mut out = BTreeMap::new();
    for s in profile["stacks"].as_array().expect("stacks") {
        let Some(f) = s["frames"][0]["function"].as_str() else {
            continue;
        };
        if num(s, "allocations") == 0 {
            continue; // a mapping site (the loader's direct syscalls)
        }
        let e: &mut (u64, u64) = out.entry(f.to_owned()).or_default();
        e.0 += num(s, "allocations");
        e.1 += num(s, "temporary_allocations");
    }
    out
}

fn expected_sites() -> BTreeMap<String, (u64, u64)> {
    [
        ("temp_block", (50, 50)),
        ("outer_block", (20, 0)),
        ("inner_block", (20, 20)),
        ("held_block", (20, 0)),
        ("reset_block", (20, 0)),
        ("grow_start", (10, 10)),
        ("grow_more", (10, 10)),
        ("leak_block", (5, 0)),
    ]
    .into_iter()
    .map(|(f, v)| (f.to_owned(), v))
    .collect()
}

/// Check that a single-threaded fixture's temporary allocations are counted
/// exactly: a block freed right after its allocation, the last of two
/// blocks freed first, a block moved by realloc and the realloc'd block are
/// temporary; a block freed after another allocation, or after another
/// free, or never freed, is not.
#[test]
fn track_temporary_allocations_exact() {
    let run = capture(&cmd("temporary", &[]));
    run.expect_code(0);
    let profile = run.profile();
    let totals = field(profile, "totals");
    assert_eq!(num(totals, "allocations"), 155, "{totals}");
    assert_eq!(num(totals, "reallocs"), 10, "{totals}");
    assert_eq!(num(totals, "temporary_allocations"), 90, "{totals}");
    let root = process(profile, stream_root(run.events()));
    assert_eq!(num(root, "temporary_allocations"), 90, "{root}");
    assert_eq!(by_function(profile), expected_sites());
}

/// Check that the rule is per thread: a thread's block freed after another
/// thread allocated and freed is still temporary, as is that other
/// thread's block.
#[test]
fn track_temporary_per_thread() {
    let run = capture(&cmd("temporary", &[OsStr::new("thread")]));
    run.expect_code(0);
    let sites = by_function(run.profile());
    assert_eq!(sites.get("thread_block"), Some(&(1, 1)), "{sites:?}");
    assert_eq!(sites.get("main_block"), Some(&(1, 1)), "{sites:?}");
    for (f, v) in &expected_sites() {
        assert_eq!(sites.get(f), Some(v), "{f}: {sites:?}");
    }
}

/// Runs `memtrail report PROFILE --by temporary ARGS`; returns stdout.
fn report(profile: &Path, args: &[&str]) -> Vec<u8> {
    let mut all: Vec<OsString> = vec!["report".into(), profile.into()];
    all.extend(["--by", "temporary"].iter().chain(args).map(OsString::from));
    let (_, status, stdout, stderr) = memtrail(&all, b"");
    assert_eq!(status.code(), Some(0), "{args:?}: {stderr}");
    stdout
}

/// Check that `--by temporary` ranks sites by their temporary allocations
/// in every report format: text, JSON, folded stacks, flame graph, pprof;
/// and that the summary names them when they are a large share (90 of
/// 155 allocations).
#[test]
fn track_temporary_report_by_temporary() {
    let run = capture(&cmd("temporary", &[]));
    run.expect_code(0);
    assert!(
        run.stderr
            .contains("temporary           90         58.1%   of allocations"),
        "{}",
        run.stderr
    );
    let profile = run.dir.path().join("profile.json");

    let text = String::from_utf8(report(&profile, &[])).expect("utf-8");
    assert!(
        text.contains("top 4 of 4 allocation sites by temporary allocations"),
        "{text}"
    );
    assert!(text.contains("\n#1  50 temporary (55.6%), "), "{text}");
    assert!(text.contains("\n    temp_block at "), "{text}");

    let json: Value =
        serde_json::from_slice(&report(&profile, &["--format", "json"])).expect("json");
    assert_eq!(json["by"], "temporary");
    assert_eq!(json["total"], 90);
    let mut ranked: Vec<(&str, u64)> = json["stacks"]
        .as_array()
        .expect("stacks")
        .iter()
        .map(|s| {
            (
                s["frames"][0]["function"].as_str().unwrap_or("?"),
                num(s, "temporary_allocations"),
            )
        })
        .collect();
    // The two sites of 10 tie: their order is their stack ids'.
    ranked[2..].sort();
    assert_eq!(
        ranked,
        [
            ("temp_block", 50),
            ("inner_block", 20),
            ("grow_more", 10),
            ("grow_start", 10)
        ]
    );

    let folded = String::from_utf8(report(&profile, &["--format", "folded"])).expect("utf-8");
    let mut values: Vec<(String, u64)> = folded
        .lines()
        .map(|l| {
            let (stack, v) = l.rsplit_once(' ').expect("value");
            let leaf = stack.rsplit(';').next().unwrap_or(stack).to_owned();
            (leaf, v.parse().expect("number"))
        })
        .collect();
    values.sort();
    let want: Vec<(String, u64)> = [
        ("grow_more", 10),
        ("grow_start", 10),
        ("inner_block", 20),
        ("temp_block", 50),
    ]
    .iter()
    .map(|(f, v)| ((*f).to_owned(), *v))
    .collect();
    assert_eq!(values, want);

    let svg = String::from_utf8(report(&profile, &["--format", "flamegraph"])).expect("utf-8");
    assert!(svg.contains("temp_block (50 allocations"), "{svg}");

    let pprof = report(&profile, &["--format", "pprof"]);
    assert_eq!(&pprof[..2], [0x1f, 0x8b], "gzip");
}
