//! What the summary on stderr says (issue 16, "The CLI").

use std::ffi::OsString;

use crate::support::{self, cmd, memtrail};

/// `memtrail run -o DIR/p.json -- CMD`; returns the exit code and stderr.
fn summary_of(command: Vec<OsString>) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut args: Vec<OsString> = vec!["run".into(), "-o".into()];
    args.push(dir.path().join("p.json").into());
    args.push("--".into());
    args.extend(command);
    let (_, status, _, stderr) = memtrail(&args, b"");
    (status.code(), stderr)
}

/// Check that the note on probe sites that single-step names only the
/// sites the command went through, with their hits: none for a program
/// that allocates, and for one that calls every libc allocator entry point
/// (none of libc's entries single-steps, issue 22) only posix_memalign's
/// return, hit once (glibc's stores its result through the pointer after
/// its last branch: its `ret` is the return site, issue 40); and
/// `mi_malloc (probe_hits) 3 hits` for one that calls an entry point of
/// its own whose probe single-steps 3 times (issue 16: "5 probe sites
/// single-step" on every run).
#[test]
fn cli_summary_slow_probe_note_only_for_sites_hit() {
    for fixture in ["touch_marker", "apis"] {
        let (code, stderr) = summary_of(cmd(fixture, &["/dev/null".as_ref()]));
        assert_eq!(code, Some(0), "{stderr}");
        assert!(stderr.contains("memtrail: "), "no summary: {stderr}");
        let notes: Vec<&str> = stderr
            .lines()
            .filter(|l| l.contains("single-step"))
            .collect();
        if fixture == "apis" && !support::preload() {
            assert_eq!(notes.len(), 1, "{stderr}");
            assert!(
                notes[0].contains("were hit: posix_memalign return +0x")
                    && notes[0].ends_with(" 1 hit"),
                "{stderr}"
            );
        } else {
            assert!(notes.is_empty(), "{fixture}: {stderr}");
        }
    }

    let (code, stderr) = summary_of(cmd("probe_hits", &[]));
    assert_eq!(code, Some(0), "{stderr}");
    let note = stderr
        .lines()
        .find(|l| l.contains("single-step"))
        .unwrap_or_else(|| panic!("no note: {stderr}"));
    assert!(note.ends_with(" 3 hits"), "{note}");
    assert!(note.contains("were hit: mi_malloc (probe_hits"), "{note}");
}

/// The probe entry of `symbol` in libc, from a profile's `probes`.
fn libc_probe<'a>(profile: &'a serde_json::Value, symbol: &str) -> &'a serde_json::Value {
    let libc = memtrail::internals::attach::libc_path().expect("libc");
    let libc = std::fs::canonicalize(libc).expect("libc path");
    support::field(profile, "probes")
        .as_array()
        .expect("probes")
        .iter()
        .find(|p| {
            p["symbol"] == symbol
                && std::fs::canonicalize(p["image"].as_str().unwrap_or_default()).ok()
                    == Some(libc.clone())
        })
        .unwrap_or_else(|| panic!("no probe of libc's {symbol}"))
}

/// `memtrail run -o DIR/p.json -- FIXTURE`, which must exit 0; returns its
/// stderr and profile.
fn run_ok(fixture: &str) -> (String, serde_json::Value) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("p.json");
    let args: Vec<OsString> = [
        vec!["run".into(), "-o".into(), path.clone().into_os_string()],
        vec!["--".into()],
        cmd(fixture, &[]),
    ]
    .concat();
    let (_, status, _, stderr) = memtrail(&args, b"");
    assert_eq!(status.code(), Some(0), "{stderr}");
    (stderr, support::read_profile(&path).expect("profile"))
}

/// Check that each probe site's hits are counted exactly in BPF, calls
/// nested in another allocator call and through a function pointer and in
/// a forked child included: the fixture calls reallocarray 5 times, 3
/// through a pointer and 2 in its child (10 hits), realloc 4 times, and
/// each reallocarray calls realloc inside libc (14 hits), and realloc(NULL)
/// calls malloc (14 hits); reallocarray's probe no longer single-steps
/// (issue 22: it sits on the `jo` after the multiply); the summary names
/// the single-stepping site hit, the fixture's own mi_malloc (3 calls),
/// with its exact count and no site that was not hit (issue 16: the note's
/// calls were derived from per-API counts, nested calls missed).
#[test]
fn cli_summary_probe_hits_exact() {
    let (stderr, profile) = run_ok("probe_hits");
    let hits = |symbol: &str| libc_probe(&profile, symbol)["hits"].as_u64();
    assert_eq!(hits("reallocarray"), Some(10), "{stderr}");
    assert_eq!(hits("realloc"), Some(14), "{stderr}");
    // 14, and 3 through mi_malloc's memalign(16, n), which calls malloc.
    assert_eq!(hits("malloc"), Some(17), "{stderr}");
    assert_eq!(hits("memalign"), Some(3), "{stderr}");
    assert_eq!(hits("free"), Some(17), "{stderr}");
    assert_eq!(hits("calloc"), Some(0), "{stderr}");
    assert_eq!(hits("valloc"), Some(0), "{stderr}");
    assert_eq!(libc_probe(&profile, "reallocarray")["emulated"], true);
    let note = stderr
        .lines()
        .find(|l| l.contains("single-step"))
        .unwrap_or_else(|| panic!("no note: {stderr}"));
    assert!(note.contains("were hit: mi_malloc (probe_hits"), "{note}");
    assert!(note.ends_with(" 3 hits"), "{note}");
    // A C program's capture links no probe in libstdc++, which it never
    // maps (system-wide, images other than libc are linked when first
    // mapped).
    let images: Vec<&str> = support::field(&profile, "probes")
        .as_array()
        .expect("probes")
        .iter()
        .filter_map(|p| p["image"].as_str())
        .collect();
    assert!(
        images.iter().all(|i| !i.contains("libstdc++")),
        "{images:?}"
    );
}

/// Check that libstdc++'s `operator new`, which only calls malloc, gets no
/// probe when stacks are walked from unwind tables (the default; issue 22:
/// malloc's walk starts at new's caller), and that with `--unwind fp` it is
/// probed once a process of the tree maps it (linked when the C++ fixture's
/// loader maps it, from what was examined up front), in the profile's
/// probes with its hits, every site emulated (issue 22: the nothrow
/// operator new single-stepped), so the note never fires.
#[test]
fn cli_summary_cxx_runtime_probed_when_mapped() {
    let libstdcxx = |profile: &serde_json::Value| -> Vec<serde_json::Value> {
        support::field(profile, "probes")
            .as_array()
            .expect("probes")
            .iter()
            .filter(|p| p["image"].as_str().is_some_and(|i| i.contains("libstdc++")))
            .cloned()
            .collect()
    };
    let (_, profile) = run_ok("cxx");
    assert_eq!(libstdcxx(&profile), Vec::<serde_json::Value>::new());

    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("p.json");
    let args: Vec<OsString> = [
        vec!["run".into(), "--unwind".into(), "fp".into(), "-o".into()],
        vec![path.clone().into_os_string(), "--".into()],
        cmd("cxx", &[]),
    ]
    .concat();
    let (_, status, _, stderr) = memtrail(&args, b"");
    assert_eq!(status.code(), Some(0), "{stderr}");
    let cxx = libstdcxx(&support::read_profile(&path).expect("profile"));
    assert!(
        cxx.iter().any(|p| p["hits"].as_u64() > Some(0)),
        "libstdc++'s probes: {cxx:?}"
    );
    assert!(
        cxx.iter().all(|p| p["emulated"] == true),
        "single-stepping sites: {cxx:?}"
    );
    assert!(!stderr.contains("single-step"), "{stderr}");
}

/// Check that the summary gives one line per executable, largest first,
/// with its number of processes, while the profile keeps every process
/// (issue 16: through a shell wrapper the summary listed 40 processes).
#[test]
fn cli_summary_processes_grouped_by_executable() {
    let dir = tempfile::tempdir().expect("tempdir");
    let profile_path = dir.path().join("p.json");
    let once = support::fixture("malloc_once");
    let script = format!(
        "for i in 1 2 3 4 5; do /bin/true; done; {0}; {0}",
        once.display()
    );
    let args: Vec<OsString> = vec![
        "run".into(),
        "-o".into(),
        profile_path.clone().into(),
        "/bin/sh".into(),
        "-c".into(),
        script.into(),
    ];
    let (_, status, _, stderr) = memtrail(&args, b"");
    assert_eq!(status.code(), Some(0), "{stderr}");
    let profile = support::read_profile(&profile_path).expect("profile");
    // sh, 5 forks that exec /bin/true, 2 that exec malloc_once.
    assert_eq!(support::processes(&profile).len(), 8, "{stderr}");
    let table: Vec<Vec<&str>> = stderr
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("processes"))
        .skip(1)
        .take_while(|l| !l.contains("note:") && !l.starts_with("memtrail:"))
        .map(|l| l.split_whitespace().collect())
        .collect();
    let once = once.to_str().expect("UTF-8");
    // Largest first: malloc_once's 879 KiB peak, then sh, then /bin/true.
    let rows: Vec<(&str, &str)> = table.iter().map(|r| (r[0], r[r.len() - 1])).collect();
    assert_eq!(
        rows,
        [("2", once), ("1", "/bin/sh"), ("5", "/bin/true")],
        "{stderr}"
    );
    // The peak of one process (900001 bytes), not of the two together.
    assert_eq!(&table[0][3..5], ["878.9", "KiB"], "{stderr}");
}

/// `memtrail ARGS`, which must exit `code`; its stdout.
fn stdout_of(args: &[OsString], code: i32) -> String {
    let (_, status, stdout, stderr) = memtrail(args, b"");
    assert_eq!(status.code(), Some(code), "{args:?}: {stderr}");
    String::from_utf8(stdout).expect("UTF-8")
}

/// Check that "leaked" means one thing in the summary, the report and
/// compare (issue 41: the summary said "leaked 5 ... of which 4 still
/// reachable", the report "leaked 1 block"): a C++ program that leaks two
/// blocks (200,017 and 200,029 bytes) and holds libstdc++'s emergency
/// pool (one block, still reachable) is "leaked 2 390.7 KiB" in the
/// summary, whose next line counts the pool as reachable, "leaked 2
/// blocks (390.7 KiB)" in the report's header, and 400,046 leaked bytes
/// and 2 blocks in compare's (bench's) metrics; and that the summary's
/// anon mmap line says what each number is (issue 41: "anon mmap 2
/// 300.6 MiB peak 3.1 MiB" needed reading twice).
#[test]
fn cli_summary_leaked_one_meaning() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("p.json");
    let args: Vec<OsString> = [
        vec!["run".into(), "-o".into(), path.clone().into_os_string()],
        vec!["--".into()],
        cmd("cxx", &[]),
    ]
    .concat();
    let (_, status, _, stderr) = memtrail(&args, b"");
    assert_eq!(status.code(), Some(0), "{stderr}");
    let profile = support::read_profile(&path).expect("profile");
    let totals = support::field(&profile, "totals");
    let (live, blocks) = (
        support::num(totals, "live_bytes_at_exit"),
        support::num(totals, "live_allocations_at_exit"),
    );
    assert_eq!(blocks, 3, "{totals}");
    let pool = live - 400_046;
    let kib = |b: u64| format!("{:.1} KiB", b as f64 / 1024.0);
    let want = [
        format!(
            "  leaked      {:>10}  {:>12}   (live at exit, not still reachable)",
            2,
            kib(400_046)
        ),
        format!(
            "  reachable   {:>10}  {:>12}   (still reachable at exit: runtime pools, not leaks; \
             memtrail report names them)",
            1,
            kib(pool)
        ),
    ];
    let lines: Vec<&str> = stderr.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.starts_with("  leaked "))
        .unwrap_or_else(|| panic!("no leaked line: {stderr}"));
    assert_eq!(lines[at..at + 2], want, "{stderr}");

    let report = stdout_of(&["report".into(), path.clone().into()], 0);
    let header: Vec<&str> = report.lines().take(3).collect();
    assert!(
        header[1].ends_with(", leaked 2 blocks (390.7 KiB)"),
        "{report}"
    );
    assert_eq!(
        header[2],
        format!(
            "  still reachable at exit: runtime 1 block ({0}): libstdc++ emergency exception pool \
             {0}",
            kib(pool)
        ),
        "{report}"
    );

    // bench's metrics, as compare reads them from a profile.
    let compare = stdout_of(
        &[
            "compare".into(),
            path.clone().into(),
            path.clone().into(),
            "--format".into(),
            "json".into(),
        ],
        0,
    );
    let doc: serde_json::Value = serde_json::from_str(&compare).expect("compare JSON");
    let metric = |name: &str| {
        doc["benchmarks"][0]["metrics"]
            .as_array()
            .expect("metrics")
            .iter()
            .find(|m| m["metric"] == name)
            .map(|m| support::num(m, "base"))
            .unwrap_or_else(|| panic!("no {name}: {doc}"))
    };
    assert_eq!(
        (metric("leaked_bytes"), metric("leaked_blocks")),
        (400_046, 2)
    );

    let m = support::field(&profile, "mappings");
    let (mmaps, mapped, peak, brk) = (
        support::num(m, "mmaps"),
        support::num(m, "mapped_bytes"),
        support::num(m, "peak_mapped_bytes"),
        support::num(m, "brk_peak_bytes"),
    );
    assert!(mmaps > 1, "{m}");
    let human = memtrail::internals::profile::human_bytes;
    let line = format!(
        "  anon mmap   {mmaps:>10}  {:>12}   mapped in all by {mmaps} mmaps outside allocator \
         calls, at most {} at once; program break grown at most {}",
        human(mapped),
        human(peak),
        human(brk)
    );
    assert!(stderr.lines().any(|l| l == line), "{line}\n{stderr}");
}
