//! Nothing memtrail loads outlives it, and nothing leaks into the command.
//!
//! While the command (`wait_stdin`) blocks, the test reads memtrail's BPF
//! object ids from `/proc/PID/fdinfo`. Once memtrail has exited (its files
//! are closed before its parent can reap it), none of its links may exist,
//! and any of its programs or maps the kernel still lists must be
//! unreachable: not pinned, held by no process, attached by no link, used by
//! no other program. (The kernel frees a uprobe_multi link's program, and a
//! program's maps, after an RCU grace period: they may linger briefly, but
//! only as garbage.) Ids are never reused soon, so this holds even when other
//! tracers (or other memtrail runs) load programs at the same time.

use std::collections::BTreeSet;
use std::fs;
use std::io;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use crate::support::{self, MEMTRAIL, fixture};

/// The BPF objects a process holds, by id.
#[derive(Debug, Default)]
struct BpfIds {
    progs: BTreeSet<u64>,
    maps: BTreeSet<u64>,
    links: BTreeSet<u64>,
}

/// What each file descriptor of `pid` refers to, by fd number.
fn fd_targets(pid: u32) -> io::Result<Vec<(String, String)>> {
    let mut fds = Vec::new();
    for entry in fs::read_dir(format!("/proc/{pid}/fd"))? {
        let entry = entry?;
        // An fd closed while listing has no link any more.
        if let Ok(target) = fs::read_link(entry.path()) {
            fds.push((
                entry.file_name().to_string_lossy().into_owned(),
                target.to_string_lossy().into_owned(),
            ));
        }
    }
    Ok(fds)
}

/// The BPF objects `pid` holds through its file descriptors.
fn bpf_ids(pid: u32) -> io::Result<BpfIds> {
    let mut ids = BpfIds::default();
    for (fd, target) in fd_targets(pid)? {
        if !target.starts_with("anon_inode:bpf") {
            continue;
        }
        let Ok(info) = fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}")) else {
            continue;
        };
        for line in info.lines() {
            let Some((key, value)) = line.split_once(':') else {
                continue;
            };
            let Ok(id) = value.trim().parse::<u64>() else {
                continue;
            };
            match key {
                "prog_id" => ids.progs.insert(id),
                "map_id" => ids.maps.insert(id),
                "link_id" => ids.links.insert(id),
                _ => false,
            };
        }
    }
    Ok(ids)
}

/// Every loaded BPF object of `kind` (prog, map, link), as bpftool lists it
/// (with pinned paths).
fn loaded(kind: &str) -> Vec<serde_json::Value> {
    let out = Command::new("bpftool")
        .args(["-j", "-f", kind, "show"])
        .output()
        .expect("run bpftool");
    assert!(
        out.status.success(),
        "bpftool {kind} show: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).expect("bpftool JSON");
    list.as_array().expect("bpftool lists an array").clone()
}

/// BPF object ids held through a file descriptor by any process.
fn held_by_any_process() -> BpfIds {
    let mut all = BpfIds::default();
    for entry in fs::read_dir("/proc").expect("list /proc") {
        let Ok(pid) = entry
            .expect("proc entry")
            .file_name()
            .to_string_lossy()
            .parse::<u32>()
        else {
            continue;
        };
        // Processes come and go while we look.
        let Ok(fds) = bpf_ids(pid) else {
            continue;
        };
        all.progs.extend(fds.progs);
        all.maps.extend(fds.maps);
        all.links.extend(fds.links);
    }
    all
}

fn ids_of(list: &[serde_json::Value], key: &str) -> BTreeSet<u64> {
    list.iter()
        .flat_map(|o| match o.get(key) {
            Some(serde_json::Value::Array(a)) => a.iter().filter_map(|v| v.as_u64()).collect(),
            Some(v) => v.as_u64().into_iter().collect(),
            None => Vec::new(),
        })
        .collect()
}

/// Runs `memtrail run -q -- wait_stdin`, calls `during(memtrail_pid,
/// command_pid)` while the command blocks, then ends the command and
/// returns memtrail's pid once it has exited 0.
fn while_running(during: impl FnOnce(u32, u32)) -> u32 {
    let mut child = Command::new(MEMTRAIL)
        // No summary, and so no profile kept in the checkout.
        .args(["run", "-q", "--"])
        .arg(fixture("wait_stdin"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn memtrail");
    let memtrail_pid = child.id();
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("read the command's output");
    let command_pid = line
        .strip_prefix("ready ")
        .and_then(|p| p.trim().parse::<u32>().ok());
    if let Some(command_pid) = command_pid {
        during(memtrail_pid, command_pid);
    }
    // EOF on stdin ends the command (and, if `during` panicked, still
    // reaps memtrail before the panic unwinds further).
    drop(child.stdin.take());
    let output = child.wait_with_output().expect("wait for memtrail");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        command_pid.is_some(),
        "command output {line:?}; stderr:\n{stderr}"
    );
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    memtrail_pid
}

/// Check that no BPF link memtrail held survives it, and no program or map
/// of it stays reachable (pinned, held, attached or used); and that no
/// legacy tracefs uprobe of it is left.
#[test]
fn track_no_bpf_objects_left_behind() {
    let mut held = BpfIds::default();
    let pid =
        while_running(|memtrail_pid, _| held = bpf_ids(memtrail_pid).expect("memtrail's fds"));
    assert!(
        !held.progs.is_empty() && !held.maps.is_empty() && !held.links.is_empty(),
        "memtrail held no BPF objects while tracing: {held:?}"
    );

    let links = loaded("link");
    let left_links: Vec<&serde_json::Value> = links
        .iter()
        .filter(|l| held.links.contains(&support::num(l, "id")))
        .collect();
    assert!(left_links.is_empty(), "links left: {left_links:?}");

    let progs = loaded("prog");
    let maps = loaded("map");
    let holders = held_by_any_process();
    let attached = ids_of(&links, "prog_id");
    for prog in progs
        .iter()
        .filter(|p| held.progs.contains(&support::num(p, "id")))
    {
        let id = support::num(prog, "id");
        assert!(prog.get("pinned").is_none(), "program left pinned: {prog}");
        assert!(!holders.progs.contains(&id), "program left held: {prog}");
        assert!(!attached.contains(&id), "program left attached: {prog}");
    }
    let others: Vec<serde_json::Value> = progs
        .iter()
        .filter(|p| !held.progs.contains(&support::num(p, "id")))
        .cloned()
        .collect();
    let used = ids_of(&others, "map_ids");
    for map in maps
        .iter()
        .filter(|m| held.maps.contains(&support::num(m, "id")))
    {
        let id = support::num(map, "id");
        assert!(map.get("pinned").is_none(), "map left pinned: {map}");
        assert!(!holders.maps.contains(&id), "map left held: {map}");
        assert!(
            !used.contains(&id),
            "map left in use by another program: {map}"
        );
    }

    // libbpf's legacy (tracefs) probes are named libbpf_<pid>_...
    let events = fs::read_to_string("/sys/kernel/tracing/uprobe_events").unwrap_or_default();
    let tag = format!("libbpf_{pid}_");
    let ours: Vec<&str> = events.lines().filter(|l| l.contains(&tag)).collect();
    assert!(ours.is_empty(), "tracefs uprobes left: {ours:?}");
}

/// Check that the command inherits no BPF or perf-event file descriptor
/// from memtrail.
#[test]
fn track_command_inherits_no_bpf_fds() {
    while_running(|_, command_pid| {
        let leaked: Vec<(String, String)> = fd_targets(command_pid)
            .expect("the command's fds")
            .into_iter()
            .filter(|(_, target)| target.contains("bpf") || target.contains("perf_event"))
            .collect();
        assert!(leaked.is_empty(), "the command's fds: {leaked:?}");
    });
}
