//! `memtrail compare` on the results of real benchmarks (issue 14): a build
//! with 100 extra `malloc(64)` in `extra_allocs` regresses by exactly +100
//! allocations and +6,400 B at that function; two identical builds compare
//! equal.
//!
//! The benchmarks run once per test binary (each run is a full capture):
//! [`setup`] builds `tests/fixtures/bench_work.c` three times — twice as is
//! (two identical builds, two files) and once with `-DEXTRA` — and saves
//! each as a baseline of one results directory.

mod common;

use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use common::MEMTRAIL;
use serde_json::Value;

struct Setup {
    dir: PathBuf,
    extra_bin: PathBuf,
}

/// Compiles `tests/fixtures/bench_work.c` with `defines` into `out`.
fn build(out: &Path, defines: &[&str]) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let status = Command::new("cc")
        .args(["-O0", "-g", "-fno-builtin", "-Wall", "-Wextra", "-Werror"])
        .args(defines)
        .arg("-I")
        .arg(&src)
        .arg("-o")
        .arg(out)
        .arg(src.join("bench_work.c"))
        .status()
        .expect("run cc");
    assert!(status.success(), "cc bench_work.c {defines:?}");
}

fn memtrail(args: &[&OsString]) -> (i32, String, String) {
    let out = Command::new(MEMTRAIL)
        .args(args)
        .output()
        .expect("run memtrail");
    (
        out.status.code().expect("memtrail exited"),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn os(s: impl Into<OsString>) -> OsString {
    s.into()
}

/// `memtrail bench --dir DIR --save-baseline NAME --name work -q -- BIN`.
fn bench(dir: &Path, name: &str, bin: &Path) {
    let args = [
        os("bench"),
        os("--dir"),
        os(dir),
        os("--save-baseline"),
        os(name),
        os("--name"),
        os("work"),
        os("-q"),
        os("--"),
        os(bin),
    ];
    let (code, _, stderr) = memtrail(&args.iter().collect::<Vec<_>>());
    assert_eq!(code, 0, "memtrail bench {name}: {stderr}");
}

fn setup() -> &'static Setup {
    static SETUP: OnceLock<Setup> = OnceLock::new();
    SETUP.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("bench_compare");
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("create test directory");
        let (base, twin, extra) = (dir.join("base"), dir.join("twin"), dir.join("extra"));
        build(&base, &[]);
        build(&twin, &[]);
        build(&extra, &["-DEXTRA"]);
        let results = dir.join("results");
        bench(&results, "base", &base);
        bench(&results, "twin", &twin);
        bench(&results, "extra", &extra);
        Setup {
            dir: results,
            extra_bin: extra,
        }
    })
}

fn results(name: &str) -> OsString {
    setup().dir.join(name).join("results.json").into()
}

fn compare_json(base: &str, new: &str, extra: &[&str]) -> (i32, Value) {
    let mut args = vec![
        os("compare"),
        results(base),
        results(new),
        os("--format"),
        os("json"),
    ];
    args.extend(extra.iter().map(os));
    let (code, stdout, stderr) = memtrail(&args.iter().collect::<Vec<_>>());
    let doc = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("compare JSON: {e}\n{stdout}\n{stderr}"));
    (code, doc)
}

/// The `change` of each metric of benchmark `work`.
fn changes(doc: &Value) -> Vec<(String, i64, String)> {
    doc["benchmarks"][0]["metrics"]
        .as_array()
        .expect("metrics")
        .iter()
        .map(|m| {
            (
                m["metric"].as_str().unwrap().to_owned(),
                m["change"].as_i64().unwrap(),
                m["verdict"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// Check that 100 extra malloc(64) in `extra_allocs` make compare exit 1
/// and name that function with exactly +100 allocations and +6,400 B
/// (issue 14).
#[test]
fn bench_compare_names_the_extra_allocations() {
    let args = [os("compare"), results("base"), results("extra")];
    let (code, stdout, stderr) = memtrail(&args.iter().collect::<Vec<_>>());
    assert_eq!(code, 1, "{stdout}\n{stderr}");
    assert!(
        stdout.contains("+100 allocations (+6,400 B) at extra_allocs ("),
        "{stdout}"
    );
    assert!(stdout.contains("work: regressed"), "{stdout}");

    let (code, doc) = compare_json("base", "extra", &[]);
    assert_eq!(code, 1);
    let want: Vec<(String, i64, String)> = [
        ("allocations", 100, "regressed"),
        ("frees", 100, "regressed"),
        ("allocated_bytes", 6400, "regressed"),
        ("peak_live_bytes", 0, "unchanged"),
        ("leaked_bytes", 0, "unchanged"),
        ("leaked_blocks", 0, "unchanged"),
        ("mmap_peak_bytes", 0, "unchanged"),
        ("temporary_allocations", 0, "unchanged"),
    ]
    .iter()
    .map(|(m, c, v)| (m.to_string(), *c, v.to_string()))
    .collect();
    assert_eq!(changes(&doc), want);
    let sites = doc["benchmarks"][0]["sites"].as_array().expect("sites");
    assert_eq!(sites.len(), 1, "only the new site changed: {sites:?}");
    assert_eq!(sites[0]["allocations"], 100);
    assert_eq!(sites[0]["bytes"], 6400);
    let site = sites[0]["site"].as_str().unwrap();
    assert!(
        site.starts_with("extra_allocs (") && site.contains("bench_work.c:"),
        "{site}"
    );
    assert_eq!(doc["regressed"], true);
}

/// Check that two identical builds compare equal: exit 0, every change 0.
#[test]
fn bench_compare_identical_builds_change_nothing() {
    let (code, doc) = compare_json("base", "twin", &[]);
    assert_eq!(code, 0, "{doc:#}");
    let all = changes(&doc);
    assert_eq!(all.len(), 8);
    for (metric, change, verdict) in all {
        assert_eq!((change, verdict.as_str()), (0, "unchanged"), "{metric}");
    }
    assert_eq!(doc["benchmarks"][0]["status"], "unchanged");
    assert_eq!(doc["regressed"], false);
    // Each baseline of the setup replaced its temporary directory whole
    // (another test may be saving one of its own meanwhile).
    let left: Vec<String> = common::dir_entries(&setup().dir)
        .into_iter()
        .filter(|n| {
            [".base.", ".twin.", ".extra."]
                .iter()
                .any(|p| n.starts_with(p))
        })
        .collect();
    assert_eq!(left, Vec::<String>::new());
}

/// Check the Markdown report for a pull-request comment: the verdict, a
/// table row per metric and the site behind the regression.
#[test]
fn bench_compare_markdown_comment() {
    let args = [
        os("compare"),
        results("base"),
        results("extra"),
        os("--format"),
        os("markdown"),
    ];
    let (code, stdout, stderr) = memtrail(&args.iter().collect::<Vec<_>>());
    assert_eq!(code, 1, "{stderr}");
    assert!(stdout.starts_with("### ❌ memtrail"), "{stdout}");
    assert!(
        stdout.contains("| allocations | 11 | 111 | +100 (+909.09%) | REGRESSED |"),
        "{stdout}"
    );
    assert!(
        stdout.contains("| allocated | 10,100 B | 16,500 B | +6,400 B (+63.37%) | REGRESSED |"),
        "{stdout}"
    );
    assert!(
        stdout.contains("\n- +100 allocations (+6,400 B) at extra_allocs ("),
        "{stdout}"
    );
}

/// Check that an improvement (the extra build as the base) exits 0.
#[test]
fn bench_compare_improvement_is_no_regression() {
    let (code, doc) = compare_json("extra", "base", &[]);
    assert_eq!(code, 0);
    assert_eq!(doc["benchmarks"][0]["status"], "improved");
}

/// Check thresholds: +909% allocations and +1000% frees are within
/// `1000%`, but not within `allocations=99` (absolute) or `900%`.
#[test]
fn bench_compare_thresholds_decide_the_verdict() {
    assert_eq!(
        compare_json("base", "extra", &["--threshold", "1000%"]).0,
        0
    );
    assert_eq!(
        compare_json("base", "extra", &["--threshold", "1000%,allocations=100"]).0,
        0
    );
    let (code, doc) = compare_json("base", "extra", &["--threshold", "1000%,allocations=99"]);
    assert_eq!(code, 1);
    let verdicts: Vec<String> = changes(&doc).into_iter().map(|c| c.2).collect();
    assert_eq!(verdicts[0], "regressed");
    assert_eq!(verdicts[1], "within");
    assert_eq!(compare_json("base", "extra", &["--threshold", "900%"]).0, 1);
    // A bad threshold is bad usage.
    let args = [
        os("compare"),
        results("base"),
        results("extra"),
        os("--threshold"),
        os("speed=1%"),
    ];
    let (code, _, stderr) = memtrail(&args.iter().collect::<Vec<_>>());
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("unknown metric `speed`"), "{stderr}");
}

/// Check that compare takes two profiles as well as two results files.
#[test]
fn bench_compare_two_profiles() {
    let dir = &setup().dir;
    let args = [
        os("compare"),
        os(dir.join("base/work/run-1.json")),
        os(dir.join("extra/work/run-1.json")),
    ];
    let (code, stdout, stderr) = memtrail(&args.iter().collect::<Vec<_>>());
    assert_eq!(code, 1, "{stdout}\n{stderr}");
    assert!(
        stdout.contains("+100 allocations (+6,400 B) at extra_allocs ("),
        "{stdout}"
    );
}

/// Check that a file that is neither results nor a profile, or a missing
/// one, is bad input (exit 2), and that results compared with nothing in
/// common are no regression.
#[test]
fn bench_compare_bad_input_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk.json");
    fs::write(&junk, "{\"format\": \"something-else\"}").unwrap();
    for bad in [junk.clone(), dir.path().join("missing.json")] {
        let args = [os("compare"), results("base"), os(&bad)];
        let (code, stdout, stderr) = memtrail(&args.iter().collect::<Vec<_>>());
        assert_eq!(code, 2, "{}: {stderr}", bad.display());
        assert!(stdout.is_empty());
        assert!(stderr.contains("memtrail: error:"), "{stderr}");
    }
}

/// Check `memtrail bench --baseline`: the run is compared with the saved
/// baseline, the regression named on stderr, and bench exits 1.
#[test]
fn bench_compare_against_saved_baseline() {
    let s = setup();
    let args = [
        os("bench"),
        os("--dir"),
        os(&s.dir),
        os("--baseline"),
        os("base"),
        os("--save-baseline"),
        os("candidate"),
        os("--name"),
        os("work"),
        os("-q"),
        os("--"),
        os(&s.extra_bin),
    ];
    let (code, _, stderr) = memtrail(&args.iter().collect::<Vec<_>>());
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("+100 allocations (+6,400 B) at extra_allocs ("),
        "{stderr}"
    );
    // A baseline that does not exist is bad input, before anything runs.
    let args = [
        os("bench"),
        os("--dir"),
        os(&s.dir),
        os("--baseline"),
        os("nope"),
        os("--"),
        os(&s.extra_bin),
    ];
    let (code, _, stderr) = memtrail(&args.iter().collect::<Vec<_>>());
    assert_eq!(code, 2, "{stderr}");
    assert!(!s.dir.join("new").exists(), "nothing ran");
}

/// Check the differential flame graph of the two builds: an SVG that has
/// the new function.
#[test]
fn bench_compare_differential_flamegraph() {
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("diff.svg");
    let args = [
        os("compare"),
        results("base"),
        results("extra"),
        os("--format"),
        os("flamegraph"),
        os("-o"),
        os(&svg),
    ];
    let (code, _, stderr) = memtrail(&args.iter().collect::<Vec<_>>());
    assert_eq!(code, 1, "{stderr}");
    let text = fs::read_to_string(&svg).expect("the SVG");
    assert!(
        text.starts_with("<?xml"),
        "{}",
        &text[..100.min(text.len())]
    );
    assert!(text.contains("extra_allocs"));
    // Both functions are there, and the graph is of the new profile.
    assert!(text.contains("work"));
}
