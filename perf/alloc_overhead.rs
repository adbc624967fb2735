//! End-to-end cost of a malloc/free pair in a tight C loop, three ways, side
//! by side in one run:
//! - bare: no probes;
//! - floor: empty BPF programs at exactly memtrail's probe sites (what the
//!   kernel's uprobe machinery costs on its own), and the same with empty
//!   programs on memtrail's syscall tracepoints as well (each malloc's
//!   uretprobe returns through a syscall, which then takes the tracing slow
//!   path);
//! - memtrail: the loop under `memtrail run`, without and with stacks.
//!
//! A fourth row probes `free` at its entry (its `test %rdi,%rdi`, which the
//! kernel single-steps) to show what moving the probe past the NULL test
//! saves.
//!
//! This VM's timing drifts by 10-20% from one second to the next, so:
//! - the loop pins itself to CPU 0 and reports the median of its 5000-pair
//!   chunks (an interrupted chunk does not move it);
//! - each round runs every configuration once, back to back, and a ratio is
//!   taken within its round (paired), then summarized over the rounds by
//!   median and quartiles: over all rounds, and over the steady rounds (see
//!   `steady`), which are fewer when the machine switches states often; the
//!   per-configuration median and minimum (the least disturbed run) are
//!   printed too.
//!
//! Run: `cargo bench --bench alloc_overhead` (as root). Target: memtrail
//! within 1.2x of the floor.

use std::hint::black_box;
use std::io::{self, Write};
use std::mem::MaybeUninit;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::Command;

use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use memtrail::internals::attach::{self, AllocPrograms, Links, Role, Site, SitePrograms};
use memtrail::internals::bpf::skel::floor::FloorSkelBuilder;
use memtrail::internals::bpf::skel::memtrail::MemtrailSkelBuilder;

const PAIRS: u64 = 150_000;
const ROUNDS: usize = 41;
/// Pairs a chunk of the loop times (`perf/fixtures/alloc_loop.c`).
const CHUNK: u64 = 5_000;
/// Largest ratio between a round's bare probes for the round to count as
/// steady (see `steady`).
const STEADY_SPREAD: f64 = 1.25;

fn build_loop(dir: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("perf/fixtures/alloc_loop.c");
    let exe = dir.join("alloc_loop");
    let status = Command::new("cc")
        .args(["-O2", "-o"])
        .arg(&exe)
        .arg(&src)
        .status()
        .expect("cc runs");
    assert!(status.success(), "building {}", src.display());
    exe
}

/// Runs `cmd` and parses the loop's ns-per-pair line.
fn ns_per_pair(cmd: &mut Command) -> f64 {
    let out = cmd.output().expect("loop runs");
    assert!(out.status.success(), "{cmd:?} failed: {out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    text.trim().parse().expect("the loop prints ns per pair")
}

/// Prints one round's ns per pair, configuration by configuration, and its
/// bare probes.
fn print_round(round: &[f64], probes: &[f64]) {
    let line: Vec<String> = round.iter().map(|v| format!("{v:.0}")).collect();
    let probes: Vec<String> = probes.iter().map(|v| format!("{v:.1}")).collect();
    let _ = writeln!(
        io::stderr(),
        "round: {}  probes: {}",
        line.join(" "),
        probes.join(" ")
    );
}

/// Whether the bare probes of a round agree: the machine stayed in one
/// state. This VM switches, every few seconds, between states in which the
/// bare loop takes about 6 or about 10 ns a pair (and the floor about 1500
/// or 1950 ns); a ratio across a switch measures the switch.
fn steady(probes: &[f64]) -> bool {
    let min = probes.iter().copied().fold(f64::INFINITY, f64::min);
    let max = probes.iter().copied().fold(0.0, f64::max);
    max <= min * STEADY_SPREAD
}

/// One configuration: runs the loop once, returns its ns per pair.
type Config<'a> = Box<dyn Fn() -> f64 + 'a>;

/// Median and minimum of a configuration's runs.
fn stats(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0])
}

/// First quartile, median and third quartile.
fn quartiles(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    (v[n / 4], v[n / 2], v[(3 * n) / 4])
}

/// "median (q1 q3)" of ratios, a dash for none.
fn ratio_summary(v: &[f64]) -> String {
    if v.is_empty() {
        return "-".to_owned();
    }
    let (q1, med, q3) = quartiles(v.to_vec());
    format!("{med:.2}x ({q1:.2}x {q3:.2}x)")
}

/// The raw syscall tracepoints memtrail's BPF object attaches to, from
/// its programs' sections (`tp_btf/sys_enter`, `tp_btf/sys_exit`).
fn syscall_tracepoints() -> Vec<String> {
    let mut storage = MaybeUninit::uninit();
    let open = MemtrailSkelBuilder::default()
        .open(&mut storage)
        .expect("open memtrail's BPF object");
    open.open_object()
        .progs()
        .filter_map(|p| {
            p.section()
                .to_str()
                .filter(|s| s.starts_with("tp_btf/sys_"))
                .map(str::to_owned)
        })
        .collect()
}

/// Runs the loop while empty programs sit at `sites` and on the syscall
/// tracepoints whose sections `syscalls` names.
fn under_floor(exe: &Path, sites: &[Site], syscalls: &[String]) -> f64 {
    let mut storage = MaybeUninit::uninit();
    let mut open = FloorSkelBuilder::default()
        .open(&mut storage)
        .expect("open floor");
    open.progs
        .floor_session
        .set_autoload(attach::uprobe_sessions());
    let skel = open.load().expect("load floor");
    let fd = |p: &libbpf_rs::ProgramMut<'_>| p.as_fd().try_clone_to_owned().expect("dup prog fd");
    // The set memtrail uses on this kernel.
    let sites_progs = if attach::uprobe_sessions() {
        SitePrograms::Session(fd(&skel.progs.floor_session))
    } else {
        SitePrograms::Split {
            enter: fd(&skel.progs.floor_enter),
            ret: fd(&skel.progs.floor_return),
            free: fd(&skel.progs.floor_enter),
        }
    };
    let progs = AllocPrograms {
        sites: sites_progs,
        marker: fd(&skel.progs.floor_enter),
        shim: None,
    };
    let mut links = Links::default();
    let mut sites = sites.to_vec();
    let mut slots = attach::HitSlots::default();
    attach::attach_sites(&progs, &mut sites, &mut slots, &mut links).expect("attach floor");
    let _tracepoints: Vec<libbpf_rs::Link> =
        [&skel.progs.floor_sys_enter, &skel.progs.floor_sys_exit]
            .into_iter()
            .filter(|p| syscalls.iter().any(|s| p.section().to_str() == Some(s)))
            .map(|p| p.attach().expect("attach the floor's syscall tracepoint"))
            .collect();
    ns_per_pair(Command::new(exe).arg(PAIRS.to_string()))
}

fn main() {
    let dir = tempfile::tempdir().expect("temp dir");
    let exe = build_loop(dir.path());
    let libc = attach::libc_path().expect("libc");
    let sites = attach::find_sites(&libc, &attach::api::libc()).expect("sites");
    // The same sites with free probed at its entry instruction.
    let entry_sites: Vec<Site> = sites
        .iter()
        .map(|s| match s.role {
            Role::Free => Site {
                offset: s.offset - s.skipped,
                skipped: 0,
                emulated: s.skipped == 0 && s.emulated,
                ..s.clone()
            },
            _ => s.clone(),
        })
        .collect();
    let syscalls = syscall_tracepoints();
    assert!(
        !syscalls.is_empty(),
        "memtrail attaches syscall tracepoints"
    );
    let memtrail = env!("CARGO_BIN_EXE_memtrail");
    let run = |args: &[&str]| {
        ns_per_pair(
            Command::new(memtrail)
                .arg("run")
                .args(args)
                .arg("--")
                .arg(&exe)
                .arg(PAIRS.to_string()),
        )
    };

    // Each round runs every configuration once, in this order; ratios are
    // taken within a round (paired), so slow drifts of the machine cancel.
    let bare = || ns_per_pair(Command::new(&exe).arg(PAIRS.to_string()));
    let configs: Vec<(&str, Config<'_>)> = vec![
        ("bare", Box::new(bare)),
        (
            "uprobe floor (memtrail sites)",
            Box::new(|| under_floor(&exe, black_box(&sites), &[])),
        ),
        (
            "floor + syscall tracepoints",
            Box::new(|| under_floor(&exe, black_box(&sites), &syscalls)),
        ),
        (
            "memtrail run --stack-depth 0",
            Box::new(|| run(&["-q", "--stack-depth", "0"])),
        ),
        ("memtrail run (stacks, 127)", Box::new(|| run(&["-q"]))),
        (
            "floor, free probed at entry",
            Box::new(|| under_floor(&exe, black_box(&entry_sites), &[])),
        ),
    ];
    const FLOOR: usize = 1;
    // The second floor and memtrail without stacks, compared below.
    const FLOOR_SYSCALLS: usize = 2;
    const MEMTRAIL: usize = 3;
    // ALLOC_OVERHEAD_ROUNDS=1 prints every round's ns per pair on stderr.
    let verbose = std::env::var_os("ALLOC_OVERHEAD_ROUNDS").is_some();
    let mut ns = vec![Vec::with_capacity(ROUNDS); configs.len()];
    // Within-round ratios to the floor (and memtrail's to the floor with
    // syscall tracepoints, last), of every round and of the steady ones.
    let mut all = vec![Vec::with_capacity(ROUNDS); configs.len() + 1];
    let mut steady_only = vec![Vec::with_capacity(ROUNDS); configs.len() + 1];
    for _ in 0..ROUNDS {
        // A bare run before every configuration and after the last one
        // brackets each run with a probe of the machine's state.
        let mut probes = vec![];
        let mut round = vec![];
        for (_, f) in &configs {
            probes.push(bare());
            round.push(f());
        }
        probes.push(bare());
        if verbose {
            print_round(&round, &probes);
        }
        for (i, &v) in round.iter().enumerate() {
            ns[i].push(v);
        }
        let mut ratios: Vec<f64> = round.iter().map(|v| v / round[FLOOR]).collect();
        ratios.push(round[MEMTRAIL] / round[FLOOR_SYSCALLS]);
        if steady(&probes) {
            for (i, &r) in ratios.iter().enumerate() {
                steady_only[i].push(r);
            }
        }
        for (i, r) in ratios.into_iter().enumerate() {
            all[i].push(r);
        }
    }
    let steady_rounds = steady_only[FLOOR].len();

    let mut w = io::stdout().lock();
    let _ = writeln!(
        w,
        "malloc/free pair, {ROUNDS} rounds of {PAIRS} pairs (each run: the median of its {CHUNK}-pair chunks); \
         ratios to the floor within each round, median (quartiles) over all rounds and over the {steady_rounds} steady ones"
    );
    let _ = writeln!(
        w,
        "  {:<30} {:>10} {:>10}   {:<24} x floor, steady rounds",
        "configuration", "ns median", "ns min", "x floor, all rounds"
    );
    for (i, (name, _)) in configs.iter().enumerate() {
        let (med, min) = stats(ns[i].clone());
        let _ = writeln!(
            w,
            "  {name:<30} {med:10.1} {min:10.1}   {:<24} {}",
            ratio_summary(&all[i]),
            ratio_summary(&steady_only[i])
        );
    }
    let last = configs.len();
    let _ = writeln!(
        w,
        "  {} against {}: {}, steady rounds {}",
        configs[MEMTRAIL].0,
        configs[FLOOR_SYSCALLS].0,
        ratio_summary(&all[last]),
        ratio_summary(&steady_only[last])
    );
}
