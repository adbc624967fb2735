//! The files of `examples/`, built and run as a reader would (issue 42):
//! the C ABI's clients compiled against `include/memtrail.h` and linked to
//! `libmemtrail.so`, the Rust library's examples (cargo builds them with
//! the tests), the region markers under `memtrail run`, and the CI
//! example's suite under the workflow's own `bench` and `compare` commands.
//! Each checks the exact counts the example's opening comment promises.
//! `examples/regions.py` is run by `tests/ffi/ffi_python.rs`; every file of
//! `examples/` must be run by one of the two (`examples_all_run`). The
//! `memtrail` commands the README and docs show are checked against each
//! subcommand's `--help` (`examples_docs_commands_use_real_flags`).

mod support;

use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;
use support::{num, string};

/// The repository's root.
fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// target/<profile>, where cargo puts `libmemtrail.so` and `examples/`
/// (this test is target/<profile>/deps/examples-HASH).
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable");
    exe.parent()
        .and_then(Path::parent)
        .expect("target dir")
        .to_owned()
}

/// Builds `examples/<name>.c` against the C header and the cdylib, as its
/// opening comment says (plus the suite's warnings as errors).
fn build_c(name: &str) -> PathBuf {
    let lib_dir = target_dir();
    assert!(
        lib_dir.join("libmemtrail.so").exists(),
        "no libmemtrail.so in {}: run `cargo build --lib` first (scripts/test.sh does)",
        lib_dir.display()
    );
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("example-{name}"));
    let status = Command::new("cc")
        .args(["-std=c11", "-O2", "-g", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(root().join("include"))
        .arg(root().join(format!("examples/{name}.c")))
        .arg("-o")
        .arg(&out)
        .arg("-L")
        .arg(&lib_dir)
        .arg(format!("-Wl,-rpath,{}", lib_dir.display()))
        .arg("-lmemtrail")
        .status()
        .expect("run cc");
    assert!(status.success(), "compiling examples/{name}.c failed");
    out
}

/// The Rust example `name` cargo built (`cargo test` builds every example;
/// `cargo build --examples` when running this binary alone).
fn rust_example(name: &str) -> PathBuf {
    let exe = target_dir().join("examples").join(name);
    assert!(
        exe.exists(),
        "no {}: run `cargo build --examples` first (scripts/test.sh does)",
        exe.display()
    );
    exe
}

/// Runs `exe ARGS` and returns its output; panics unless it exited 0.
fn run_ok(exe: &Path, args: &[OsString]) -> Output {
    let out = Command::new(exe).args(args).output().expect("run example");
    assert!(
        out.status.success(),
        "{} {args:?}: {:?}\n{}\n{}",
        exe.display(),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Check that the C region example, tracking itself, prints exactly its
/// region's 3 allocations, 1 free, their bytes, peak and live blocks.
#[test]
fn examples_c_region_exact() {
    let out = run_ok(&build_c("region"), &[]);
    assert_eq!(
        stdout(&out),
        "allocations=3 frees=1 allocated_bytes=600 freed_bytes=200 peak_live_bytes=600 \
         live_allocations=2 live_bytes=400\n"
    );
}

/// Check that the Rust region example finds `parse` allocation-free and
/// `collect` exactly one block of 1000 bytes, live at the region's end.
#[test]
fn examples_rust_region_exact() {
    let out = run_ok(&rust_example("region"), &[]);
    assert_eq!(
        stdout(&out),
        "allocations=1 frees=0 allocated_bytes=1000 live_allocations=1 live_bytes=1000\n"
    );
}

/// Check that the C spawn example writes the profile of a command that
/// allocates 900,001 bytes once (exactly one allocation and its free, in
/// one process) and prints its exit code and its one site's report.
#[test]
fn examples_c_spawn_report_exact() {
    let once = support::fixture("malloc_once");
    let dir = tempfile::tempdir().expect("temp dir");
    let profile = dir.path().join("p.json");
    let out = run_ok(
        &build_c("spawn_report"),
        &[profile.clone().into(), once.clone().into()],
    );
    let text = stdout(&out);
    let mut lines = text.lines();
    assert_eq!(
        lines.next(),
        Some(format!("{} exited with code 0", once.display()).as_str()),
        "{text}"
    );
    let exe = once.file_name().expect("file name").to_string_lossy();
    assert!(
        text.contains("#1  878.9 KiB live at peak (100.0%), 878.9 KiB allocated, 1 allocation"),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("    main ") && l.ends_with(&format!(" in {exe}"))),
        "{text}"
    );
    let doc = support::read_profile(&profile).expect("the example wrote its profile");
    assert_eq!(support::processes(&doc).len(), 1);
    let totals = &doc["totals"];
    assert_eq!(
        [
            num(totals, "allocations"),
            num(totals, "frees"),
            num(totals, "allocated_bytes"),
            num(totals, "peak_live_bytes"),
        ],
        [1, 1, 900_001, 900_001],
        "{totals}"
    );
}

/// Runs `memtrail run -- EXE` and returns its profile's regions as
/// (name, [entries, exits, allocations, frees, allocated, freed, peak,
/// live blocks, live bytes]).
fn regions_of(exe: &Path) -> Vec<(String, [u64; 9])> {
    let run = support::capture(&[exe.into()]);
    run.expect_code(0);
    run.profile()["regions"]
        .as_array()
        .expect("regions is an array")
        .iter()
        .map(|r| {
            let counts = [
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
            .map(|k| num(r, k));
            (string(r, "name").to_owned(), counts)
        })
        .collect()
}

/// What both marker examples promise: "load" 2 allocations of 3,000 bytes,
/// 1 free of 2,000, 1,000 bytes live at its end; "lookup" 4 entries of a
/// 64-byte block allocated and freed.
fn markers_expected() -> Vec<(String, [u64; 9])> {
    vec![
        ("load".into(), [1, 1, 2, 1, 3000, 2000, 3000, 1, 1000]),
        ("lookup".into(), [4, 4, 4, 4, 256, 256, 64, 0, 0]),
    ]
}

/// Check that the C marker example's regions count exactly under
/// `memtrail run`.
#[test]
fn examples_c_markers_exact() {
    let exe = Path::new(env!("CARGO_TARGET_TMPDIR")).join("example-markers");
    let status = Command::new("cc")
        .args(["-std=c11", "-O2", "-g", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(root().join("include"))
        .arg(root().join("examples/markers.c"))
        .arg("-o")
        .arg(&exe)
        .status()
        .expect("run cc");
    assert!(status.success(), "compiling examples/markers.c failed");
    assert_eq!(regions_of(&exe), markers_expected());
}

/// Check that the Rust marker example (the crate's macros) counts the same
/// regions exactly under `memtrail run`.
#[test]
fn examples_rust_markers_exact() {
    assert_eq!(regions_of(&rust_example("markers")), markers_expected());
}

/// Runs `memtrail ARGS` in `cwd`; returns its exit code and stderr.
fn memtrail_in(cwd: &Path, args: &[&str]) -> (i32, String) {
    let child = Command::new(support::memtrail_bin())
        .current_dir(cwd)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn memtrail");
    let watchdog = support::Watchdog::new(child.id());
    let out = child.wait_with_output().expect("wait for memtrail");
    watchdog.disarm();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out.status.code().unwrap_or(-1), stderr)
}

/// A project laid out as `examples/ci/memory-regressions.yml` expects, in
/// `dir`: `examples/ci/` copied, `build/parse` built as the workflow does.
fn ci_project(dir: &Path) {
    let ci = root().join("examples/ci");
    let to = dir.join("examples/ci");
    fs::create_dir_all(to.join("testdata")).expect("create examples/ci");
    for file in [
        "memtrail.toml",
        "parse.c",
        "testdata/small.json",
        "testdata/large.json",
    ] {
        fs::copy(ci.join(file), to.join(file)).expect("copy the CI example");
    }
    fs::create_dir_all(dir.join("build")).expect("create build/");
    let status = Command::new("cc")
        .current_dir(dir)
        .args(["-O2", "-o", "build/parse", "examples/ci/parse.c"])
        .status()
        .expect("run cc");
    assert!(status.success(), "compiling examples/ci/parse.c failed");
}

/// Check that the CI example's suite runs under the workflow's commands: a
/// baseline, the change benchmarked (bench's github-action-benchmark
/// output too) and compared at the workflow's thresholds (exit 0: the
/// same program), with parse's exact counts: 1 allocation for the file and
/// 1 of 32 bytes per number.
#[test]
fn examples_ci_workflow_bench_compare() {
    let dir = tempfile::tempdir().expect("temp dir");
    let project = dir.path();
    ci_project(project);
    let suite = "examples/ci/memtrail.toml";
    let (code, stderr) = memtrail_in(
        project,
        &["bench", "--suite", suite, "--save-baseline", "main", "-q"],
    );
    assert_eq!(code, 0, "{stderr}");
    let (code, stderr) = memtrail_in(
        project,
        &[
            "bench",
            "--suite",
            suite,
            "--save-baseline",
            "pr",
            "-q",
            "--format",
            "gab",
            "--output",
            "memtrail-gab.json",
        ],
    );
    assert_eq!(code, 0, "{stderr}");
    let (main, pr) = (
        "target/memtrail/main/results.json",
        "target/memtrail/pr/results.json",
    );
    let limits = "peak=0.5%,allocations=0";
    let (code, stderr) = memtrail_in(
        project,
        &[
            "compare",
            main,
            pr,
            "--threshold",
            limits,
            "--format",
            "markdown",
            "--output",
            "comment.md",
        ],
    );
    assert_eq!(code, 0, "{stderr}");
    assert!(project.join("comment.md").exists() && project.join("memtrail-gab.json").exists());

    let results: Value =
        serde_json::from_slice(&fs::read(project.join(pr)).expect("read results")).expect("JSON");
    let metrics: Vec<(String, u64, u64, u64)> = results["benchmarks"]
        .as_array()
        .expect("benchmarks")
        .iter()
        .map(|b| {
            let m = &b["metrics"];
            (
                string(b, "name").to_owned(),
                num(&m["allocations"], "value"),
                num(&m["allocated_bytes"], "value"),
                num(&m["peak_live_bytes"], "value"),
            )
        })
        .collect();
    // small.json: 10 bytes (+1 for the NUL), 3 numbers; large.json: 391
    // bytes, 100 numbers.
    assert_eq!(
        metrics,
        [
            ("parse-small".to_owned(), 4, 11 + 3 * 32, 11 + 3 * 32),
            (
                "parse-large".to_owned(),
                101,
                392 + 100 * 32,
                392 + 100 * 32
            ),
        ]
    );
}

/// Every file of `examples/` and the test that runs it.
const EXAMPLES: &[(&str, &str)] = &[
    ("region.c", "tests/examples.rs"),
    ("region.rs", "tests/examples.rs"),
    ("spawn_report.c", "tests/examples.rs"),
    ("markers.c", "tests/examples.rs"),
    ("markers.rs", "tests/examples.rs"),
    ("regions.py", "tests/ffi/ffi_python.rs"),
    ("ci/memory-regressions.yml", "tests/examples.rs"),
    ("ci/memtrail.toml", "tests/examples.rs"),
    ("ci/parse.c", "tests/examples.rs"),
    ("ci/testdata/small.json", "tests/examples.rs"),
    ("ci/testdata/large.json", "tests/examples.rs"),
];

/// The files under `dir`, relative to `base`, sorted.
fn files_under(base: &Path, dir: &Path, out: &mut Vec<String>) {
    for entry in fs::read_dir(dir).expect("read examples/") {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            files_under(base, &path, out);
        } else {
            let rel = path.strip_prefix(base).expect("under examples/");
            out.push(rel.to_string_lossy().into_owned());
        }
    }
    out.sort();
}

/// Check that every file of `examples/` is one a test runs: listed in
/// [`EXAMPLES`] (a new example needs a test before it lands), and those
/// another test binary runs named by its source.
#[test]
fn examples_all_run() {
    let base = root().join("examples");
    let mut found = Vec::new();
    files_under(&base, &base, &mut found);
    let mut listed: Vec<String> = EXAMPLES.iter().map(|(f, _)| (*f).to_owned()).collect();
    listed.sort();
    assert_eq!(
        found, listed,
        "examples/ and the examples the tests run differ"
    );
    for (file, test) in EXAMPLES.iter().filter(|(_, t)| *t != "tests/examples.rs") {
        let source = fs::read_to_string(root().join(test)).expect("read the test");
        assert!(
            source.contains(&format!("examples/{file}")),
            "{test} does not run examples/{file}"
        );
    }
}

/// A subcommand's flags from its `--help`: long name (and short, when it
/// has one) to whether it takes a value.
fn flags_of(sub: &str) -> std::collections::HashMap<String, bool> {
    let out = Command::new(support::memtrail_bin())
        .args([sub, "--help"])
        .output()
        .expect("run memtrail --help");
    assert!(out.status.success(), "memtrail {sub} --help");
    let line = regex::Regex::new(r"^(?:  (-[A-Za-z]), |      )(--[a-z][a-z-]*)( <[^>]+>)?$")
        .expect("regex");
    let mut flags = std::collections::HashMap::new();
    for l in String::from_utf8_lossy(&out.stdout).lines() {
        if let Some(c) = line.captures(l) {
            let value = c.get(3).is_some();
            flags.insert(c[2].to_owned(), value);
            if let Some(short) = c.get(1) {
                flags.insert(short.as_str().to_owned(), value);
            }
        }
    }
    flags
}

/// The code a Markdown file shows: its fenced blocks' lines and its
/// paragraphs' inline code spans (a span may wrap), with lines ending in
/// `\` joined to the next.
fn code_of(markdown: &str) -> Vec<String> {
    // The inline code spans of a paragraph: every other piece between
    // backticks.
    fn spans(prose: &mut String) -> Vec<String> {
        let text = std::mem::take(prose);
        text.split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_owned)
            .collect()
    }
    let (mut code, mut prose, mut block, mut fenced) =
        (Vec::new(), String::new(), String::new(), false);
    for l in markdown.lines() {
        if l.trim_start().starts_with("```") {
            fenced = !fenced;
            code.extend(spans(&mut prose));
        } else if fenced {
            block.push_str(l.trim_end_matches('\\'));
            block.push(' ');
            if !l.ends_with('\\') {
                code.push(std::mem::take(&mut block));
            }
        } else if l.trim().is_empty() {
            code.extend(spans(&mut prose));
        } else {
            prose.push_str(l);
            prose.push(' ');
        }
    }
    code.extend(spans(&mut prose));
    code
}

/// Each subcommand's flags (see [`flags_of`]).
type Flags = std::collections::HashMap<&'static str, std::collections::HashMap<String, bool>>;

/// The flags a shown `memtrail SUB ...` command uses that SUB does not
/// have: its words up to the end of memtrail's own (`--`, or for `run` the
/// command's first word), each flag's value skipped.
fn unknown_flags(code: &str, flags: &Flags) -> Vec<String> {
    let start =
        regex::Regex::new(r"memtrail (run|attach|report|events|bench|compare)\b").expect("regex");
    let mut unknown = Vec::new();
    for m in start.captures_iter(code) {
        let sub = m.get(1).expect("subcommand").as_str();
        let known = &flags[sub];
        let rest = &code[m.get(0).expect("match").end()..];
        if rest.starts_with(':') {
            continue; // its output's first line, not a command
        }
        // `--pid/--exe`: two flags.
        let mut words = rest
            .split(" #")
            .next()
            .unwrap_or("")
            .split_whitespace()
            .flat_map(|w| w.split("/--").enumerate())
            .map(|(i, w)| {
                if i == 0 {
                    w.to_owned()
                } else {
                    format!("--{w}")
                }
            });
        while let Some(word) = words.next() {
            let w = word
                .trim_start_matches('[')
                .trim_end_matches([']', ',', ';', ')', '.']);
            let name = w.split('=').next().unwrap_or(w);
            if name == "--" || name == "memtrail" {
                break;
            }
            if name.starts_with('-') && name.len() > 1 {
                match known.get(name) {
                    Some(true) if !w.contains('=') => {
                        words.next();
                    }
                    Some(_) => {}
                    None => unknown.push(format!("memtrail {sub} {name}")),
                }
            } else if sub == "run" && !word.starts_with('[') && !name.is_empty() {
                break; // the command's first word: the rest is its own
            }
        }
    }
    unknown
}

/// Check that every `memtrail SUB` command the README, the docs,
/// CONTRIBUTING.md, perf/README.md and the CI workflow show uses only
/// flags SUB has (a renamed or removed flag fails here, not in a reader's
/// shell).
#[test]
fn examples_docs_commands_use_real_flags() {
    let subs = ["run", "attach", "report", "events", "bench", "compare"];
    let flags: Flags = subs.iter().map(|s| (*s, flags_of(s))).collect();
    assert!(
        flags.values().all(|f| f.contains_key("--help")),
        "{flags:?}"
    );
    let mut files: Vec<PathBuf> = ["README.md", "CONTRIBUTING.md", "perf/README.md"]
        .iter()
        .map(|f| root().join(f))
        .collect();
    let docs = fs::read_dir(root().join("docs")).expect("read docs/");
    files.extend(docs.map(|e| e.expect("docs entry").path()));
    let mut unknown = Vec::new();
    let mut shown = 0;
    for file in &files {
        let text = fs::read_to_string(file).expect("read a doc");
        for code in code_of(&text) {
            shown += usize::from(code.contains("memtrail "));
            for u in unknown_flags(&code, &flags) {
                unknown.push(format!("{}: {u}", file.display()));
            }
        }
    }
    let workflow = fs::read_to_string(root().join("examples/ci/memory-regressions.yml"))
        .expect("read the workflow");
    for line in workflow.replace("\\\n", " ").lines() {
        for u in unknown_flags(line, &flags) {
            unknown.push(format!("examples/ci/memory-regressions.yml: {u}"));
        }
    }
    assert!(shown > 50, "only {shown} commands found in the docs");
    assert!(
        unknown.is_empty(),
        "flags no such subcommand has:\n{}",
        unknown.join("\n")
    );
}

/// Check that perf/README.md's table has a row for every script and bench
/// of `perf/` (`lib.sh` is the scripts' helpers), so that a new one says
/// which question it answers.
#[test]
fn examples_perf_readme_lists_every_script() {
    let table = fs::read_to_string(root().join("perf/README.md")).expect("read perf/README.md");
    let mut missing = Vec::new();
    for entry in fs::read_dir(root().join("perf")).expect("read perf/") {
        let name = entry.expect("perf entry").file_name();
        let name = name.to_string_lossy();
        let measures = name.ends_with(".sh") || name.ends_with(".rs");
        if measures && name != "lib.sh" && !table.contains(&format!("\n| `{name}` |")) {
            missing.push(name.into_owned());
        }
    }
    missing.sort();
    assert!(
        missing.is_empty(),
        "not in perf/README.md's table: {missing:?}"
    );
}
