//! `memtrail bench` runs (issue 14): a suite file, --runs spread and
//! non-determinism, and the BMF and github-action-benchmark outputs checked
//! against their documented schemas.

use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::support::{self, MEMTRAIL, fixture};
use serde_json::Value;

fn memtrail(args: &[OsString]) -> (i32, String, String) {
    let out = Command::new(support::memtrail_bin())
        .args(args)
        .output()
        .expect("run memtrail");
    (
        out.status.code().expect("memtrail exited"),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn args(v: &[&dyn AsRef<std::ffi::OsStr>]) -> Vec<OsString> {
    v.iter().map(|a| a.as_ref().to_os_string()).collect()
}

struct Suite {
    dir: PathBuf,
    results: Value,
    stderr: String,
}

/// A suite of two benchmarks run 3 times: `steady` (bench_work) and
/// `varying` (bench_counter, 1, 2 and 3 allocations of 32 bytes).
fn suite() -> &'static Suite {
    static SUITE: OnceLock<Suite> = OnceLock::new();
    SUITE.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("bench_runs");
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("work")).unwrap();
        let suite = dir.join("suite.toml");
        fs::write(
            &suite,
            format!(
                "runs = 1\n\
                 [[bench]]\n\
                 name = \"steady\"\n\
                 command = [\"{}\"]\n\
                 [[bench]]\n\
                 name = \"varying\"\n\
                 command = [\"{}\"]\n\
                 cwd = \"work\"\n\
                 env = {{ BENCH_COUNTER = \"counter\" }}\n",
                fixture("bench_work").display(),
                fixture("bench_counter").display()
            ),
        )
        .unwrap();
        let (code, _, stderr) = memtrail(&args(&[
            &"bench",
            &"--suite",
            &suite,
            &"--runs",
            &"3",
            &"--dir",
            &dir.join("results"),
        ]));
        assert_eq!(code, 0, "{stderr}");
        let text = fs::read(dir.join("results/new/results.json")).expect("results.json");
        Suite {
            results: serde_json::from_slice(&text).unwrap(),
            dir,
            stderr,
        }
    })
}

fn bench<'a>(results: &'a Value, name: &str) -> &'a Value {
    results["benchmarks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["name"] == name)
        .unwrap_or_else(|| panic!("no benchmark {name}: {results:#}"))
}

/// Check that a benchmark whose allocations differ between runs is flagged
/// non-deterministic with --runs 3, with the site that differed and its
/// exact per-run counts, and that a deterministic one is not (issue 14).
#[test]
fn bench_runs_flags_non_deterministic_benchmark() {
    let s = suite();
    let varying = bench(&s.results, "varying");
    assert_eq!(varying["runs"], 3);
    assert_eq!(varying["deterministic"], false);
    let allocs = &varying["metrics"]["allocations"];
    assert_eq!(allocs["runs"], serde_json::json!([1, 2, 3]));
    assert_eq!(
        (allocs["min"].as_u64(), allocs["max"].as_u64()),
        (Some(1), Some(3))
    );
    assert_eq!(allocs["value"], 2, "the median run");
    assert_eq!(
        varying["metrics"]["allocated_bytes"]["runs"],
        serde_json::json!([32, 64, 96])
    );
    let sites = varying["differing_sites"].as_array().unwrap();
    assert_eq!(sites.len(), 1, "{sites:?}");
    assert!(
        sites[0]["site"]
            .as_str()
            .unwrap()
            .starts_with("varying_allocs ("),
        "{sites:?}"
    );
    assert_eq!(sites[0]["allocations"], serde_json::json!([1, 2, 3]));
    assert_eq!(sites[0]["bytes"], serde_json::json!([32, 64, 96]));
    assert_eq!(varying["profile"], "varying/run-2.json");
    // The env and cwd of the suite: the counter is in work/.
    assert_eq!(fs::read_to_string(s.dir.join("work/counter")).unwrap(), "3");
    assert!(s.stderr.contains("NON-DETERMINISTIC"), "{}", s.stderr);
    assert!(s.stderr.contains("varying: run 3 of 3"), "{}", s.stderr);

    let steady = bench(&s.results, "steady");
    assert_eq!(steady["deterministic"], true);
    assert_eq!(steady["differing_sites"], serde_json::json!([]));
    for (metric, stat) in steady["metrics"].as_object().unwrap() {
        let runs = stat["runs"].as_array().unwrap();
        assert_eq!(runs.len(), 3);
        assert!(runs.iter().all(|r| *r == runs[0]), "{metric}: {runs:?}");
    }
    assert_eq!(steady["metrics"]["allocations"]["value"], 11);
    assert_eq!(steady["metrics"]["allocated_bytes"]["value"], 10100);
    assert_eq!(steady["metrics"]["peak_live_bytes"]["value"], 10000);
    assert_eq!(steady["metrics"]["leaked_bytes"]["value"], 100);
    assert_eq!(steady["metrics"]["leaked_blocks"]["value"], 1);
    // Ten blocks freed after all were allocated: none temporary; each of
    // varying's blocks is freed at once: all temporary (issue 15).
    assert_eq!(steady["metrics"]["temporary_allocations"]["value"], 0);
    assert_eq!(
        varying["metrics"]["temporary_allocations"]["runs"],
        serde_json::json!([1, 2, 3])
    );
    assert_eq!(steady["exit"]["code"], 0);
    // Every run's profile is kept for drill-down.
    for p in steady["profiles"].as_array().unwrap() {
        let path = s.dir.join("results/new").join(p.as_str().unwrap());
        assert!(path.is_file(), "{}", path.display());
    }
}

fn render(format: &str) -> Value {
    let s = suite();
    let (code, stdout, stderr) = memtrail(&args(&[
        &"bench",
        &"--from",
        &s.dir.join("results/new/results.json"),
        &"--format",
        &format,
    ]));
    assert_eq!(code, 0, "{stderr}");
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{format}: {e}\n{stdout}"))
}

/// Bencher Metric Format (bencher.dev/docs/reference/bencher-metric-format):
/// an object of benchmarks (non-empty names), each an object of measures
/// (non-empty slugs of at most 64 characters), each an object with a
/// numeric `value` and optional numeric `lower_value` and `upper_value`.
fn check_bmf(doc: &Value) {
    let benches = doc.as_object().expect("BMF: an object");
    assert!(!benches.is_empty());
    for (name, measures) in benches {
        assert!(
            !name.is_empty() && name.len() <= 1024,
            "benchmark name {name:?}"
        );
        let measures = measures.as_object().expect("BMF: a benchmark is an object");
        for (slug, metric) in measures {
            assert!(!slug.is_empty() && slug.len() <= 64, "measure {slug:?}");
            let metric = metric.as_object().expect("BMF: a metric is an object");
            assert!(metric["value"].is_number(), "{name}/{slug}: value");
            for (key, v) in metric {
                assert!(
                    ["value", "lower_value", "upper_value"].contains(&key.as_str()),
                    "{name}/{slug}: unexpected {key}"
                );
                assert!(v.is_number(), "{name}/{slug}/{key}: a number");
            }
            let (lo, v, hi) = (
                metric.get("lower_value").and_then(Value::as_f64),
                metric["value"].as_f64().unwrap(),
                metric.get("upper_value").and_then(Value::as_f64),
            );
            assert!(lo.is_none_or(|lo| lo <= v) && hi.is_none_or(|hi| v <= hi));
        }
    }
}

/// github-action-benchmark `customSmallerIsBetter` (its README, "Examples",
/// custom benchmarks): an array of objects with string `name` and `unit`,
/// numeric `value`, and optional string `range` and `extra`.
fn check_gab(doc: &Value) {
    let entries = doc.as_array().expect("gab: an array");
    assert!(!entries.is_empty());
    for e in entries {
        let e = e.as_object().expect("gab: entries are objects");
        assert!(e["name"].as_str().is_some_and(|n| !n.is_empty()), "{e:?}");
        assert!(e["unit"].is_string(), "{e:?}");
        assert!(e["value"].is_number(), "{e:?}");
        for (key, v) in e {
            match key.as_str() {
                "name" | "unit" | "value" => {}
                "range" | "extra" => assert!(v.is_string(), "{key}: a string"),
                other => panic!("gab: unexpected key {other}"),
            }
        }
    }
}

/// Check that --format bmf and --format gab match their documented schemas
/// and carry the exact values of the results.
#[test]
fn bench_runs_bmf_and_gab_match_their_schemas() {
    let bmf = render("bmf");
    check_bmf(&bmf);
    assert_eq!(bmf["steady"]["allocations"]["value"], 11.0);
    assert_eq!(bmf["varying"]["allocations"]["lower_value"], 1.0);
    assert_eq!(bmf["varying"]["allocations"]["upper_value"], 3.0);
    assert_eq!(bmf["steady"]["allocated-bytes"]["value"], 10100.0);
    assert_eq!(bmf["steady"].as_object().unwrap().len(), 8);

    let gab = render("gab");
    check_gab(&gab);
    let entries = gab.as_array().unwrap();
    // Smaller-is-better metrics only: not frees nor temporary allocations,
    // whose growth is no regression (issue 26).
    assert_eq!(entries.len(), 12, "6 judged metrics of 2 benchmarks");
    assert!(
        !entries
            .iter()
            .any(|e| e["name"] == "steady - frees" || e["name"] == "steady - temporary_allocations"),
        "{gab:#}"
    );
    let peak = entries
        .iter()
        .find(|e| e["name"] == "steady - peak_live_bytes")
        .expect("steady - peak_live_bytes");
    assert_eq!(
        (peak["value"].as_u64(), peak["unit"].as_str()),
        (Some(10000), Some("bytes"))
    );

    // The schema checks can fail: a string value is not BMF.
    let bad =
        std::panic::catch_unwind(|| check_bmf(&serde_json::json!({"b": {"m": {"value": "1"}}})));
    assert!(bad.is_err());
    let bad =
        std::panic::catch_unwind(|| check_gab(&serde_json::json!([{"name": "x", "value": 1}])));
    assert!(bad.is_err());
}

/// Check the Markdown table: a header, a separator and one row per
/// benchmark, all with the same number of cells.
#[test]
fn bench_runs_markdown_table() {
    let s = suite();
    let (code, stdout, stderr) = memtrail(&args(&[
        &"bench",
        &"--from",
        &s.dir.join("results/new/results.json"),
        &"--format",
        &"markdown",
    ]));
    assert_eq!(code, 0, "{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 4, "{stdout}");
    let cells = |l: &str| l.matches('|').count();
    assert!(
        lines.iter().all(|l| cells(l) == cells(lines[0])),
        "{stdout}"
    );
    assert!(
        lines[3].contains("`varying` (non-deterministic over 3 runs)"),
        "{stdout}"
    );
    assert!(lines[3].contains("| 2 (1..3) |"), "{stdout}");
}

/// Check that an invalid suite is bad input (exit 2) and runs nothing.
#[test]
fn bench_runs_invalid_suite_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("suite.toml");
    fs::write(
        &suite,
        "[[bench]]\nname = \"x\"\ncommand = [\"true\"]\nrun = 3\n",
    )
    .unwrap();
    let (code, _, stderr) = memtrail(&args(&[
        &"bench",
        &"--suite",
        &suite,
        &"--dir",
        &dir.path().join("out"),
    ]));
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("unknown field `run`"), "{stderr}");
    assert!(!dir.path().join("out/new").exists());
}

/// Check that a capture that fails ends the bench with its exit code and
/// leaves no results behind: a command that does not exist (127).
#[test]
fn bench_runs_failed_capture_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let (code, _, stderr) = memtrail(&args(&[
        &"bench",
        &"--dir",
        &out,
        &"-q",
        &"--",
        &"/nonexistent/memtrail-bench-test",
    ]));
    assert_eq!(code, 127, "{stderr}");
    assert!(stderr.contains("the capture failed"), "{stderr}");
    assert_eq!(support::dir_entries(&out), Vec::<String>::new());
}

/// Check that MEMTRAIL_PRESSURE_TIMEOUT is honoured by `run` and `bench`
/// alike: an invalid value is bad usage (exit 2) naming it, before
/// anything runs (issue 14).
#[test]
fn bench_runs_pressure_timeout_from_environment() {
    let dir = tempfile::tempdir().unwrap();
    for cmd in [
        args(&[&"run", &"--", &"true"]),
        args(&[&"bench", &"--dir", &dir.path(), &"--", &"true"]),
    ] {
        let out = Command::new(MEMTRAIL)
            .args(&cmd)
            .env("MEMTRAIL_PRESSURE_TIMEOUT", "soon")
            .output()
            .expect("run memtrail");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{cmd:?}: {stderr}");
        assert!(
            stderr.contains("invalid pressure timeout `soon`"),
            "{stderr}"
        );
    }
    assert_eq!(support::dir_entries(dir.path()), Vec::<String>::new());
}

/// Check that a suite whose benchmark could not be started is bad input
/// (exit 2, naming the benchmark and why) before anything runs (issue 26:
/// these were internal failures, exit 70): a working directory that is
/// missing or a file, a NUL byte in the command or the environment, an
/// environment variable's name with `=`.
#[test]
fn bench_runs_unusable_benchmark_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("a-file"), "").unwrap();
    for (entry, needle) in [
        ("cwd = \"missing\"", "its working directory"),
        ("cwd = \"a-file\"", "is not a directory"),
        (
            "command = [\"true\", \"a\\u0000b\"]",
            "its command has a NUL byte",
        ),
        (
            "env = { X = \"a\\u0000b\" }",
            "environment variable X has a NUL byte",
        ),
        (
            "env = { \"X=Y\" = \"1\" }",
            "cannot name an environment variable",
        ),
    ] {
        let command = if entry.starts_with("command") {
            String::new()
        } else {
            "command = [\"true\"]\n".to_owned()
        };
        let suite = dir.path().join("suite.toml");
        fs::write(
            &suite,
            format!("[[bench]]\nname = \"b\"\n{command}{entry}\n"),
        )
        .unwrap();
        let out = dir.path().join("out");
        let (code, _, stderr) = memtrail(&args(&[&"bench", &"--suite", &suite, &"--dir", &out]));
        assert_eq!(code, 2, "{entry}: {stderr}");
        assert!(
            stderr.contains("benchmark `b`") && stderr.contains(needle),
            "{entry}: {stderr}"
        );
        assert!(!out.join("new").exists(), "{entry}: something ran");
    }
}
