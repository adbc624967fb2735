//! USDT region markers (`include/memtrail_usdt.h`) in programs run under
//! `memtrail run`: exact per-region counts in the profile, the summary and
//! the event stream (issue 13, "Markers for programs that are tracked from
//! outside").

use crate::support::{self, capture, num, string, usdt_fixture};
use serde_json::Value;

/// The profile's region named `name`.
fn region<'a>(profile: &'a Value, name: &str) -> &'a Value {
    profile["regions"]
        .as_array()
        .expect("regions is an array")
        .iter()
        .find(|r| string(r, "name") == name)
        .unwrap_or_else(|| panic!("no region {name} in {}", profile["regions"]))
}

/// (entries, exits, allocations, frees, allocated, freed, peak, live
/// blocks, live bytes) of a region.
fn metrics(r: &Value) -> [u64; 9] {
    [
        "entries",
        "exits",
        "allocations",
        "frees",
        "allocated_bytes",
        "freed_bytes",
        "peak_live_bytes",
        "live_allocations",
        "live_bytes",
    ]
    .map(|k| num(r, k))
}

/// Check that each marked region counts exactly its own thread's heap
/// events between its markers: nested regions, a region on a second thread
/// while the main thread's is open, a region entered three times, and one
/// in a dlopen'ed library; allocations outside the regions are excluded.
#[test]
fn usdt_regions_count_exactly() {
    let exe = usdt_fixture("usdt_regions", &[]);
    let lib = usdt_fixture("usdt_lib", &["-shared", "-fPIC"]);
    let run = capture(&[exe.into_os_string(), lib.into_os_string()]);
    run.expect_code(0);
    let p = run.profile();
    let names: Vec<&str> = p["regions"]
        .as_array()
        .expect("regions")
        .iter()
        .map(|r| string(r, "name"))
        .collect();
    assert_eq!(names, ["inner", "lib", "loop", "outer", "worker"]);
    assert_eq!(
        metrics(region(p, "outer")),
        [1, 1, 5, 3, 320, 210, 300, 2, 110]
    );
    assert_eq!(metrics(region(p, "inner")), [1, 1, 2, 1, 20, 10, 20, 1, 10]);
    assert_eq!(
        metrics(region(p, "worker")),
        [1, 1, 4, 4, 200, 200, 200, 0, 0]
    );
    assert_eq!(metrics(region(p, "loop")), [3, 3, 3, 3, 24, 24, 8, 0, 0]);
    assert_eq!(metrics(region(p, "lib")), [1, 1, 2, 1, 154, 77, 154, 1, 77]);
    // The allocations outside every region happened and were not counted:
    // the program's malloc(1000) is in the totals, in no region.
    assert_eq!(support::sized(run.events(), "malloc", 1000).len(), 1);

    // The summary has a line per region.
    let line = run
        .stderr
        .lines()
        .find(|l| l.split_whitespace().next() == Some("outer"))
        .unwrap_or_else(|| panic!("no outer line in the summary:\n{}", run.stderr));
    let cols: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(
        cols,
        [
            "outer", "1", "5", "3", "320", "B", "300", "B", "2", "110", "B"
        ]
    );

    // The event stream has the markers, named, in each thread's order.
    let begins: Vec<&str> = run
        .events()
        .iter()
        .filter(|e| support::kind(e) == "region_begin")
        .map(|e| string(e, "name"))
        .collect();
    assert_eq!(begins.len(), 7, "{begins:?}");
    let ends = run
        .events()
        .iter()
        .filter(|e| support::kind(e) == "region_end")
        .count();
    assert_eq!(ends, 7);
}

/// Check that every marker probe (8 in the executable, 2 in the library)
/// sits on an instruction the kernel emulates (the `nop`), so a hit costs
/// no single-step.
#[test]
fn usdt_regions_probes_are_emulated() {
    let exe = usdt_fixture("usdt_regions", &[]);
    let lib = usdt_fixture("usdt_lib", &["-shared", "-fPIC"]);
    let run = capture(&[exe.clone().into_os_string(), lib.clone().into_os_string()]);
    run.expect_code(0);
    let markers: Vec<&Value> = run.profile()["probes"]
        .as_array()
        .expect("probes")
        .iter()
        .filter(|p| string(p, "symbol").starts_with("memtrail:"))
        .collect();
    let in_image = |path: &std::path::Path| {
        markers
            .iter()
            .filter(|p| string(p, "image") == path.to_str().unwrap())
            .count()
    };
    assert_eq!((in_image(&exe), in_image(&lib)), (8, 2));
    for probe in &markers {
        assert_eq!(probe["emulated"], Value::Bool(true), "{probe}");
        let bytes = std::fs::read(string(probe, "image")).unwrap();
        assert_eq!(bytes[num(probe, "offset") as usize], 0x90, "{probe}");
    }
}

/// Check that a program without markers has an empty `regions` section.
#[test]
fn usdt_regions_none_without_markers() {
    let run = capture(&support::cmd("malloc_once", &[]));
    run.expect_code(0);
    assert_eq!(run.profile()["regions"], Value::Array(Vec::new()));
    assert!(!run.stderr.contains("region "), "{}", run.stderr);
}

/// Runs `memtrail ARGS`: exit code, stdout, stderr.
fn memtrail(args: &[&std::ffi::OsStr]) -> (i32, String, String) {
    let out = std::process::Command::new(support::MEMTRAIL)
        .args(args)
        .output()
        .expect("run memtrail");
    (
        out.status.code().expect("memtrail exited"),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Check that `memtrail bench` fills each benchmark's `regions` with the
/// region's exact metrics over every run, and that the BMF, github-action-
/// benchmark, Markdown and compare outputs show region `R` of benchmark
/// `B` as `B/R` (issue 14, per-region metrics).
#[test]
fn usdt_regions_in_bench_results() {
    let exe = usdt_fixture("usdt_regions", &[]);
    let lib = usdt_fixture("usdt_lib", &["-shared", "-fPIC"]);
    let dir = tempfile::tempdir().unwrap();
    let (code, _, stderr) = memtrail(&[
        "bench".as_ref(),
        "-q".as_ref(),
        "--runs".as_ref(),
        "2".as_ref(),
        "--name".as_ref(),
        "marked".as_ref(),
        "--dir".as_ref(),
        dir.path().as_os_str(),
        "--".as_ref(),
        exe.as_os_str(),
        lib.as_os_str(),
    ]);
    assert_eq!(code, 0, "{stderr}");
    let results_path = dir.path().join("new/results.json");
    let results: Value = serde_json::from_slice(&std::fs::read(&results_path).unwrap()).unwrap();
    let bench = &results["benchmarks"][0];
    assert_eq!(bench["deterministic"], Value::Bool(true));
    let regions = bench["regions"].as_object().expect("regions");
    let names: Vec<&String> = regions.keys().collect();
    assert_eq!(names, ["inner", "lib", "loop", "outer", "worker"]);
    let outer = &regions["outer"];
    let expect = [
        ("entries", 1),
        ("allocations", 5),
        ("frees", 3),
        ("allocated_bytes", 320),
        ("peak_live_bytes", 300),
        ("leaked_bytes", 110),
        ("leaked_blocks", 2),
    ];
    assert_eq!(outer.as_object().unwrap().len(), expect.len(), "{outer}");
    for (key, value) in expect {
        let stat = &outer[key];
        assert_eq!(
            (num(stat, "value"), num(stat, "min"), num(stat, "max")),
            (value, value, value),
            "outer {key}: {stat}"
        );
        assert_eq!(stat["runs"], serde_json::json!([value, value]), "{key}");
    }
    assert_eq!(num(&regions["loop"]["entries"], "value"), 3);
    assert_eq!(num(&regions["lib"]["allocated_bytes"], "value"), 154);

    let render = |format: &str| {
        let (code, stdout, stderr) = memtrail(&[
            "bench".as_ref(),
            "--from".as_ref(),
            results_path.as_os_str(),
            "--format".as_ref(),
            format.as_ref(),
        ]);
        assert_eq!(code, 0, "{stderr}");
        stdout
    };
    let bmf: Value = serde_json::from_str(&render("bmf")).unwrap();
    assert_eq!(bmf["marked/outer"]["allocations"]["value"], 5.0);
    assert_eq!(bmf["marked/outer"]["peak-live-bytes"]["upper_value"], 300.0);
    assert_eq!(bmf["marked/loop"]["entries"]["value"], 3.0);
    assert_eq!(
        bmf.as_object().unwrap().len(),
        6,
        "the benchmark and 5 regions"
    );
    let gab: Value = serde_json::from_str(&render("gab")).unwrap();
    let worker = gab
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "marked/worker - allocated_bytes")
        .expect("marked/worker - allocated_bytes");
    assert_eq!(
        (worker["value"].as_u64(), worker["unit"].as_str()),
        (Some(200), Some("bytes"))
    );
    let markdown = render("markdown");
    let row = markdown
        .lines()
        .find(|l| l.starts_with("| `marked/inner` |"))
        .unwrap_or_else(|| panic!("no marked/inner row:\n{markdown}"));
    assert_eq!(
        row,
        "| `marked/inner` | 2 | 1 | 20 B | 20 B | 10 B | 1 | - | - | code 0 | 2 |"
    );

    // compare: every region is a benchmark of its own, unchanged here.
    let (code, stdout, stderr) = memtrail(&[
        "compare".as_ref(),
        "--format".as_ref(),
        "json".as_ref(),
        results_path.as_os_str(),
        results_path.as_os_str(),
    ]);
    assert_eq!(code, 0, "{stderr}");
    let cmp: Value = serde_json::from_str(&stdout).unwrap();
    let compared: Vec<&str> = cmp["benchmarks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            assert_eq!(b["status"], "unchanged", "{b}");
            b["name"].as_str().unwrap()
        })
        .collect();
    assert_eq!(
        compared,
        [
            "marked",
            "marked/inner",
            "marked/lib",
            "marked/loop",
            "marked/outer",
            "marked/worker"
        ]
    );
}

/// Check that an image whose only sites are region markers stays out of
/// the image cache (which would probe it up front in every later capture,
/// whatever runs), and that its markers are found again in the next
/// capture.
#[test]
fn usdt_regions_marker_images_not_cached() {
    let exe = usdt_fixture("usdt_regions", &[]);
    let cache = tempfile::tempdir().unwrap();
    let cache_dir = cache.path().to_str().unwrap();
    for _ in 0..2 {
        let run = support::capture_env(
            &[exe.clone().into_os_string()],
            b"",
            &[("MEMTRAIL_CACHE_DIR", cache_dir)],
        );
        run.expect_code(0);
        assert_eq!(num(region(run.profile(), "outer"), "allocations"), 5);
        let text = std::fs::read_to_string(cache.path().join("images-v3.tsv")).unwrap();
        assert!(!text.contains(exe.to_str().unwrap()), "{text}");
    }
}

/// Check that the Rust markers (`include/memtrail_usdt.rs`, built with
/// rustc -O) make the same probes: region "rust" counts exactly its 3
/// allocations and 2 frees, not the vector made outside it.
#[test]
fn usdt_regions_from_rust() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("usdt_rust");
    let status =
        std::process::Command::new(std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into()))
            .args(["-O", "--edition", "2021", "-o"])
            .arg(&out)
            .arg(root.join("tests/fixtures/usdt_rust.rs"))
            .status()
            .expect("rustc runs");
    assert!(status.success(), "building tests/fixtures/usdt_rust.rs");
    let run = capture(&[out.into_os_string()]);
    run.expect_code(0);
    let p = run.profile();
    assert_eq!(
        p["regions"].as_array().map(Vec::len),
        Some(1),
        "{}",
        p["regions"]
    );
    assert_eq!(
        metrics(region(p, "rust")),
        [1, 1, 3, 2, 3000, 2000, 3000, 1, 1000]
    );
    assert_eq!(support::sized(run.events(), "malloc", 5000).len(), 1);
}
