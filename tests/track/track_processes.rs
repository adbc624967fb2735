//! Process trees: fork without exec, exec without fork, and a 3-level tree
//! of fork + exec; per-process entries, pid/ppid relations and exe paths.

use crate::support::{
    self, Counters, allocator_events, capture, cmd, field, int, kind, num, path_str, process,
    processes, root_process, stream_root,
};
use serde_json::Value;

fn fork_events(events: &[Value]) -> Vec<(u64, u64)> {
    events
        .iter()
        .filter(|e| kind(e) == "fork")
        .map(|e| (num(e, "pid"), num(e, "child_pid")))
        .collect()
}

fn exit_status(events: &[Value], pid: u64) -> i64 {
    let exits: Vec<&Value> = events
        .iter()
        .filter(|e| kind(e) == "exit" && num(e, "pid") == pid)
        .collect();
    assert_eq!(exits.len(), 1, "exit events of {pid}");
    int(exits[0], "exit_code")
}

/// Check that a forked child (no exec) gets its own process entry with the
/// parent as ppid and the parent's exe, and its own exact counters; and that
/// the tree's totals add both up.
#[test]
fn track_fork_child_counted_separately() {
    let run = capture(&cmd("fork", &[]));
    run.expect_code(0);
    let events = run.events();
    let parent = stream_root(events);
    let forks = fork_events(events);
    assert_eq!(forks.len(), 1, "{forks:?}");
    assert_eq!(forks[0].0, u64::from(parent));
    let child = u32::try_from(forks[0].1).expect("pid");

    let sizes = |p: u32| -> Vec<(String, u64)> {
        allocator_events(events, p)
            .iter()
            .map(|e| {
                let size = if kind(e) == "free" { 0 } else { num(e, "size") };
                (kind(e).to_owned(), size)
            })
            .collect()
    };
    let s = |k: &str, n: u64| (k.to_owned(), n);
    assert_eq!(
        sizes(parent),
        [s("malloc", 500009), s("free", 0), s("malloc", 300007)]
    );
    assert_eq!(
        sizes(child),
        [s("malloc", 500029), s("malloc", 500057), s("free", 0)]
    );
    assert_eq!(exit_status(events, u64::from(child)), 0);

    let profile = run.profile();
    assert_eq!(processes(profile).len(), 2, "{profile}");
    let p = process(profile, parent);
    let c = process(profile, child);
    let exe = support::fixture("fork");
    assert_eq!(num(c, "ppid"), u64::from(parent));
    assert_eq!(support::string(p, "exe"), path_str(&exe));
    assert_eq!(support::string(c, "exe"), path_str(&exe), "inherited exe");
    assert_eq!(int(c, "exit_code"), 0);
    assert_eq!(
        Counters::of(p),
        Counters {
            allocations: 2,
            frees: 1,
            reallocs: 0,
            allocated_bytes: 500009 + 300007,
            freed_bytes: 500009,
            peak_live_bytes: 500009,
            live_bytes_at_exit: 300007,
            live_allocations_at_exit: 1,
            unmatched_frees: 0,
        }
    );
    assert_eq!(
        Counters::of(c),
        Counters {
            allocations: 2,
            frees: 1,
            reallocs: 0,
            allocated_bytes: 500029 + 500057,
            freed_bytes: 500029,
            peak_live_bytes: 500029 + 500057,
            live_bytes_at_exit: 500057,
            live_allocations_at_exit: 1,
            unmatched_frees: 0,
        }
    );
    // The child's two blocks are the tree's peak: the parent has nothing
    // live while it waits, and afterwards 300007 + the child's 500057 is
    // less.
    assert_eq!(
        Counters::of(field(profile, "totals")),
        Counters {
            allocations: 4,
            frees: 2,
            reallocs: 0,
            allocated_bytes: 500009 + 300007 + 500029 + 500057,
            freed_bytes: 500009 + 500029,
            peak_live_bytes: 500029 + 500057,
            live_bytes_at_exit: 300007 + 500057,
            live_allocations_at_exit: 2,
            unmatched_frees: 0,
        }
    );
}

/// Check that a forked child freeing a block it inherited from its parent
/// counts a free (not an unmatched free) in the child, and the parent's own
/// free of its copy still matches its allocation.
#[test]
fn track_fork_inherited_block_free_matched() {
    let run = capture(&cmd("fork_inherit", &[]));
    run.expect_code(0);
    let events = run.events();
    let parent = stream_root(events);
    let forks = fork_events(events);
    assert_eq!(forks.len(), 1, "{forks:?}");
    let child = u32::try_from(forks[0].1).expect("pid");
    let block = support::sized(events, "malloc", 510007);
    assert_eq!(block.len(), 1, "{block:?}");
    let addr = num(block[0], "addr");
    for pid in [parent, child] {
        let frees: Vec<u64> = allocator_events(events, pid)
            .iter()
            .filter(|e| kind(e) == "free")
            .map(|e| num(e, "addr"))
            .collect();
        assert_eq!(frees, [addr], "frees of {pid}");
    }

    let profile = run.profile();
    let c = Counters::of(process(profile, child));
    assert_eq!(
        (c.allocations, c.frees, c.unmatched_frees),
        (0, 1, 0),
        "{c:?}"
    );
    assert_eq!(
        Counters::of(process(profile, parent)),
        Counters {
            allocations: 1,
            frees: 1,
            reallocs: 0,
            allocated_bytes: 510007,
            freed_bytes: 510007,
            peak_live_bytes: 510007,
            live_bytes_at_exit: 0,
            live_allocations_at_exit: 0,
            unmatched_frees: 0,
        }
    );
    let totals = Counters::of(field(profile, "totals"));
    assert_eq!((totals.frees, totals.unmatched_frees), (2, 0), "{totals:?}");
}

/// Check that exec keeps the process entry, switches its exe to the new
/// program, records the exec event between the two images' allocations, and
/// that memtrail exits with the new program's status.
#[test]
fn track_exec_same_process_new_exe() {
    let second = support::fixture("exec_second");
    let run = capture(&cmd("exec_first", &[second.as_os_str()]));
    run.expect_code(5);
    let events = run.events();
    let root = stream_root(events);
    assert!(fork_events(events).is_empty());
    let pos = |pred: &dyn Fn(&Value) -> bool| -> usize {
        let found: Vec<usize> = events
            .iter()
            .enumerate()
            .filter(|(_, e)| num(e, "pid") == u64::from(root) && pred(e))
            .map(|(i, _)| i)
            .collect();
        assert_eq!(found.len(), 1, "matching events: {found:?}");
        found[0]
    };
    let before = pos(&|e| kind(e) == "malloc" && num(e, "size") == 600011);
    let exec = pos(&|e| kind(e) == "exec" && support::string(e, "filename") == path_str(&second));
    let after = pos(&|e| kind(e) == "malloc" && num(e, "size") == 600023);
    assert!(before < exec && exec < after, "{before} < {exec} < {after}");
    assert_eq!(exit_status(events, u64::from(root)), 5 << 8);

    let profile = run.profile();
    assert_eq!(processes(profile).len(), 1, "{profile}");
    let entry = process(profile, root);
    assert_eq!(support::string(entry, "exe"), path_str(&second));
    assert_eq!(int(entry, "exit_code"), 5);
    assert_eq!(
        field(profile, "exit"),
        &serde_json::json!({ "code": 5, "signal": null })
    );
    assert_eq!(
        Counters::of(entry),
        Counters {
            allocations: 2,
            frees: 1,
            reallocs: 0,
            allocated_bytes: 600011 + 600023,
            freed_bytes: 600011,
            peak_live_bytes: 600023,
            live_bytes_at_exit: 600023,
            live_allocations_at_exit: 1,
            unmatched_frees: 0,
        }
    );
}

/// Check that a 3-level tree (root -> mid -> leaf, each exec'd in a forked
/// child) has exact pid/ppid links, exe paths, exit codes and leaks.
#[test]
fn track_tree_three_levels() {
    check_tree_three_levels(&[]);
}

/// Check the same tree when every process but one keeps its thread state
/// in task storage: the path of a thread whose slot another thread holds.
#[test]
fn track_tree_three_levels_outside_thread_slots() {
    check_tree_three_levels(&[("MEMTRAIL_FAULT", "one-thread-slot")]);
}

fn check_tree_three_levels(env: &[(&str, &str)]) {
    let mid_exe = support::fixture("tree_mid");
    let leaf_exe = support::fixture("tree_leaf");
    let run = support::capture_env(
        &cmd("tree_root", &[mid_exe.as_os_str(), leaf_exe.as_os_str()]),
        b"",
        env,
    );
    run.expect_code(0);
    let events = run.events();
    let root = u64::from(stream_root(events));
    let forks = fork_events(events);
    assert_eq!(forks.len(), 2, "{forks:?}");
    let (_, mid) = *forks.iter().find(|f| f.0 == root).expect("fork of root");
    let (_, leaf) = *forks.iter().find(|f| f.0 == mid).expect("fork of mid");

    let execs = |pid: u64| -> Vec<&str> {
        events
            .iter()
            .filter(|e| kind(e) == "exec" && num(e, "pid") == pid)
            .map(|e| support::string(e, "filename"))
            .collect()
    };
    assert_eq!(execs(mid), [path_str(&mid_exe)]);
    assert_eq!(execs(leaf), [path_str(&leaf_exe)]);
    assert_eq!(exit_status(events, leaf), 11 << 8);
    assert_eq!(exit_status(events, mid), 12 << 8);
    assert_eq!(exit_status(events, root), 0);

    let profile = run.profile();
    assert_eq!(processes(profile).len(), 3, "{profile}");
    let entry = |pid: u64| process(profile, u32::try_from(pid).expect("pid"));
    assert_eq!(num(root_process(profile), "pid"), root);
    assert_eq!(num(entry(mid), "ppid"), root);
    assert_eq!(num(entry(leaf), "ppid"), mid);
    let root_exe = support::fixture("tree_root");
    for (pid, exe, code, leak) in [
        (root, &root_exe, 0, 700001),
        (mid, &mid_exe, 12, 700013),
        (leaf, &leaf_exe, 11, 700027),
    ] {
        let e = entry(pid);
        assert_eq!(support::string(e, "exe"), path_str(exe), "{e}");
        assert_eq!(int(e, "exit_code"), code, "{e}");
        assert_eq!(Counters::of(e), Counters::one_leak(leak), "{e}");
    }
    let totals = Counters::of(field(profile, "totals"));
    assert_eq!(totals.allocations, 3, "{totals:?}");
    assert_eq!(
        totals.allocated_bytes,
        700001 + 700013 + 700027,
        "{totals:?}"
    );
    assert_eq!(
        totals.live_bytes_at_exit,
        700001 + 700013 + 700027,
        "{totals:?}"
    );
    assert_eq!(totals.live_allocations_at_exit, 3, "{totals:?}");
    assert_eq!(totals.frees, 0, "{totals:?}");
}

/// Check that a thread's old tid leaves the tree when the thread execs: the
/// kernel gives it the leader's tid, and a process outside the tree that
/// then gets the old tid (steered there with ns_last_pid) is not recorded.
#[test]
fn track_exec_from_thread_old_tid_untracked() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};

    let dir = tempfile::tempdir().expect("temp dir");
    let profile_path = dir.path().join("profile.json");
    let events_path = dir.path().join("events.jsonl");
    let mut memtrail = Command::new(support::MEMTRAIL)
        .arg("run")
        .arg("--output")
        .arg(&profile_path)
        .arg("--events")
        .arg(&events_path)
        .arg("--")
        .args(cmd(
            "exec_thread",
            &[support::fixture("wait_stdin").as_os_str()],
        ))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn memtrail");
    let mut out = BufReader::new(memtrail.stdout.take().expect("stdout"));
    let mut line = String::new();
    let mut next_number = |prefix: &str| -> u32 {
        line.clear();
        out.read_line(&mut line).expect("read the fixture's output");
        line.strip_prefix(prefix)
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("expected {prefix:?}, got {line:?}"))
    };
    let old_tid = next_number("tid ");
    let leader = next_number("ready ");
    assert_ne!(old_tid, leader);

    // While the exec'd image waits, start processes outside the tree until
    // one gets the old tid (another process may take it first).
    let outsider = support::fixture("malloc_once");
    let got_it = (0..100).any(|_| {
        std::fs::write("/proc/sys/kernel/ns_last_pid", (old_tid - 1).to_string())
            .expect("write ns_last_pid (needs root)");
        let mut child = Command::new(&outsider).spawn().expect("spawn outsider");
        let pid = child.id();
        assert!(child.wait().expect("wait outsider").success());
        pid == old_tid
    });
    assert!(got_it, "no outsider got pid {old_tid}");
    drop(memtrail.stdin.take());
    assert!(memtrail.wait().expect("wait memtrail").success());

    let events = support::read_events(&events_path).expect("events written");
    let outsiders: Vec<&Value> = events
        .iter()
        .filter(|e| {
            num(e, "pid") == u64::from(old_tid) || e.get("size") == Some(&Value::from(900001))
        })
        .collect();
    assert!(outsiders.is_empty(), "events from outside: {outsiders:?}");
    let profile = support::read_profile(&profile_path).expect("profile written");
    let pids: Vec<u64> = processes(&profile).iter().map(|p| num(p, "pid")).collect();
    assert_eq!(pids, [u64::from(leader)], "{profile}");
}
