//! Reliability under pressure, as the tracked program sees it (issue 11,
//! parts 2, 3 and 4): pauses the tree cannot observe, rings too small for
//! pausing refused and the smallest accepted ones lossless, and a finite
//! `--pressure-timeout` that bounds the whole episode.
//!
//! Every run has a private image cache (`MEMTRAIL_CACHE_DIR`), so that what
//! an earlier capture examined is known exactly. `MEMTRAIL_BIN` runs the
//! tests against another build (see `support::memtrail_bin`).
//!
//! A binary of its own, its captures one at a time (see `run`): a storm of
//! another test beside them would starve the pressure coordinator whose
//! timing they observe.

mod support;

use std::ffi::OsString;
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::{cgroup2_mount, fixture, memtrail_bin, wait_or_kill};
use tempfile::TempDir;

/// Far above any run of these tests: reaching it means memtrail hung.
const HANG: Duration = Duration::from_secs(180);

/// Largest record of the events ring with its 8-byte ring header: the exec
/// event (`struct mt_exec_event` in bpf/memtrail.h, 280 bytes), which
/// check_room counts every record of this ring at.
const EVENT_RECORD: u64 = 280 + 8;
/// Largest record of the stack ring with its ring header: `struct
/// mt_stack_record`, 16 bytes and 128 frames, plus 8.
const STACK_RECORD: u64 = 16 + 128 * 8 + 8;
/// Records one thread writes into a ring between two pressure checks
/// (`RECORDS_PER_THREAD`).
const RECORDS_PER_CPU: u64 = 2;

/// Storm rounds per thread or process.
const ROUNDS: u64 = 3000;

/// What one `memtrail run` did.
struct Run {
    pid: u32,
    code: Option<i32>,
    stdout: String,
    stderr: String,
    profile: Option<Value>,
    _dir: TempDir,
}

impl Run {
    fn profile(&self) -> &Value {
        self.profile
            .as_ref()
            .unwrap_or_else(|| panic!("no profile; stderr:\n{}", self.stderr))
    }

    fn expect_code(&self, code: i32) -> &Self {
        assert_eq!(
            self.code,
            Some(code),
            "memtrail's exit code; stdout:\n{}\nstderr:\n{}",
            self.stdout,
            self.stderr
        );
        self
    }

    fn episodes(&self) -> u64 {
        self.profile()["pressure"]["episodes"]
            .as_u64()
            .expect("pressure.episodes")
    }
}

/// Runs `memtrail run -q --output P OPTS -- CMD` with `cache` as its image
/// cache and `env` added, stdout and stderr to files (so a hang cannot
/// block on a pipe). Panics if it does not end within [`HANG`].
fn run(cache: &Path, opts: &[&str], cmd: &[OsString], env: &[(&str, &OsString)]) -> Run {
    // One capture at a time: these storms measure what a parent sees of
    // pauses, and on two CPUs eight storms at once starve the pressure
    // coordinator itself, so freezes land past the hard mark (a load
    // limit documented in perf/RESULTS.md, not what the tests are about).
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().expect("create a run directory");
    let profile = dir.path().join("profile.json");
    let (out, err) = (dir.path().join("stdout"), dir.path().join("stderr"));
    let mut child = Command::new(memtrail_bin())
        .args(["run", "-q", "--output"])
        .arg(&profile)
        .args(opts)
        .arg("--")
        .args(cmd)
        .env("MEMTRAIL_CACHE_DIR", cache)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(File::create(&out).expect("create stdout file"))
        .stderr(File::create(&err).expect("create stderr file"))
        .spawn()
        .expect("spawn memtrail");
    let pid = child.id();
    let status = wait_or_kill(&mut child, HANG);
    let stdout = fs::read_to_string(&out).expect("read stdout");
    let stderr = fs::read_to_string(&err).expect("read stderr");
    let status = status.unwrap_or_else(|| {
        panic!("memtrail hung (killed after {HANG:?}); stdout:\n{stdout}\nstderr:\n{stderr}")
    });
    Run {
        pid,
        code: status.code(),
        stdout,
        stderr,
        profile: support::read_profile(&profile),
        _dir: dir,
    }
}

/// A command line of OS strings.
fn argv(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Vec<OsString> {
    args.iter().map(|a| a.as_ref().to_os_string()).collect()
}

/// A private image cache that has seen `cmd`'s images: one capture of it.
fn warm_cache(cmd: &[OsString]) -> TempDir {
    let cache = tempfile::tempdir().expect("create a cache directory");
    run(cache.path(), &[], cmd, &[]).expect_code(0);
    cache
}

/// Allocations of exactly `size` bytes in the profile: the sum over the
/// stacks whose every allocation is `size` bytes.
fn allocations_of(p: &Value, size: u64) -> u64 {
    p["stacks"]
        .as_array()
        .expect("stacks")
        .iter()
        .filter(|s| s["allocations"].as_u64().unwrap() * size == s["bytes"].as_u64().unwrap())
        .filter(|s| s["bytes"].as_u64().unwrap() % size == 0)
        .map(|s| s["allocations"].as_u64().unwrap())
        .sum()
}

/// Asserts no ring lost a record.
fn nothing_lost(p: &Value) {
    let lost = &p["lost_events"];
    for ring in ["events", "stacks", "mappings", "attach", "tracking"] {
        assert_eq!(lost[ring], 0, "{ring} lost: {lost}");
    }
}

/// `rounds R cmd C` printed by the selfstop and vfork_loop fixtures: R.
fn rounds_made(stdout: &str) -> u64 {
    let rest = stdout
        .trim_end()
        .strip_prefix("rounds ")
        .unwrap_or_else(|| panic!("fixture output: {stdout:?}"));
    let (rounds, cmd) = rest.split_once(" cmd ").expect("rounds R cmd C");
    assert_eq!(cmd, "0", "the background command failed: {stdout:?}");
    rounds.parse().expect("a round count")
}

/// Possible CPUs (`/sys/devices/system/cpu/possible`, e.g. `0-1` or
/// `0-3,6`): the count libbpf sizes per-CPU producers by, and so memtrail's
/// rule.
fn possible_cpus() -> u64 {
    let text = fs::read_to_string("/sys/devices/system/cpu/possible").expect("read possible CPUs");
    text.trim()
        .split(',')
        .map(|range| match range.split_once('-') {
            Some((a, b)) => b.parse::<u64>().unwrap() - a.parse::<u64>().unwrap() + 1,
            None => 1,
        })
        .sum()
}

/// The room a ring needs above its watermark: two records per CPU plus the
/// crossing one, plus `freeze` bytes for the cgroup freeze to land.
fn min_room(record: u64, freeze: u64) -> u64 {
    (RECORDS_PER_CPU * possible_cpus() + 1) * record + freeze
}

/// The freeze room of a ring every CPU writes into (`freeze_room` in
/// src/pressure): 64 KiB per CPU, at most 128 KiB.
fn freeze_room() -> u64 {
    (possible_cpus() * (64 << 10)).min(128 << 10)
}

/// The highest watermark (percent) that leaves `min_room(record, freeze)`
/// in a ring of `capacity` bytes; `None` when even 1% does not.
fn max_watermark(capacity: u64, record: u64, freeze: u64) -> Option<u64> {
    (1..=99)
        .rev()
        .find(|p| capacity - capacity * p / 100 >= min_room(record, freeze))
}

/// `MEMTRAIL_FAULT` for pauses by SIGSTOP (no cgroup), where rings need no
/// freeze room, plus `more`.
fn no_cgroup(more: &str) -> OsString {
    if more.is_empty() {
        "no-cgroup".into()
    } else {
        format!("no-cgroup,{more}").into()
    }
}

/// Check that a job-control shell under memtrail sees its jobs as without
/// it (issue 11, part 2): `bash -c 'set -m; /bin/true; echo rc=$?'` prints
/// `rc=0` and no `Stopped` job once /bin/true is in the image cache.
///
/// The first exec ever of an image is still held with SIGSTOP until
/// memtrail has examined it (a shell reports that job `Stopped`, rc=147),
/// and so is any exec of it made while that examination runs (a shell that
/// moves on from the stopped job does that). Execs one after the other hold
/// an image at most once: on a cold cache, a parent watching with
/// `WUNTRACED` sees at most one stop for the first of two runs of /bin/true
/// and none for the second; in later captures of the unchanged image,
/// none at all.
#[test]
fn attach_job_control_shell_sees_no_stop() {
    let cache = tempfile::tempdir().expect("create a cache directory");
    let cold = run(
        cache.path(),
        &[],
        &argv(&[&fixture("wuntraced"), &"2", &"/bin/true"]),
        &[],
    );
    cold.expect_code(0);
    let runs: Vec<&str> = cold.stdout.lines().collect();
    assert!(
        matches!(
            runs[..],
            ["stops 0 code 0" | "stops 1 code 0", "stops 0 code 0"]
        ),
        "{}",
        cold.stdout
    );

    let shell = argv(&[&"/bin/bash", &"-c", &"set -m; /bin/true; echo rc=$?"]);
    for _ in 0..3 {
        let warm = run(cache.path(), &[], &shell, &[]);
        warm.expect_code(0);
        assert_eq!(warm.stdout, "rc=0\n", "stderr:\n{}", warm.stderr);
        assert!(!warm.stderr.contains("Stopped"), "{}", warm.stderr);
    }
}

/// `WRAPPER ARG storm threads ROUNDS` under `--ring-size 1M
/// --pressure-timeout inf` with a slowed events pipeline, on an image cache
/// warmed by a one-round run of the same.
fn paused_storm_under(wrapper: &str, arg: &str) -> Run {
    let storm = fixture("storm");
    let cache = warm_cache(&argv(&[&fixture(wrapper), &"1", &storm, &"threads", &"1"]));
    let rounds = ROUNDS.to_string();
    let cmd = argv(&[&fixture(wrapper), &arg, &storm, &"threads", &rounds]);
    let fault: OsString = "slow-events".into();
    run(
        cache.path(),
        // Latched at 1 MiB, hard mark near 4 MiB: the freeze has ~3 MiB of
        // records (some 48,000) to land in, so a coordinator that waits a
        // few milliseconds for a CPU does not let a self-stop through (a
        // 1 MiB ring at 75% left it ~250 KiB, and CI saw one stop).
        &[
            "--ring-size",
            "4M",
            "--watermark",
            "25",
            "--pressure-timeout",
            "inf",
        ],
        &cmd,
        &[("MEMTRAIL_FAULT", &fault)],
    )
}

/// Check that a parent looping on `waitpid(WUNTRACED)` over an 8-thread
/// storm sees no stop while pressure pauses it (issue 11, part 2): with a
/// warm image cache and a 4 MiB ring latched at 25%, the cgroup freeze lands
/// long before the ring's hard mark, so no producer stops itself; episodes happen and
/// every allocation is counted.
#[test]
fn pressure_wuntraced_parent_sees_no_stop() {
    let r = paused_storm_under("wuntraced", "1");
    r.expect_code(0);
    assert_eq!(r.stdout, "stops 0 code 0\n", "stderr:\n{}", r.stderr);
    let p = r.profile();
    nothing_lost(p);
    assert!(r.episodes() > 0, "no episode: {}", p["pressure"]);
    assert_eq!(allocations_of(p, 45678), 8 * ROUNDS);
}

/// Check that a child stopping itself (`raise(SIGSTOP)`) while its parent
/// waits for that stop with `WUNTRACED` behaves as without memtrail while
/// pressure episodes pause the tree (a storm in the same tree, `inf`; issue
/// 11, part 2): the parent sees exactly the child's own stop each round,
/// its SIGCONT lets the child exit 0, and the run completes (it hung when
/// the parent consumed memtrail's stop instead of the child's).
#[test]
fn pressure_self_stopping_child_seen_once() {
    let r = paused_storm_under("selfstop", "20");
    r.expect_code(0);
    let made = rounds_made(&r.stdout);
    assert!(made >= 20, "{}", r.stdout);
    let p = r.profile();
    nothing_lost(p);
    assert!(r.episodes() > 0, "no episode: {}", p["pressure"]);
    assert_eq!(allocations_of(p, 45678), 8 * ROUNDS);
    assert_eq!(allocations_of(p, 12345), 200 * made);
}

/// One storm (`storm` or `stack_storm` fixture, threads or procs) under
/// `inf` with the given rings, watermark and faults: exits 0, loses
/// nothing, counts every allocation.
fn tiny_ring_storm(
    cache: &Path,
    fixture_name: &str,
    mode: &str,
    opts: &[&str],
    fault: &OsString,
    rounds: u64,
) {
    let n = rounds.to_string();
    let cmd = argv(&[&fixture(fixture_name), &mode, &n]);
    let r = run(cache, opts, &cmd, &[("MEMTRAIL_FAULT", fault)]);
    r.expect_code(0);
    let p = r.profile();
    nothing_lost(p);
    let workers = if mode == "threads" { 8 } else { 16 };
    let per_round = if fixture_name == "stack_storm" {
        100
    } else {
        1
    };
    assert_eq!(
        allocations_of(p, 45678),
        workers * rounds * per_round,
        "{fixture_name} {mode} {opts:?}"
    );
    assert!(r.episodes() > 0, "no episode: {}", p["pressure"]);
}

/// `--ring-size SIZE` at the highest watermark it allows (with `freeze`
/// bytes of freeze room), `inf`, one shared ring (the rule and the sizes
/// here are for it: a machine of 4 CPUs or more would otherwise give each
/// CPU a ring).
fn events_ring_at_minimum(size: u64, freeze: u64) -> Vec<String> {
    let wm = max_watermark(size, EVENT_RECORD, freeze).expect("a usable events ring");
    [
        "--ring-size",
        &size.to_string(),
        "--watermark",
        &wm.to_string(),
    ]
    .into_iter()
    .chain(["--pressure-timeout", "inf", "--event-rings", "shared"])
    .map(str::to_owned)
    .collect()
}

/// `--stack-ring-size SIZE` (and the events ring the same size) at the
/// highest watermark the stack ring allows (with `freeze` bytes of freeze
/// room), `inf`.
fn stack_ring_at_minimum(size: u64, freeze: u64) -> Vec<String> {
    let wm = max_watermark(size, STACK_RECORD, freeze).expect("a usable stack ring");
    // An events ring with room to spare: only the stack ring is at its
    // minimum.
    let events = if freeze > 0 { 4 * size } else { 4096 }.to_string();
    [
        "--ring-size",
        &events,
        "--stack-ring-size",
        &size.to_string(),
    ]
    .into_iter()
    .chain(["--watermark", &wm.to_string(), "--pressure-timeout", "inf"])
    .chain(["--event-rings", "shared"])
    .map(str::to_owned)
    .collect()
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// Check that `inf` is lossless on the smallest events ring memtrail
/// accepts (issue 11, part 3: a 4 KiB ring at 99% lost 358,226 events).
/// Pausing by SIGSTOP (no cgroup), the rule is room above the watermark for
/// (2 x CPUs + 1) of the ring's largest records with their ring header
/// (288 B: the exec event): at the highest watermark that leaves it in a 4
/// KiB ring, 8-thread and 16-process storms, 3 times each, exit 0, lose
/// nothing and count every allocation. With the cgroup freezer the ring
/// also keeps the freeze room (issue 28), and the smallest it accepts is
/// lossless as well when the freeze comes only once every busy thread has
/// stopped itself at the hard mark (`late-pause`; the events pipeline takes
/// nothing until then, `stall-events`, so the hard mark is reached).
#[test]
fn pressure_tiny_events_ring_at_minimum_is_lossless() {
    let cache = tempfile::tempdir().expect("create a cache directory");
    let signal = events_ring_at_minimum(4096, 0);
    for _ in 0..3 {
        for (mode, rounds) in [("threads", 1000), ("procs", 500)] {
            let fault = no_cgroup("");
            tiny_ring_storm(cache.path(), "storm", mode, &strs(&signal), &fault, rounds);
        }
    }
    let freeze = events_ring_at_minimum(1 << 20, freeze_room());
    for (mode, rounds) in [("threads", 3000), ("procs", 1500)] {
        let fault: OsString = "stall-events,late-pause".into();
        tiny_ring_storm(cache.path(), "storm", mode, &strs(&freeze), &fault, rounds);
    }
}

/// Check the same for the smallest stack ring memtrail accepts (issue 11,
/// part 3: deep stacks lost stack records on a 4 KiB stack ring). Pausing by
/// SIGSTOP: at the highest watermark that leaves (2 x CPUs + 1) x 1048 B (a
/// stack record with its header) in an 8 KiB stack ring, storms of 100
/// distinct stacks per worker (8 threads, then 16 processes), 3 times each.
/// A resumed thread writes again before its next check, so a ring must hold
/// two records per live thread of the tree: a run either exits 0 having
/// lost nothing and counted every allocation, or fails (exit 71, never
/// wrong numbers) naming the tree's thread count and the stack ring size
/// that count needs; with that size the storm is lossless, also on a loaded
/// machine (issue 26: 12 stack records were lost with it, 17 live threads
/// and load 8 on 2 CPUs, through processes forked past the hard mark). With
/// the cgroup freezer, the smallest ring it accepts holds every thread of
/// these storms, and is lossless at once, also when the freeze comes only
/// once every busy thread stopped itself at the hard mark (`late-pause`,
/// with `stall-stacks` so that the hard mark is reached).
#[test]
fn pressure_tiny_stack_ring_at_minimum_is_lossless() {
    let cache = tempfile::tempdir().expect("create a cache directory");
    let opts = stack_ring_at_minimum(8192, 0);
    let fault = no_cgroup("");
    for mode in ["threads", "procs"] {
        let cmd = argv(&[&fixture("stack_storm"), &mode, &"2"]);
        let mut size = None;
        for _ in 0..3 {
            let r = run(
                cache.path(),
                &strs(&opts),
                &cmd,
                &[("MEMTRAIL_FAULT", &fault)],
            );
            if r.code == Some(0) {
                nothing_lost(r.profile());
                continue;
            }
            r.expect_code(71);
            assert!(r.stderr.contains("live threads"), "{}", r.stderr);
            let advised = r
                .stderr
                .split("--stack-ring-size ")
                .nth(1)
                .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or_else(|| panic!("no advised size in:\n{}", r.stderr));
            size = Some(advised);
        }
        let mut opts = opts.clone();
        if let Some(size) = size {
            let at = opts.iter().position(|o| o == "--stack-ring-size").unwrap() + 1;
            opts[at] = size.to_string();
        }
        for _ in 0..3 {
            tiny_ring_storm(cache.path(), "stack_storm", mode, &strs(&opts), &fault, 2);
        }
    }
    let freeze = stack_ring_at_minimum(1 << 20, freeze_room());
    // 16 processes make 1600 new stacks, past what 1 MiB holds (threads
    // share their process's 100).
    let late: OsString = "stall-stacks,late-pause".into();
    tiny_ring_storm(
        cache.path(),
        "stack_storm",
        "procs",
        &strs(&freeze),
        &late,
        2,
    );
}

/// Check that a ring one percent of watermark short of the room pausing
/// needs is refused before the command starts (issue 11, part 3): exit 2,
/// a message naming the ring, its option and the room needed, and the
/// command not run; for the events ring (4 KiB) and the stack ring (8 KiB)
/// pausing by SIGSTOP, and for both at 1 MiB with the cgroup freezer, whose
/// freeze room the message names (issue 28).
#[test]
fn pressure_ring_below_minimum_refused() {
    let cache = tempfile::tempdir().expect("create a cache directory");
    let freeze = freeze_room();
    let cases = [
        (
            events_ring_at_minimum(4096, 0),
            "events",
            "--ring-size",
            EVENT_RECORD,
            0,
        ),
        (
            stack_ring_at_minimum(8192, 0),
            "stacks",
            "--stack-ring-size",
            STACK_RECORD,
            0,
        ),
        (
            events_ring_at_minimum(1 << 20, freeze),
            "events",
            "--ring-size",
            EVENT_RECORD,
            freeze,
        ),
        (
            stack_ring_at_minimum(1 << 20, freeze),
            "stacks",
            "--stack-ring-size",
            STACK_RECORD,
            freeze,
        ),
    ];
    for (mut opts, ring, option, record, freeze) in cases {
        // One percent above the highest accepted watermark.
        let wm = opts.iter().position(|o| o == "--watermark").unwrap() + 1;
        opts[wm] = (opts[wm].parse::<u64>().unwrap() + 1).to_string();
        let marker_dir = tempfile::tempdir().expect("create a marker directory");
        let marker = marker_dir.path().join("ran");
        let cmd = argv(&[&"/usr/bin/touch", &marker]);
        let fault = if freeze == 0 {
            no_cgroup("")
        } else {
            OsString::new()
        };
        let r = run(
            cache.path(),
            &strs(&opts),
            &cmd,
            &[("MEMTRAIL_FAULT", &fault)],
        );
        r.expect_code(2);
        let mut parts = vec![
            format!("the {ring} ring"),
            option.to_owned(),
            format!("at least {}", min_room(record, freeze)),
        ];
        if freeze > 0 {
            parts.push("cgroup freeze".to_owned());
        }
        for part in parts {
            assert!(r.stderr.contains(&part), "{part:?} not in:\n{}", r.stderr);
        }
        assert!(!marker.exists(), "the command ran: {opts:?}");
    }
}

/// Check that pauses stay invisible at the smallest rings memtrail accepts
/// (issue 28: on 64 KiB rings, which it accepted, a job-control shell
/// printed `[1]+ Stopped` and `rc=147` in 10 of 10 runs, and a parent
/// waiting with `WUNTRACED` saw 16 to 32 stops). The smallest size accepted
/// for both rings at the default watermark is found by asking memtrail;
/// there, with two CPU hogs beside it, an 8-thread storm paused by the
/// cgroup freezer shows its `WUNTRACED` parent no stop and a job-control
/// shell no stopped job, 3 times each, every allocation counted.
#[test]
fn pressure_pauses_invisible_at_smallest_accepted_rings() {
    let cache = warm_cache(&argv(&[
        &fixture("wuntraced"),
        &"1",
        &fixture("storm"),
        &"threads",
        &"1",
    ]));
    let size = [4u64 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20]
        .into_iter()
        .find(|size| {
            let s = size.to_string();
            let opts = [
                "--ring-size",
                &s,
                "--stack-ring-size",
                &s,
                "--pressure-timeout",
                "inf",
            ];
            run(cache.path(), &opts, &argv(&[&"/bin/true"]), &[]).code != Some(2)
        })
        .expect("a ring size memtrail accepts")
        .to_string();
    let opts = [
        "--ring-size",
        &size,
        "--stack-ring-size",
        &size,
        "--pressure-timeout",
        "inf",
        "--event-rings",
        "shared",
    ];
    let _hogs = support::CpuHogs::start(2);
    let storm = fixture("storm");
    let rounds = ROUNDS.to_string();
    for _ in 0..3 {
        let cmd = argv(&[&fixture("wuntraced"), &"1", &storm, &"threads", &rounds]);
        let r = run(cache.path(), &opts, &cmd, &[]);
        r.expect_code(0);
        assert_eq!(
            r.stdout, "stops 0 code 0\n",
            "{size}: stderr:\n{}",
            r.stderr
        );
        nothing_lost(r.profile());
        assert_eq!(allocations_of(r.profile(), 45678), 8 * ROUNDS);
        let script = format!("set -m; {} threads {rounds}; echo rc=$?", storm.display());
        let r = run(
            cache.path(),
            &opts,
            &argv(&[&"/bin/bash", &"-c", &script]),
            &[],
        );
        r.expect_code(0);
        assert_eq!(r.stdout, "rc=0\n", "{size}: stderr:\n{}", r.stderr);
        assert!(!r.stderr.contains("Stopped"), "{}", r.stderr);
    }
}

/// Check what a finite `--pressure-timeout` means with a vfork tree
/// (issue 11, part 4: each pause waited 1.01 s for the vfork parent to
/// stop, and the capture failed with 76), as a bound memtrail keeps, not a
/// race (issue 26: under load 8 on 2 CPUs, 250 ms was too short for the
/// pipelines to drain, and the capture failed with 76, as a finite timeout
/// must then). A vfork parent stays in vfork for as long as a storm next
/// to it runs (its first child waits for the storm's end before it execs),
/// so every pause of the storm (a 1 MiB ring, a slowed events pipeline)
/// has a vfork parent in the tree: a pause that waited for it would never
/// end and fail at the timeout. With a timeout far above what a drain
/// takes (10 s), the capture exits 0, every pause shorter than the
/// timeout (memtrail fails a capture whose pause was not), every
/// allocation counted.
#[test]
fn pressure_vfork_tree_meets_finite_timeout() {
    let cache = tempfile::tempdir().expect("create a cache directory");
    let tag = tempfile::tempdir().expect("create a tag directory");
    let done: OsString = tag.path().join("storm-done").into();
    let rounds = ROUNDS.to_string();
    let cmd = argv(&[
        &fixture("vfork_loop"),
        &"20",
        &"/bin/true",
        &fixture("storm"),
        &"threads",
        &rounds,
    ]);
    let fault: OsString = "slow-events".into();
    let r = run(
        cache.path(),
        &[
            "--ring-size",
            "1M",
            "--stack-ring-size",
            "1M",
            "--pressure-timeout",
            "10s",
        ],
        &cmd,
        &[
            ("MEMTRAIL_FAULT", &fault),
            ("STORM_DONE", &done),
            ("VFORK_HOLD_UNTIL", &done),
        ],
    );
    r.expect_code(0);
    assert!(rounds_made(&r.stdout) >= 20, "{}", r.stdout);
    let p = r.profile();
    nothing_lost(p);
    assert!(r.episodes() > 0, "no episode: {}", p["pressure"]);
    let longest = p["pressure"]["longest_pause_ns"].as_u64().unwrap();
    assert!(longest <= 10_000_000_000, "{}", p["pressure"]);
    assert_eq!(allocations_of(p, 45678), 8 * ROUNDS);
}

/// Check that a pause memtrail cannot end within a finite
/// `--pressure-timeout` fails the capture however late it ends (issue 28:
/// with 10 ms, runs recorded pauses of 13-23 ms and exited 0; the deadline
/// covered the freeze and the drain, not the release and the thaw). With a
/// coordinator that resumes the tree only once the timeout has passed since
/// the drain (`late-release`; 2 s, which a drain of this storm's 1 MiB
/// ring does not take), the capture fails with 76 naming the pause, no
/// profile, and the tree is killed.
#[test]
fn pressure_late_resume_fails_at_timeout() {
    let cache = tempfile::tempdir().expect("create a cache directory");
    let tag = tempfile::tempdir().expect("create a tag directory");
    let done = tag.path().join("storm-done");
    let cmd = argv(&[&fixture("storm"), &"threads", &ROUNDS.to_string()]);
    let fault: OsString = "slow-events,late-release".into();
    let r = run(
        cache.path(),
        &[
            "--ring-size",
            "1M",
            "--stack-ring-size",
            "1M",
            "--pressure-timeout",
            "2s",
        ],
        &cmd,
        &[
            ("MEMTRAIL_FAULT", &fault),
            ("STORM_DONE", &done.clone().into_os_string()),
        ],
    );
    r.expect_code(76);
    assert!(r.stderr.contains("longer than the 2s"), "{}", r.stderr);
    assert!(
        r.stderr.contains("the tracked tree was killed"),
        "{}",
        r.stderr
    );
    assert!(r.profile.is_none());
    assert!(!done.exists(), "the storm ran to its end");
}

/// Directories named `name` under `dir`, recursively.
fn find_dirs(dir: &Path, name: &str, found: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            if e.file_name() == name {
                found.push(e.path());
            }
            find_dirs(&e.path(), name, found);
        }
    }
}

/// Processes whose environment holds `marker`, with their state letter.
fn marked_processes(marker: &str) -> Vec<(u32, char)> {
    let mut found = Vec::new();
    for e in fs::read_dir("/proc").expect("read /proc").flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(env) = fs::read(e.path().join("environ")) else {
            continue;
        };
        if env.split(|&b| b == 0).any(|v| v == marker.as_bytes()) {
            let state = fs::read_to_string(e.path().join("stat"))
                .ok()
                .and_then(|s| s.rsplit_once(')')?.1.trim_start().chars().next())
                .unwrap_or('?');
            found.push((pid, state));
        }
    }
    found
}

/// Check that a pressure episode that cannot recover in time (the events
/// poller wedged, `250ms`, a vfork tree next to the storm) fails with 76
/// naming the events pipeline only, and leaves nothing behind (issue 11,
/// part 4): the tree killed, no process of it stopped or frozen, no
/// `memtrail-PID` cgroup left.
#[test]
fn pressure_wedged_poller_fails_cleanly() {
    let cache = tempfile::tempdir().expect("create a cache directory");
    let tag = tempfile::tempdir().expect("create a tag directory");
    let marker_path = tag.path().join("storm-done");
    let marker = format!("STORM_DONE={}", marker_path.display());
    let rounds = ROUNDS.to_string();
    let cmd = argv(&[
        &fixture("vfork_loop"),
        &"20",
        &"/bin/true",
        &fixture("storm"),
        &"threads",
        &rounds,
    ]);
    let fault: OsString = "wedge-events".into();
    let r = run(
        cache.path(),
        &[
            "--ring-size",
            "1M",
            "--stack-ring-size",
            "1M",
            "--pressure-timeout",
            "250ms",
        ],
        &cmd,
        &[
            ("MEMTRAIL_FAULT", &fault),
            ("STORM_DONE", &marker_path.clone().into_os_string()),
        ],
    );
    r.expect_code(76);
    // The wedged events pipeline is named; on a starved machine (two CPU
    // hogs beside the storm) another pipeline may be late within 250ms too
    // and is named with it: what is late is said, never left out.
    assert!(
        support::late_pipelines(&r.stderr).is_some_and(|names| names.contains(&"events")),
        "{}",
        r.stderr
    );
    assert!(r.profile.is_none());

    // SIGKILL reaches every process of the tree; wait (bounded) for them to
    // be gone, and none may be stopped meanwhile.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let left = marked_processes(&marker);
        assert!(
            left.iter().all(|&(_, s)| s != 'T' && s != 't'),
            "stopped: {left:?}"
        );
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the tree is still there: {left:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(!marker_path.exists(), "the storm ran to its end");
    let mut cgroups = Vec::new();
    find_dirs(
        &cgroup2_mount(),
        &format!("memtrail-{}", r.pid),
        &mut cgroups,
    );
    assert!(cgroups.is_empty(), "cgroup left: {cgroups:?}");
}
