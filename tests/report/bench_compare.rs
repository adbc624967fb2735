//! `memtrail compare` on the results of real benchmarks (issue 14): a build
//! with 100 extra `malloc(64)` in `extra_allocs` regresses by exactly +100
//! allocations and +6,400 B at that function; two identical builds compare
//! equal.
//!
//! The benchmarks run once per test binary (each run is a full capture):
//! [`setup`] builds `tests/fixtures/bench_work.c` three times — twice as is
//! (two identical builds, two files) and once with `-DEXTRA` — and
//! `tests/fixtures/bench_leak.c` twice — leaking, and with `-DFIXED` — and
//! saves each as a baseline of one results directory.
//!
//! Runs go through [`support::memtrail_bin`], so `MEMTRAIL_BIN` can point
//! them at another build (the one before a fix, to see a test fail).

use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::support;
use serde_json::Value;

struct Setup {
    dir: PathBuf,
    base_bin: PathBuf,
    extra_bin: PathBuf,
}

/// Compiles `tests/fixtures/NAME.c` with `defines` into `out`.
fn build(name: &str, out: &Path, defines: &[&str]) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let status = Command::new("cc")
        .args(["-O0", "-g", "-fno-builtin", "-Wall", "-Wextra", "-Werror"])
        .args(defines)
        .arg("-I")
        .arg(&src)
        .arg("-o")
        .arg(out)
        .arg(src.join(format!("{name}.c")))
        .status()
        .expect("run cc");
    assert!(status.success(), "cc {name}.c {defines:?}");
}

fn memtrail(args: &[&OsString]) -> (i32, String, String) {
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
        build("bench_work", &base, &[]);
        build("bench_work", &twin, &[]);
        build("bench_work", &extra, &["-DEXTRA"]);
        let (leaky, fixed) = (dir.join("leaky"), dir.join("fixed"));
        build("bench_leak", &leaky, &[]);
        build("bench_leak", &fixed, &["-DFIXED"]);
        let results = dir.join("results");
        bench(&results, "base", &base);
        bench(&results, "twin", &twin);
        bench(&results, "extra", &extra);
        bench(&results, "leaky", &leaky);
        bench(&results, "fixed", &fixed);
        Setup {
            dir: results,
            base_bin: base,
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
        // Not judged: 100 frees more follow from 100 allocations more.
        ("frees", 100, "not_judged"),
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
    let left: Vec<String> = support::dir_entries(&setup().dir)
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

/// Check thresholds: +909% allocations and +63% bytes are within `1000%`,
/// but not within `allocations=99` (absolute) or `900%`.
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
    assert_eq!(verdicts[1], "not_judged", "frees");
    assert_eq!(verdicts[2], "within", "allocated_bytes");
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

/// Check that `compare` reads zstd input bounded by what it inflates to
/// (issue 40): a few KiB inflating to 256 MiB of JSON are bad input (exit
/// 2) once past 100 times their size (at least 16 MiB), in under 150 MB
/// (a document that size parsed whole takes gigabytes).
#[test]
fn bench_compare_zstd_bomb_bounded() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let bomb = dir.path().join("bomb.json.zst");
    let mut z = zstd::stream::write::Encoder::new(fs::File::create(&bomb).unwrap(), 3).unwrap();
    z.write_all(b"{\"format\": \"memtrail-bench\", \"x\": [")
        .unwrap();
    let chunk = "0,".repeat(1 << 19);
    for _ in 0..256 {
        z.write_all(chunk.as_bytes()).unwrap();
    }
    z.write_all(b"0]}").unwrap();
    z.finish().unwrap();
    let size = fs::metadata(&bomb).unwrap().len();
    assert!(size < 200 << 10, "{size} bytes");
    let run = crate::support::report::measured(&[os("compare"), os(&bomb), os(&bomb)]);
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert!(
        run.stderr.contains("compressed bytes may inflate to"),
        "{}",
        run.stderr
    );
    assert!(
        run.max_rss_kib < 150 << 10,
        "peak RSS {} KiB",
        run.max_rss_kib
    );
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

/// The verdict of each metric of benchmark `work`, by metric.
fn verdicts(doc: &Value) -> std::collections::BTreeMap<String, String> {
    changes(doc).into_iter().map(|(m, _, v)| (m, v)).collect()
}

/// Check that fixing a leak passes the gate (issue 26): 10 leaked blocks
/// of 100 bytes freed adds 10 frees and 10 temporary allocations, which are
/// shown but never judged, and the leak metrics improve: exit 0, status
/// `improved`. `--threshold frees=inf` is accepted.
#[test]
fn bench_compare_leak_fix_is_no_regression() {
    let (code, doc) = compare_json("leaky", "fixed", &[]);
    assert_eq!(code, 0, "{doc:#}");
    assert_eq!(doc["benchmarks"][0]["status"], "improved", "{doc:#}");
    assert_eq!(doc["regressed"], false);
    let want: Vec<(String, i64, String)> = [
        ("allocations", 0, "unchanged"),
        ("frees", 10, "not_judged"),
        ("allocated_bytes", 0, "unchanged"),
        ("peak_live_bytes", -900, "improved"),
        ("leaked_bytes", -1000, "improved"),
        ("leaked_blocks", -10, "improved"),
        ("mmap_peak_bytes", 0, "unchanged"),
        ("temporary_allocations", 10, "not_judged"),
    ]
    .iter()
    .map(|(m, c, v)| (m.to_string(), *c, v.to_string()))
    .collect();
    assert_eq!(changes(&doc), want);
    let judged: Vec<bool> = doc["benchmarks"][0]["metrics"]
        .as_array()
        .expect("metrics")
        .iter()
        .map(|m| m["judged"].as_bool().expect("judged"))
        .collect();
    assert_eq!(judged, [true, false, true, true, true, true, true, false]);
    // The text report says so.
    let args = [os("compare"), results("leaky"), results("fixed")];
    let (code, stdout, stderr) = memtrail(&args.iter().collect::<Vec<_>>());
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("work: improved"), "{stdout}");
    assert!(!stdout.contains("REGRESSED"), "{stdout}");
    assert!(stdout.contains("not judged"), "{stdout}");
    // The leak back (the fix reverted) regresses on the leak metrics only.
    let (code, doc) = compare_json("fixed", "leaky", &[]);
    assert_eq!(code, 1);
    let v = verdicts(&doc);
    assert_eq!(v["leaked_blocks"], "regressed");
    assert_eq!(v["frees"], "not_judged");
    // `inf`: the metric is left out of the verdict.
    let (code, doc) = compare_json(
        "fixed",
        "leaky",
        &["--threshold", "frees=inf,peak=inf,leaked=inf,blocks=inf"],
    );
    assert_eq!(code, 0, "{doc:#}");
    assert_eq!(verdicts(&doc)["leaked_blocks"], "within");
    assert_eq!(doc["thresholds"]["per_metric"]["leaked_blocks"], "inf");
}

/// Check that ambiguous or empty input is refused with exit 2 and a
/// message (issue 26): results with two benchmarks of one name, an empty
/// `--threshold` (or entry), a metric's limit (or the limit of every
/// metric) given twice, and a finite limit for a metric that is not
/// judged.
#[test]
fn bench_compare_ambiguous_input_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let mut doc: Value = serde_json::from_slice(&fs::read(results("base")).unwrap()).unwrap();
    let first = doc["benchmarks"][0].clone();
    doc["benchmarks"].as_array_mut().unwrap().push(first);
    let twice = dir.path().join("twice.json");
    fs::write(&twice, serde_json::to_vec(&doc).unwrap()).unwrap();
    for (base, new) in [(os(&twice), results("base")), (results("base"), os(&twice))] {
        let args = [os("compare"), base, new];
        let (code, stdout, stderr) = memtrail(&args.iter().collect::<Vec<_>>());
        assert_eq!(code, 2, "{stdout}{stderr}");
        assert!(
            stderr.contains("two benchmarks are named `work`"),
            "{stderr}"
        );
        assert!(stdout.is_empty(), "{stdout}");
    }
    // `bench --from` reads results alike.
    let args = [os("bench"), os("--from"), os(&twice)];
    let (code, _, stderr) = memtrail(&args.iter().collect::<Vec<_>>());
    assert_eq!(code, 2, "{stderr}");
    // A region `r` of `work` compares as `work/r`: a benchmark of that
    // name is the same name twice.
    doc["benchmarks"][0]["regions"] = serde_json::json!({ "r": {} });
    doc["benchmarks"][1]["name"] = serde_json::json!("work/r");
    fs::write(&twice, serde_json::to_vec(&doc).unwrap()).unwrap();
    let args = [os("compare"), results("base"), os(&twice)];
    let (code, _, stderr) = memtrail(&args.iter().collect::<Vec<_>>());
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("two benchmarks are named `work/r`"),
        "{stderr}"
    );
    for (thresholds, needle) in [
        (vec![""], "has an empty limit"),
        (vec!["1%,"], "has an empty limit"),
        (
            vec!["peak=0.5%,peak=1%"],
            "the limit of `peak_live_bytes` twice",
        ),
        (vec!["peak=1%", "peak_live_bytes=1%"], "twice"),
        (vec!["1%,2%"], "the limit of every metric twice"),
        (vec!["1%", "leaked=0,1%"], "the limit of every metric twice"),
        (vec!["frees=1000%"], "`frees` is not judged"),
        (vec!["temporary=0"], "`temporary_allocations` is not judged"),
    ] {
        let mut args = vec![os("compare"), results("base"), results("extra")];
        for t in &thresholds {
            args.push(os("--threshold"));
            args.push(os(t));
        }
        let (code, stdout, stderr) = memtrail(&args.iter().collect::<Vec<_>>());
        assert_eq!(code, 2, "{thresholds:?}: {stdout}{stderr}");
        assert!(stderr.contains(needle), "{thresholds:?}: {stderr}");
        assert!(stdout.is_empty(), "{thresholds:?}: {stdout}");
    }
}

/// Check that `-o PATH` without `--format` picks the format from PATH's
/// extension (issue 26: `bench -o results.json` wrote a text table, which
/// compare could not read): bench `.json` the results document, `.md`
/// Markdown, other text; compare `.json` JSON, `.md` Markdown, `.svg` a
/// flame graph. `--format` still wins.
#[test]
fn bench_compare_output_format_from_extension() {
    let dir = tempfile::tempdir().unwrap();
    let out = |name: &str| dir.path().join(name);
    for (name, format) in [
        ("r.json", None),
        ("r.md", None),
        ("r.txt", None),
        ("forced.json", Some("markdown")),
    ] {
        let mut args = vec![
            os("bench"),
            os("--from"),
            results("extra"),
            os("-o"),
            os(out(name)),
        ];
        if let Some(f) = format {
            args.extend([os("--format"), os(f)]);
        }
        let (code, _, stderr) = memtrail(&args.iter().collect::<Vec<_>>());
        assert_eq!(code, 0, "{name}: {stderr}");
    }
    let json: Value = serde_json::from_slice(&fs::read(out("r.json")).unwrap())
        .expect("r.json is the results document");
    assert_eq!(json["format"], "memtrail-bench");
    for md in ["r.md", "forced.json"] {
        let text = fs::read_to_string(out(md)).unwrap();
        assert!(text.starts_with("| benchmark |"), "{md}: {text}");
    }
    let text = fs::read_to_string(out("r.txt")).unwrap();
    assert!(text.starts_with("work (1 run, exit code 0)"), "{text}");
    // A results document written by -o is what compare reads.
    let args = [os("compare"), results("base"), os(out("r.json"))];
    let (code, stdout, stderr) = memtrail(&args.iter().collect::<Vec<_>>());
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stdout.contains("+100 allocations (+6,400 B) at extra_allocs ("),
        "{stdout}"
    );
    for (name, starts) in [
        ("c.json", "{"),
        ("c.md", "### ❌ memtrail"),
        ("c.svg", "<?xml"),
        ("c.txt", "memtrail compare: "),
    ] {
        let args = [
            os("compare"),
            results("base"),
            results("extra"),
            os("-o"),
            os(out(name)),
        ];
        let (code, _, stderr) = memtrail(&args.iter().collect::<Vec<_>>());
        assert_eq!(code, 1, "{name}: {stderr}");
        let text = fs::read_to_string(out(name)).unwrap();
        assert!(
            text.starts_with(starts),
            "{name}: {}",
            &text[..80.min(text.len())]
        );
    }
    let doc: Value = serde_json::from_slice(&fs::read(out("c.json")).unwrap()).unwrap();
    assert_eq!(doc["format"], "memtrail-compare");
}

/// `memtrail bench --dir DIR --name work [-o OUT] -q -- BIN`, which must
/// exit `code`; its stderr.
fn bench_to(dir: &Path, out: Option<&Path>, bin: &Path, code: i32) -> String {
    let mut args = vec![os("bench"), os("--dir"), os(dir), os("--name"), os("work")];
    if let Some(out) = out {
        args.extend([os("-o"), os(out)]);
    }
    args.extend([os("-q"), os("--"), os(bin)]);
    let (got, _, stderr) = memtrail(&args.iter().collect::<Vec<_>>());
    assert_eq!(got, code, "{args:?}: {stderr}");
    stderr
}

/// Check that two results documents written with `-o` always compare
/// fully (issue 41: `bench -o A.json` then `bench -o B.json` into the same
/// results directory, and `compare A.json B.json` named no function: "a
/// later bench replaced it"): each keeps its profiles beside it
/// (`A.profiles/work/run-1.json`, its `profile_dir`), compare names
/// `extra_allocs` with exactly +100 allocations, also once both pairs are
/// moved elsewhere; an existing `A.profiles/` is not replaced without
/// `--force` (exit 73 before anything runs).
#[test]
fn bench_compare_two_outputs_compare_fully() {
    let s = setup();
    let dir = tempfile::tempdir().unwrap();
    let results_dir = dir.path().join("results");
    let (a, b) = (dir.path().join("a.json"), dir.path().join("b.json"));
    bench_to(&results_dir, Some(&a), &s.base_bin, 0);
    bench_to(&results_dir, Some(&b), &s.extra_bin, 0);
    let kept = dir.path().join("a.profiles");
    assert!(kept.join("work/run-1.json").is_file());
    let doc: Value = serde_json::from_slice(&fs::read(&a).unwrap()).unwrap();
    assert_eq!(doc["profile_dir"], kept.to_string_lossy().as_ref());
    let want = "+100 allocations (+6,400 B) at extra_allocs (";
    let args = [os("compare"), os(&a), os(&b)];
    let (code, stdout, stderr) = memtrail(&args.iter().collect::<Vec<_>>());
    assert_eq!(code, 1, "{stderr}");
    assert!(stdout.contains(want), "{stdout}");
    assert!(!stdout.contains("SHA-256"), "{stdout}");
    // Moved together, elsewhere: found beside the document.
    let moved = dir.path().join("moved");
    fs::create_dir(&moved).unwrap();
    for name in ["a.json", "a.profiles", "b.json", "b.profiles"] {
        fs::rename(dir.path().join(name), moved.join(name)).unwrap();
    }
    let args = [
        os("compare"),
        os(moved.join("a.json")),
        os(moved.join("b.json")),
    ];
    let (code, stdout, stderr) = memtrail(&args.iter().collect::<Vec<_>>());
    assert_eq!(code, 1, "{stderr}");
    assert!(stdout.contains(want), "{stdout}");
    // Another document's profiles are not replaced without --force.
    fs::create_dir(dir.path().join("a.profiles")).unwrap();
    let stderr = bench_to(&results_dir, Some(&a), &s.base_bin, 73);
    assert!(
        stderr.contains("will not replace (without --force) the profiles directory"),
        "{stderr}"
    );
    assert!(!a.exists());
}

/// Check that a copy of a results directory's document does not silently
/// share a profile with a later bench (issue 26): each results document
/// keeps its profiles' SHA-256, and compare, finding the copy's profile
/// replaced by the second bench, says so instead of diffing the newer
/// profile with itself; the metrics comparison still stands (exit 1).
#[test]
fn bench_compare_replaced_profile_is_reported() {
    let s = setup();
    let dir = tempfile::tempdir().unwrap();
    let results_dir = dir.path().join("results");
    let (a, b) = (dir.path().join("a.json"), dir.path().join("b.json"));
    bench_to(&results_dir, None, &s.base_bin, 0);
    fs::copy(results_dir.join("new/results.json"), &a).unwrap();
    bench_to(&results_dir, None, &s.extra_bin, 0);
    fs::copy(results_dir.join("new/results.json"), &b).unwrap();
    let args = [os("compare"), os(&a), os(&b), os("--format"), os("json")];
    let (code, stdout, stderr) = memtrail(&args.iter().collect::<Vec<_>>());
    assert_eq!(code, 1, "{stderr}");
    let doc: Value = serde_json::from_str(&stdout).unwrap();
    let work = &doc["benchmarks"][0];
    assert_eq!(work["status"], "regressed");
    assert_eq!(work["sites"], serde_json::json!([]), "{work:#}");
    let note = work["sites_note"].as_str().expect("a note on the sites");
    assert!(
        note.contains("is not the profile")
            && note.contains(&*a.to_string_lossy())
            && note.contains("SHA-256 differs"),
        "{note}"
    );
    let doc: Value = serde_json::from_slice(&fs::read(&b).unwrap()).unwrap();
    let sha = doc["benchmarks"][0]["sha256"]["work/run-1.json"]
        .as_str()
        .expect("the profile's SHA-256");
    assert_eq!(sha.len(), 64, "{sha}");
    // b.json's own profile is the one it was made with.
    let args = [os("compare"), results("base"), os(&b)];
    let (code, stdout, stderr) = memtrail(&args.iter().collect::<Vec<_>>());
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stdout.contains("+100 allocations (+6,400 B) at extra_allocs ("),
        "{stdout}"
    );
}

/// Check that compare and bench never write over a file they read (issue
/// 28): `compare A B -o B` (and `-o A`, through a symlink too) and `bench
/// --from R -o R` exit 73 and leave it as it was.
#[test]
fn bench_compare_output_is_input_exits_73() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.json"), dir.path().join("b.json"));
    fs::copy(results("base"), &a).unwrap();
    fs::copy(results("extra"), &b).unwrap();
    let link = dir.path().join("link.json");
    std::os::unix::fs::symlink(&b, &link).unwrap();
    let before = (fs::read(&a).unwrap(), fs::read(&b).unwrap());
    let cases: Vec<Vec<OsString>> = vec![
        vec![os("compare"), os(&a), os(&b), os("-o"), os(&b)],
        vec![os("compare"), os(&a), os(&b), os("-o"), os(&a)],
        vec![os("compare"), os(&a), os(&b), os("-o"), os(&link)],
        vec![os("bench"), os("--from"), os(&b), os("-o"), os(&b)],
        vec![os("bench"), os("--from"), os(&link), os("-o"), os(&b)],
    ];
    for args in cases {
        let (code, stdout, stderr) = memtrail(&args.iter().collect::<Vec<_>>());
        assert_eq!(code, 73, "{args:?}: {stdout}{stderr}");
        assert!(
            stderr.contains("being read") && stderr.contains("never writes over an input"),
            "{args:?}: {stderr}"
        );
        assert_eq!(
            (fs::read(&a).unwrap(), fs::read(&b).unwrap()),
            before,
            "{args:?}"
        );
    }
    assert_eq!(
        support::dir_entries(dir.path()),
        ["a.json", "b.json", "link.json"]
    );
}

/// Runs `memtrail ARGS` with a bound of 60 s (on failure, not a timing
/// assumption: memtrail must not block or read without end).
fn memtrail_bounded(args: &[OsString]) -> (i32, String) {
    let mut child = Command::new(support::memtrail_bin())
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn memtrail");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while child.try_wait().expect("try_wait").is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{args:?}: memtrail still runs after 60 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let out = child.wait_with_output().expect("wait");
    (
        out.status.code().expect("exited"),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Check that compare and `bench --from` read only regular files of at
/// most 1 GiB, as `report` does (issue 28: `compare /dev/zero R` grew to
/// 9.9 GB, `compare FIFO R` and `bench --from FIFO` hung): a FIFO, a
/// device and a larger (sparse) file are bad input, exit 2, at once.
#[test]
fn bench_compare_special_inputs_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0, "mkfifo");
    let big = dir.path().join("big.json");
    fs::File::create(&big)
        .and_then(|f| f.set_len((2 << 30) + 1))
        .expect("a sparse file");
    for (input, why) in [
        (fifo.as_path(), "not a regular file (a FIFO)"),
        (
            Path::new("/dev/zero"),
            "not a regular file (a character device)",
        ),
        (big.as_path(), "larger than the 1 GiB"),
    ] {
        for args in [
            vec![os("compare"), os(input), results("base")],
            vec![os("compare"), results("base"), os(input)],
            vec![os("bench"), os("--from"), os(input)],
        ] {
            let (code, stderr) = memtrail_bounded(&args);
            assert_eq!(code, 2, "{args:?}: {stderr}");
            assert!(
                stderr.contains(&format!("{}: {why}", input.display())),
                "{args:?}: {stderr}"
            );
        }
    }
}
