//! The preload shim (`memtrail run --preload`, issue 22): a tree whose
//! processes load it is counted exactly, processes that cannot load it (a
//! static binary, an environment cleared) keep the probes inside the same
//! capture, and stacks are the probes' frame for frame.

use std::ffi::OsString;

use crate::support::{
    self, Counters, allocator_events, capture_flags, cmd, fixture, fixture_with_flags, num, pid,
    process, processes, sized, stream_root,
};
use serde_json::Value;

/// The uprobe mode's capture, whatever `MEMTRAIL_PRELOAD` says.
const PROBES: &[(&str, &str)] = &[("MEMTRAIL_PRELOAD", "0")];

/// The shim's hook path in every process (no rings).
const HOOK_ONLY: Env = &[("MEMTRAIL_FAULT", "shim-hook-only")];

/// Variables set for a capture.
type Env = &'static [(&'static str, &'static str)];

/// The uprobe mode's probes where the shim's are: per process. (System-wide,
/// libstdc++'s constructor's allocation, made before main, has unnamed
/// frames past its first: its table is not in BPF yet.)
const PER_PROCESS: [&str; 2] = ["--probes", "per-process"];

fn preloaded(profile: &Value, pid: u32) -> bool {
    process(profile, pid)["preloaded"] == true
}

fn forked_children(events: &[Value], parent: u32) -> Vec<u32> {
    events
        .iter()
        .filter(|e| e["kind"] == "fork" && num(e, "pid") == u64::from(parent))
        .map(|e| u32::try_from(num(e, "child_pid")).expect("pid"))
        .collect()
}

/// Check that a 3-level tree of fork + exec, every process with the shim,
/// is counted exactly: each process its one leaked block, nothing twice,
/// and each named preloaded in the profile.
#[test]
fn preload_tree_exact() {
    let mid = fixture("tree_mid");
    let leaf = fixture("tree_leaf");
    let run = capture_flags(
        &["--preload"],
        &cmd("tree_root", &[mid.as_os_str(), leaf.as_os_str()]),
        b"",
        &[],
    );
    run.expect_code(0);
    let events = run.events();
    let root = stream_root(events);
    let mid_pid = forked_children(events, root)[0];
    let leaf_pid = forked_children(events, mid_pid)[0];
    let profile = run.profile();
    assert_eq!(processes(profile).len(), 3);
    for (pid, leak) in [(root, 700001), (mid_pid, 700013), (leaf_pid, 700027)] {
        assert!(preloaded(profile, pid), "{pid} not preloaded: {profile}");
        assert_eq!(
            Counters::of(process(profile, pid)),
            Counters::one_leak(leak),
            "process {pid}"
        );
    }
}

/// Check that inside a preload capture a static child (no ld.so) and a
/// child exec'd with an empty environment (no LD_PRELOAD) are counted
/// exactly by the probes, and the parent, with the shim, exactly by it:
/// nothing missed, nothing twice.
#[test]
fn preload_children_without_the_shim_keep_probes() {
    let static_exe = super::attach::static_fixture();
    let leaf = fixture("tree_leaf");
    let run = capture_flags(
        &["--preload"],
        &cmd(
            "preload_children",
            &[static_exe.as_os_str(), leaf.as_os_str()],
        ),
        b"",
        &[],
    );
    run.expect_code(0);
    let events = run.events();
    let profile = run.profile();
    let parent = stream_root(events);
    let children = forked_children(events, parent);
    assert_eq!(children.len(), 2, "{children:?}");
    let (static_pid, bare_pid) = (children[0], children[1]);

    assert!(preloaded(profile, parent));
    assert!(
        !preloaded(profile, static_pid),
        "a static binary loads no shim"
    );
    assert!(!preloaded(profile, bare_pid), "no LD_PRELOAD, no shim");

    let of = |pid: u32, kind: &str, size: u64| {
        sized(events, kind, size)
            .iter()
            .filter(|e| support::pid(e) == pid)
            .count()
    };
    assert_eq!(of(static_pid, "calloc", 7007), 1, "static constructor");
    assert_eq!(of(static_pid, "malloc", 77777), 3, "static mallocs");
    let blocks: Vec<u64> = sized(events, "malloc", 77777)
        .iter()
        .map(|e| num(e, "addr"))
        .collect();
    let static_frees = allocator_events(events, static_pid)
        .iter()
        .filter(|e| e["kind"] == "free" && blocks.contains(&num(e, "addr")))
        .count();
    assert_eq!(static_frees, 1, "frees of the static binary's blocks");
    assert_eq!(
        Counters::of(process(profile, bare_pid)),
        Counters::one_leak(700027),
        "the child without an environment"
    );
    assert_eq!(
        Counters::of(process(profile, parent)),
        Counters {
            allocations: 2,
            frees: 1,
            allocated_bytes: 600011 + 600023,
            freed_bytes: 600023,
            peak_live_bytes: 600011 + 600023,
            live_bytes_at_exit: 600011,
            live_allocations_at_exit: 1,
            ..Counters::default()
        },
        "the parent, with the shim"
    );
}

/// A frame: function, file, line.
type Frame = (String, String, u64);

/// Every allocation site of a profile: its frames, allocations and bytes,
/// sorted.
fn sites(profile: &Value) -> Vec<(Vec<Frame>, u64, u64)> {
    let mut sites: Vec<_> = support::allocation_sites(profile)
        .into_iter()
        .map(|s| {
            let frames = s["frames"]
                .as_array()
                .expect("frames")
                .iter()
                .map(|f| {
                    (
                        f["function"].as_str().unwrap_or("").to_owned(),
                        f["file"].as_str().unwrap_or("").to_owned(),
                        f["line"].as_u64().unwrap_or(0),
                    )
                })
                .collect();
            (frames, num(s, "allocations"), num(s, "bytes"))
        })
        .collect();
    sites.sort();
    sites
}

/// The profile of `command` with `flags`, with the shim or with the probes.
fn profile_of(command: &[OsString], flags: &[&str], preload: bool) -> Value {
    let mut all = flags.to_vec();
    all.extend(if preload {
        &["--preload"][..]
    } else {
        &PER_PROCESS[..]
    });
    let run = capture_flags(&all, command, b"", if preload { &[] } else { PROBES });
    run.expect_code(0);
    let root = stream_root(run.events());
    let profile = run.profile().clone();
    assert_eq!(preloaded(&profile, root), preload, "{flags:?}");
    profile
}

/// Check that the shim's stacks are the probes', frame for frame (first
/// frame the allocator's caller, up to main and _start), with the same
/// counts per site: a C program with frame pointers, one without (stacks
/// through qsort's callback and a signal handler), C++ new and nothrow new,
/// with each `--unwind` mode; and without stacks the same totals.
#[test]
fn preload_stacks_same_as_probes() {
    let no_fp = vec![fixture_with_flags("stack_unwind", support::NO_FP).into_os_string()];
    let cases: [(Vec<OsString>, &[&str]); 6] = [
        (cmd("stacks", &[]), &[]),
        (cmd("stacks", &[]), &["--unwind", "fp"]),
        (no_fp.clone(), &[]),
        (no_fp, &["--unwind", "dwarf"]),
        (cmd("stack_cxx", &[]), &[]),
        (cmd("stack_cxx", &[]), &["--unwind", "fp"]),
    ];
    // The program's own sites (those through main) frame for frame; the
    // C++ runtime's allocation before main is compared by the totals only:
    // its ld.so frames (call_init, _dl_init) are at times left without
    // their module in either mode when the process is gone before memtrail
    // read its mappings (ld.so is mapped by exec, not by an mmap memtrail
    // records: a symbolization race of short runs, not the shim's).
    let from_main = |p: &Value| {
        let mut s = sites(p);
        s.retain(|(frames, _, _)| frames.iter().any(|f| f.0 == "main"));
        s
    };
    let totals = |p: &Value| Counters::of(&p["totals"]);
    for (command, flags) in &cases {
        let probes = profile_of(command, flags, false);
        let shim = profile_of(command, flags, true);
        let sites = from_main(&probes);
        assert!(!sites.is_empty(), "{command:?} {flags:?}: no sites");
        assert_eq!(sites, from_main(&shim), "{command:?} {flags:?}");
        assert_eq!(totals(&probes), totals(&shim), "{command:?} {flags:?}");
    }
    let command = cmd("stacks", &[]);
    let flags = ["--stack-depth", "0"];
    let probes = profile_of(&command, &flags, false);
    let shim = profile_of(&command, &flags, true);
    assert_eq!(totals(&probes), totals(&shim));
    assert!(sites(&shim).is_empty(), "no stacks with --stack-depth 0");
}

/// The counters the batched-frees test checks: allocations, frees,
/// unmatched frees, and the blocks and bytes left live at exit.
fn heap_of(profile: &Value, pid: u32) -> [u64; 5] {
    let c = Counters::of(process(profile, pid));
    [
        c.allocations,
        c.frees,
        c.unmatched_frees,
        c.live_allocations_at_exit,
        c.live_bytes_at_exit,
    ]
}

/// Check that the frees the shim batches (issue 22) are counted exactly
/// however a thread's batch ends (tests/fixtures/preload_batch.c): a full
/// buffer, a large block's free, a fork (the parent's pending frees go
/// first), _exit, an exec, a
/// thread's return, a thread killed by another's _exit, a fatal signal, and
/// a signal handler's frees while the thread buffers (also in the middle
/// of the shim's updates of its buffer); each free from the thread that
/// made it; and the probes count the same.
#[test]
fn preload_batched_frees_exact() {
    let modes: [(&str, &[&str], Env); 3] = [
        ("rings", &["--preload"], &[]),
        ("hook", &["--preload"], HOOK_ONLY),
        ("probes", &PER_PROCESS, PROBES),
    ];
    for (mode, flags, env) in modes {
        let preload = mode != "probes";
        let run = capture_flags(flags, &cmd("preload_batch", &[]), b"", env);
        run.expect_code(0);
        let events = run.events();
        let profile = run.profile();
        let root = stream_root(events);
        let children = forked_children(events, root);
        assert_eq!(children.len(), 6, "{children:?}");
        for pid in std::iter::once(root).chain(children.iter().copied()) {
            assert_eq!(preloaded(profile, pid), preload, "process {pid}");
        }
        let stdout = String::from_utf8_lossy(&run.stdout);
        let loops: u64 = stdout
            .lines()
            .find_map(|l| l.strip_prefix("loops="))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no loops= line in {stdout:?}"));
        // pthread_create's DTV calloc, left with the cached stack (the
        // second thread, created after the first was joined, reuses its
        // stack and DTV), an entry longer per TLS module the shim brings
        // (its own; libunwind's on the ring path); under the probes, the
        // returning thread's tcache is freed where the probes see it
        // (tests/track/track_threads.rs).
        let dtv = match mode {
            "rings" => (18 + u64::from(support::libunwind_installed())) * 16,
            "hook" => 18 * 16,
            _ => 17 * 16,
        };
        let tcache = u64::from(!preload);
        let expected: [(&str, [u64; 5]); 6] = [
            ("parent", [40, 39, 0, 1, 7040]),
            ("_exit", [41, 40 + 5, 0, 1, 8040]),
            ("exec", [11, 15, 0, 1, 700027]),
            ("threads", [21, 25, tcache, 1, dtv]),
            ("signal", [64 + 8 + loops, 64 + 8 + loops + 5, 0, 0, 0]),
            ("crash", [10, 15, 0, 0, 0]),
        ];
        for (pid, (what, counts)) in std::iter::once(root)
            .chain(children.iter().copied())
            .zip(expected)
        {
            // The probes miss a handler's free that lands inside a malloc
            // (free_entry takes it for the allocator's own: depth > 0).
            if what == "signal" && !preload {
                continue;
            }
            assert_eq!(
                heap_of(profile, pid),
                counts,
                "{what} (process {pid}, {mode})"
            );
        }
        // Threads killed wherever they were in their malloc/free loop:
        // every free they made counted once (none twice: no unmatched
        // free), at most one block each left live, and their two threads'
        // DTV.
        let busy = children[5];
        let [allocations, frees, unmatched, live, _] = heap_of(profile, busy);
        assert_eq!(unmatched, 0, "busy ({mode}): frees counted twice");
        let pairs = allocations - 2;
        assert!(pairs >= 4000, "busy: {pairs} pairs");
        assert!(
            (2..=4).contains(&live) && frees == 5 + allocations - live,
            "busy: {allocations} allocations, {frees} frees, {live} live"
        );
        // The large block's munmap, made by its free (at once, with the
        // waiting ones), is the allocator's own. (The probes record it as
        // not the allocator's, as they did before batching: not checked.)
        let munmaps: Vec<&Value> = events
            .iter()
            .filter(|e| support::pid(e) == children[0] && e["kind"] == "munmap")
            .collect();
        assert_eq!(munmaps.len(), 1, "{munmaps:?}");
        assert!(
            !preload || munmaps[0]["in_allocator"] == true,
            "{munmaps:?}"
        );
        // The killed thread's frees, recorded when the kill reached it,
        // are its own.
        let threads = children[2];
        let of_threads = allocator_events(events, threads);
        for size in 11001..=11010 {
            let at = of_threads
                .iter()
                .position(|e| e["kind"] == "malloc" && num(e, "size") == size)
                .expect("the killed thread's malloc");
            let malloc = of_threads[at];
            // After it (thread 1's blocks may have had its address).
            let frees: Vec<_> = of_threads[at..]
                .iter()
                .filter(|e| e["kind"] == "free" && num(e, "addr") == num(malloc, "addr"))
                .collect();
            assert_eq!(frees.len(), 1, "frees of its {size}-byte block");
            assert_eq!(support::tid(frees[0]), support::tid(malloc), "{size}");
        }
    }
}

/// Check that a process with more threads at once than the shim has rings
/// (tests/fixtures/preload_threads.c: 80 threads, 64 rings) is counted
/// exactly: the threads without a ring take the hook path beside the
/// others' ring path, and the capture gives the counts the hook path alone
/// gives (the DTV callocs a module longer on the ring path: libunwind's).
#[test]
fn preload_more_threads_than_rings_exact() {
    let counts = |env: Env| {
        let run = capture_flags(&["--preload"], &cmd("preload_threads", &[]), b"", env);
        run.expect_code(0);
        let events = run.events();
        let root = stream_root(events);
        let ours = allocator_events(events, root);
        let sized = |lo: u64| {
            ours.iter()
                .filter(|e| e["kind"] == "malloc" && (lo..lo + 80).contains(&num(e, "size")))
                .count()
        };
        assert_eq!(sized(20000), 80 * 100, "the pairs' mallocs");
        assert_eq!(sized(30000), 80, "the leaked blocks");
        let [allocations, frees, unmatched, live, _] = heap_of(run.profile(), root);
        [allocations, frees, unmatched, live]
    };
    let rings = counts(&[]);
    assert_eq!(rings[2], 0, "no unmatched free: {rings:?}");
    assert_eq!(rings, counts(HOOK_ONLY));
}

/// Check the shim's stack cache (issue 22: a walk it kept is given again
/// while the stack words the walk read are unchanged) on `stack_cache.c`,
/// whose allocations change callers at the same stack pointer one after
/// another (one frame up, two frames up, in a signal handler, on two
/// threads at once), with and without frame pointers: every site as the
/// probes have it and as the shim has it walking every stack
/// (`shim-no-stack-cache`), frame for frame and count for count; and each
/// size at its own caller.
#[test]
fn preload_stack_cache_exact() {
    const WALKED: Env = &[("MEMTRAIL_FAULT", "shim-no-stack-cache")];
    // The program's own sites (glibc's for a thread's TLS differ: with
    // the shim each thread's TLS vector is longer, docs/tracking.md).
    let from_leaf = |p: &Value| {
        let mut s = sites(p);
        s.retain(|(frames, _, _)| frames.first().is_some_and(|f| f.0 == "leaf"));
        s
    };
    for command in [
        cmd("stack_cache", &[]),
        vec![fixture_with_flags("stack_cache", support::NO_FP).into_os_string()],
    ] {
        let probes = profile_of(&command, &[], false);
        let cached = profile_of(&command, &[], true);
        let run = capture_flags(&["--preload"], &command, b"", WALKED);
        run.expect_code(0);
        let walked = run.profile().clone();
        let sites = from_leaf(&cached);
        assert_eq!(sites, from_leaf(&walked), "{command:?}: cached / walked");
        assert_eq!(sites, from_leaf(&probes), "{command:?}: cached / probes");
        let rounds = 2000;
        for (size, count, caller) in [
            (100, rounds, "via_a"),
            (200, rounds, "via_b"),
            (300, rounds, "outer_a"),
            (400, rounds, "outer_b"),
            (500, rounds, "via_a"),
            (600, rounds / 100, "on_usr1"),
            (700, 2 * rounds, "via_a"),
            (800, 2 * rounds, "via_b"),
        ] {
            let at: Vec<_> = sites
                .iter()
                .filter(|(_, n, bytes)| *bytes == size * n)
                .collect();
            assert_eq!(
                at.iter().map(|(_, n, _)| n).sum::<u64>(),
                count,
                "{command:?}: malloc({size}) {at:?}"
            );
            assert!(
                at.iter()
                    .all(|(frames, _, _)| frames.iter().take(3).any(|f| f.0 == caller)),
                "{command:?}: malloc({size}) not from {caller}: {at:?}"
            );
        }
    }
}

/// Check that an allocation made while the loader runs other libraries'
/// constructors, before the shim's own, is counted once with an allocator
/// that keeps its probes (issue 41 item 3): libstdc++'s emergency pool
/// (72,704 bytes), made through the shim's malloc into jemalloc's, was
/// recorded by the shim and again by jemalloc's malloc probe, which could
/// not yet see the shim's in-allocator flag (its offset came with the
/// constructor's hello). jemalloc comes after the shim in `LD_PRELOAD`, as
/// a user's preload does.
#[test]
fn preload_jemalloc_loader_time_allocation_once() {
    const JEMALLOC: &str = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2";
    let exe = fixture("cxx_baseline");
    let script = format!("LD_PRELOAD=\"$LD_PRELOAD {JEMALLOC}\" exec \"$0\"");
    let command: Vec<OsString> = vec!["/bin/sh".into(), "-c".into(), script.into(), exe.into()];
    let run = capture_flags(&["--preload"], &command, b"", &[]);
    run.expect_code(0);
    let events = run.events();
    let root = stream_root(events);
    assert!(preloaded(run.profile(), root), "not preloaded");
    // After the exec into the C++ program, its one allocation: the pool.
    let exec = events
        .iter()
        .rposition(|e| e["kind"] == "exec" && pid(e) == root)
        .expect("the exec");
    let program = allocator_events(&events[exec..], root);
    assert_eq!(program.len(), 1, "the emergency pool once: {program:#?}");
    assert_eq!(program[0]["kind"], "malloc", "{program:#?}");
    // No block is handed out twice while live, the shell's included.
    let mut live: Vec<u64> = Vec::new();
    for e in allocator_events(events, root) {
        let addr = num(e, "addr");
        match e["kind"].as_str() {
            Some("free") => live.retain(|&a| a != addr),
            Some("realloc") => {
                live.retain(|&a| a != num(e, "old_addr"));
                live.push(addr);
            }
            _ => {
                assert!(!live.contains(&addr), "{addr:#x} allocated twice: {e}");
                live.push(addr);
            }
        }
    }
    // jemalloc's malloc probe was there, and fired for the shim's call.
    let probes = run.profile()["probes"].as_array().expect("probes");
    let hits: u64 = probes
        .iter()
        .filter(|p| p["image"].as_str() == Some(JEMALLOC) && p["symbol"] == "malloc")
        .map(|p| num(p, "hits"))
        .sum();
    assert!(
        hits >= 1,
        "jemalloc's malloc probe never fired: {probes:#?}"
    );
}
