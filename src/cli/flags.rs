//! Every flag of the command line, defined once: the clap structs of each
//! subcommand (`run` and `attach` share [`CaptureArgs`]) and the defaults
//! that follow from other flags (a format from `--output`'s extension).

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use clap::{Parser, Subcommand};

use super::exit;
use super::values::{check_size, check_timeout, parse_duration, parse_regex, parse_size};
use crate::bench::format::BenchFormat;
use crate::compare::{self, FlameMetric};
use crate::report::{self, Format, Metric};

/// Track every heap allocation of a command's whole process tree with eBPF.
#[derive(Debug, Parser)]
#[command(name = "memtrail", version = super::version::SHORT, after_long_help = exit::RUN_HELP)]
pub struct Cli {
    /// Diagnostics to show: error, warn, info, debug or trace (also
    /// MEMTRAIL_LOG, which takes tracing filter directives) [default: warn;
    /// with --quiet, warn but for notes about the capture, which the profile
    /// or the summary records].
    #[arg(long, global = true, value_name = "LEVEL")]
    pub log: Option<String>,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a command and record the allocations of its whole process tree.
    #[command(after_long_help = exit::RUN_HELP)]
    Run(RunArgs),
    /// Report the allocation sites of a profile written by `memtrail run
    /// --output`: as text, JSON, folded stacks, a flame graph or pprof.
    #[command(after_long_help = exit::REPORT_HELP)]
    Report(ReportArgs),
    /// Attach to a running process and record its allocations (and those of
    /// the processes it forks) until --duration, Ctrl-C or its exit; then
    /// detach, leaving it running.
    #[command(after_long_help = exit::ATTACH_HELP)]
    Attach(AttachArgs),
    /// Convert a binary event stream (`--events FILE.mtev`) to JSON lines,
    /// the same lines `--events FILE.jsonl` would have written.
    #[command(after_long_help = exit::EVENTS_HELP)]
    Events(EventsArgs),
    /// Print a completion script for SHELL on stdout (e.g. `memtrail
    /// completions bash > /etc/bash_completion.d/memtrail`).
    Completions {
        /// The shell: bash, zsh, fish, elvish or powershell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print memtrail's man page (roff) on stdout, or a subcommand's (e.g.
    /// `memtrail man run > /usr/local/share/man/man1/memtrail-run.1`).
    Man {
        /// The subcommand whose page to print: run, report, attach, events,
        /// bench or compare.
        #[arg(value_name = "SUBCOMMAND",
              value_parser = ["run", "report", "attach", "events", "bench", "compare"])]
        page: Option<String>,
    },
    /// Run benchmarks under full captures and record their memory metrics
    /// (docs/bench.md).
    #[command(after_long_help = exit::BENCH_HELP)]
    Bench(BenchArgs),
    /// Compare two bench results (or two profiles): per metric the change
    /// and a verdict, and the sites behind each regression.
    #[command(after_long_help = exit::COMPARE_HELP)]
    Compare(CompareArgs),
}

impl Cli {
    /// Whether the command runs with `--quiet` (run, attach, bench).
    pub fn quiet(&self) -> bool {
        match &self.command {
            Command::Run(args) => args.capture.quiet,
            Command::Attach(args) => args.capture.quiet,
            Command::Bench(args) => args.quiet,
            _ => false,
        }
    }

    /// The diagnostics filter: `--log`, else warnings; with `--quiet`
    /// (and no `--log`), warnings but not the notes about the capture
    /// ([`NOTE`](crate::profile::NOTE)). MEMTRAIL_LOG, when set, comes
    /// before either (main).
    pub fn log_filter(&self) -> String {
        match (&self.log, self.quiet()) {
            (Some(level), _) => level.clone(),
            (None, false) => "warn".to_owned(),
            (None, true) => format!("warn,{}=error", crate::profile::NOTE),
        }
    }
}

/// The names of [`Command`]'s subcommands, as typed.
pub const SUBCOMMANDS: &[&str] = &[
    "run",
    "report",
    "attach",
    "events",
    "bench",
    "compare",
    "completions",
    "man",
    "help",
];

/// The command line's definition, as clap builds it.
pub fn command() -> clap::Command {
    <Cli as clap::CommandFactory>::command()
}

/// The flags `memtrail run` and `memtrail attach` share.
#[derive(Debug, clap::Args)]
pub struct CaptureArgs {
    /// Write the profile (JSON, schema in docs/profile.md) to PATH. A new
    /// regular file appears whole, only when the capture succeeded (an
    /// existing one is refused unless --force, and then its symlink's
    /// target is replaced, not the link); `-` (stdout), a FIFO (with a
    /// reader) or a character device is written as a stream; anything else
    /// is refused before the capture starts. Without --output the profile
    /// goes to `memtrail.CMD.PID.json` in the working directory (CMD the
    /// command's file name, or for `attach` the process's executable's,
    /// PID memtrail's), which the summary names; with --quiet and no
    /// --output no profile is kept.
    #[arg(short, long, value_name = "PATH")]
    pub output: Option<PathBuf>,

    /// Replace files that --output, --events or --report-output name.
    /// Without it, an existing regular file there is refused (exit 73)
    /// before the capture starts, and so is one that appears while the
    /// command runs; streams (`-`, FIFOs, character devices) are written
    /// either way.
    #[arg(short, long)]
    pub force: bool,

    /// Stream every event to PATH, one JSON object a line. PATH is written
    /// like --output's (a FIFO or `-` gets the events as they come); no two
    /// outputs may name the same file.
    #[arg(long, value_name = "PATH")]
    pub events: Option<PathBuf>,

    /// How --events writes: `jsonl` (one JSON object a line) or `binary`
    /// (zstd-compressed records of a few bytes each, docs/events.md; read
    /// it back with `memtrail events`). Default: binary when PATH ends in
    /// `.mtev`, JSON lines otherwise.
    #[arg(long, value_enum, value_name = "FORMAT", requires = "events")]
    pub events_format: Option<crate::events::writer::EventsFormat>,

    /// Size of the events ring buffer: a power of two, in bytes or with a
    /// binary unit (`64M`, `64MiB`, `512K`, `1G`; `MB` means MiB too).
    /// Larger rings absorb longer bursts. With `--event-rings per-cpu`,
    /// the size of all of them: each online CPU's is the largest power of
    /// two at most its share, and at least a page.
    #[arg(long, value_name = "BYTES", default_value = "64M", value_parser = parse_size)]
    pub ring_size: usize,

    /// Size of the stack ring buffer: a power of two, in bytes or with a
    /// binary unit (as --ring-size). Each new distinct stack takes about
    /// 1 KiB until it is read.
    #[arg(long, value_name = "BYTES", default_value = "16M", value_parser = parse_size)]
    pub stack_ring_size: usize,

    /// What to do when a ring fills past the watermark. `0` (default): no
    /// pausing; lost events are detected and fail the capture (exit 71). A
    /// duration (`250ms`, `2s`, `1m`; units ns, us, ms, s, m) from 1ms to a
    /// day: pause the tree until the rings drain; the duration is the
    /// longest the tree may stay paused, from the latch to the resume, and
    /// if memtrail cannot resume it by then (a slow pipeline, or a machine
    /// too loaded for memtrail's threads), it kills the tree and fails
    /// (exit 76); a nonzero duration below 1ms is rejected, never rounded to
    /// 0. `inf`: pause as long as draining takes. With the cgroup freezer
    /// (root), rings need room for the freeze to land: 1 MiB rings at the
    /// default watermark on two CPUs. `memtrail attach` pauses the process
    /// with SIGSTOP (it is never moved into a cgroup of memtrail's), and an
    /// episode longer than a finite timeout resumes it and detaches (exit
    /// 77): memtrail never kills a process it attached to.
    #[arg(
        long,
        value_name = "TIMEOUT",
        default_value = "0",
        env = "MEMTRAIL_PRESSURE_TIMEOUT",
        allow_hyphen_values = true
    )]
    pub pressure_timeout: crate::pressure::PressureTimeout,

    /// Fill of a ring, in percent of its size, past which the tree is
    /// paused (with --pressure-timeout other than 0).
    #[arg(long, value_name = "PERCENT", default_value_t = 75,
          value_parser = clap::value_parser!(u8).range(1..=99))]
    pub watermark: u8,

    /// Frames of call stack to record per allocation (at most 128); 0
    /// records no stacks.
    #[arg(long, value_name = "FRAMES", default_value_t = crate::session::DEFAULT_STACK_DEPTH,
          value_parser = clap::value_parser!(u32).range(0..=crate::session::MAX_STACK_DEPTH as i64))]
    pub stack_depth: u32,

    /// Also look for debug files by build id in DIR/.build-id/xx/rest.debug
    /// (repeatable; /usr/lib/debug is always looked in, and an image's
    /// .gnu_debuglink followed): frames of stripped images get functions
    /// and source lines from them.
    #[arg(long = "debuginfo-dir", value_name = "DIR")]
    pub debuginfo_dirs: Vec<PathBuf>,

    /// How stacks are walked: `auto` unwinds from each image's unwind
    /// tables (.eh_frame, compiled once per image and cached by build id)
    /// and takes frame-pointer steps where an image has none; `dwarf` uses
    /// tables only (a frame without one ends the stack); `fp` follows frame
    /// pointers only (code built without them gives short stacks).
    #[arg(long, value_name = "HOW", value_enum, default_value_t = crate::profile::unwind::Mode::Auto)]
    pub unwind: crate::profile::unwind::Mode,

    /// Where allocator probes go: `per-process` puts breakpoints only in
    /// the tracked processes, so the rest of the host runs its allocator
    /// untouched (each new process is held stopped at fork until its own
    /// are made: ~1.3 ms more a process, and a parent waiting with
    /// WUNTRACED, a job-control shell, sees that stop; Linux 6.13);
    /// `system-wide` puts them in every process that maps a probed library,
    /// so other processes trap on each allocator call while memtrail runs;
    /// `auto` is system-wide for `run` and, for `attach`, per-process where
    /// the kernel can.
    #[arg(long, value_name = "WHERE", value_enum, default_value_t = crate::attach::per_process::Probes::Auto)]
    pub probes: crate::attach::per_process::Probes,

    /// Events rings: `per-cpu` gives each CPU a ring of its own (no lock
    /// shared between CPUs when threads allocate at once; records are
    /// merged back in time order; `--ring-size` is split between them),
    /// `shared` one ring all CPUs reserve from; `auto` is per-cpu from 4
    /// CPUs.
    #[arg(long, value_name = "HOW", value_enum, env = "MEMTRAIL_EVENT_RINGS", default_value_t = crate::ring::merge::EventRings::Auto)]
    pub event_rings: crate::ring::merge::EventRings,

    /// Keep no timeline (the heap over time) in the profile: `memtrail
    /// report --format timeline` then draws an empty chart and the text
    /// report has no sparkline. For the leanest capture (what the timeline
    /// costs is measured in perf/RESULTS.md, perf/timeline_cost.sh).
    #[arg(long)]
    pub no_timeline: bool,

    /// Stacks through a Python interpreter (CPython 3.11 to 3.13) show the
    /// interpreter's own native frames (`_PyEval_EvalFrameDefault`), not
    /// the Python functions they ran (`qualname at file.py:LINE`).
    #[arg(long)]
    pub native_only: bool,

    /// Print no summary, no status line and no notes about the capture
    /// (an image without unwind tables, USDT markers skipped: the profile
    /// or the summary records them). Errors, warnings about memtrail's own
    /// environment and what memtrail did with a signal are still printed;
    /// --log (or MEMTRAIL_LOG) shows the notes again.
    #[arg(short, long)]
    pub quiet: bool,

    /// After a successful capture, also write a report of the allocation
    /// sites in FORMAT, as `memtrail report --format FORMAT` would from the
    /// profile. Every format but text needs --report-output; a text report
    /// without --report-output goes to stderr after the summary (even with
    /// --quiet), never to stdout, which is the command's.
    #[arg(long, value_enum, value_name = "FORMAT")]
    pub report: Option<Format>,

    /// Write the --report report to PATH. Like --output, it is checked before
    /// the capture starts, and a file appears only when the capture
    /// succeeded.
    #[arg(
        long,
        value_name = "PATH",
        requires = "report",
        required_if_eq_any = [
            ("report", "json"),
            ("report", "flamegraph"),
            ("report", "pprof"),
            ("report", "folded"),
        ]
    )]
    pub report_output: Option<PathBuf>,

    /// Rank the --report sites by METRIC, as `memtrail report --by` [default:
    /// bytes].
    #[arg(long, value_enum, value_name = "METRIC", requires = "report")]
    pub report_by: Option<Metric>,
}

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub capture: CaptureArgs,

    /// Hand allocator calls to memtrail from inside the command's
    /// processes: a shim put first in LD_PRELOAD interposes malloc, free
    /// and the rest of glibc's allocator API and records each call from
    /// inside the process: into a ring of memtrail's shared memory, its
    /// stack walked with libunwind (no kernel entry), or where it cannot
    /// (no libunwind, another --unwind, a Python process's frames) through
    /// a hook the kernel enters by a syscall, one entry a call where the
    /// default probes take three a malloc/free pair. A process that does not load the shim (a
    /// static binary, a set-user-ID program, an environment cleared, a user
    /// who cannot open memtrail's /proc/PID/fd) keeps the probes. In a
    /// process with the shim libc's allocator is not probed (a call of it
    /// through a handle, dlsym on libc or __libc_malloc, is not seen);
    /// other allocators keep their probes. Probes are per process (Linux
    /// 6.13). Whether it is cheaper
    /// depends on the kernel and machine (perf/RESULTS.md): see the
    /// README, "When to pick --preload".
    #[arg(long, env = "MEMTRAIL_PRELOAD", value_parser = clap::builder::FalseyValueParser::new())]
    pub preload: bool,

    /// The command and its arguments. memtrail's own flags come before it;
    /// everything from the command's name on is the command's, so `--` is
    /// only needed when the command's name starts with `-`.
    #[arg(required = true, trailing_var_arg = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

#[derive(Debug, clap::Args)]
pub struct ReportArgs {
    /// The profile to report on, as written by `memtrail run --output`.
    #[arg(value_name = "PROFILE.json")]
    pub profile: PathBuf,

    /// The report format. Formats are documented in docs/reports.md.
    #[arg(short, long, value_enum, value_name = "FORMAT", default_value_t = Format::Text)]
    pub format: Format,

    /// Rank allocation sites by METRIC, highest first. A flame graph or
    /// folded stacks show this metric; pprof has every metric and makes
    /// this one its default sample type. Sites whose value is 0 are left
    /// out, except from pprof.
    #[arg(long, value_enum, value_name = "METRIC", default_value_t = Metric::Bytes)]
    pub by: Metric,

    /// Keep only the N sites that rank highest; 0 keeps all. Default: 10
    /// for text, all sites for the other formats.
    #[arg(short = 'n', long, value_name = "N")]
    pub top: Option<usize>,

    /// Write the report to PATH instead of stdout (`-`). A regular file
    /// appears whole, only when the report was written (an existing one is
    /// refused unless --force, and then a symlink's target is replaced, not
    /// the link); a FIFO or a character device is written as a stream.
    #[arg(short, long, value_name = "PATH")]
    pub output: Option<PathBuf>,

    /// Replace the file --output names, as `memtrail run --force` does.
    /// Without it, an existing regular file there is refused (exit 73);
    /// streams (`-`, FIFOs, character devices) are written either way.
    #[arg(long)]
    pub force: bool,

    /// Report only the stacks of process PID (repeatable; with --exe, a
    /// stack of either is kept). Totals stay the whole tree's. A pid the
    /// profile does not list is an error.
    #[arg(long = "pid", value_name = "PID")]
    pub pids: Vec<u32>,

    /// Report only the stacks of processes running EXE: its path as the
    /// profile's `processes` list it, or its file name (repeatable).
    #[arg(long = "exe", value_name = "EXE")]
    pub exes: Vec<String>,

    /// Symbolize again, from DIR/.build-id/xx/rest.debug (the layout of
    /// debuginfod's cache and of -dbgsym packages), the frames that have
    /// no source line but a build id: debug symbols installed after the
    /// capture (repeatable; /usr/lib/debug is always looked in).
    #[arg(long = "debuginfo-dir", value_name = "DIR")]
    pub debuginfo_dirs: Vec<PathBuf>,

    /// What a text or JSON report lists: allocation sites (grouped by
    /// caller unless --no-group), functions with their self and inclusive
    /// values, or the callers and callees of the functions --focus
    /// matches. Other formats show sites.
    #[arg(long, value_enum, value_name = "VIEW", default_value_t = report::View::Sites)]
    pub view: report::View,

    /// Also treat functions matching REGEX as allocator wrappers
    /// (repeatable; matched anywhere in the demangled name). A site is
    /// named by its stack's first frame outside the wrappers, so every
    /// stack through `xmalloc` from one function is one site. Built in:
    /// the allocator functions, xmalloc/xcalloc/xrealloc/xstrdup,
    /// g_malloc*/g_new*, sqlite3Malloc*/sqlite3Realloc*, PyMem_*,
    /// PyObject_Malloc*, C++'s operator new (single and array) and the
    /// standard allocators' allocate, and Rust's __rust_alloc
    /// (docs/reports.md lists them).
    #[arg(long = "wrapper", value_name = "REGEX", value_parser = parse_regex)]
    pub wrappers: Vec<regex::Regex>,

    /// Sites are whole stacks, not grouped by their caller outside
    /// allocator wrappers (stacks that show the same frames still merge).
    #[arg(long, conflicts_with = "wrappers")]
    pub no_group: bool,

    /// With --view calls: the functions whose callers and callees are
    /// listed. Otherwise: report only the stacks with a frame whose
    /// function matches REGEX (pprof's -focus), in every format.
    #[arg(long, value_name = "REGEX", value_parser = parse_regex)]
    pub focus: Option<regex::Regex>,

    /// Drop the frames whose function matches REGEX from every stack
    /// (repeatable; pprof's -hide), in every format, before grouping: e.g.
    /// `--hide '^std.'` attributes to the code that called the C++
    /// library.
    #[arg(long, value_name = "REGEX", value_parser = parse_regex)]
    pub hide: Vec<regex::Regex>,

    /// Read leak suppressions from FILE: a `leak:PATTERN` a line (LSan's
    /// and heaptrack's format; `#` starts a comment). A stack with a frame
    /// whose function, module or source file contains PATTERN (`*` any
    /// characters, `^` and `$` anchor it) is not counted as a leak: its
    /// blocks are shown apart, as suppressed. Known runtime pools (such
    /// as libstdc++'s emergency exception pool) are always shown apart,
    /// as "still reachable at exit: runtime" (repeatable). A regular file
    /// of at most 1 MiB; at most 10,000 patterns in all, each of at most
    /// 1,024 bytes.
    #[arg(long = "suppressions", value_name = "FILE")]
    pub suppressions: Vec<PathBuf>,
}

#[derive(Debug, clap::Args)]
pub struct AttachArgs {
    /// The process to attach to. Its threads are tracked from now on, and
    /// so is every process it forks from now on; blocks it allocated before
    /// are unknown (their frees count as unmatched frees).
    #[arg(value_name = "PID")]
    pub pid: u32,

    /// Detach after this long, from 1ms to a day (`30s`, `500ms`, `2m`;
    /// units ns, us, ms, s, m: `5` alone is refused). Without it memtrail
    /// stays attached until SIGINT (Ctrl-C), SIGTERM or SIGHUP, or until
    /// the process exits.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub duration: Option<std::time::Duration>,

    #[command(flatten)]
    pub capture: CaptureArgs,
}

#[derive(Debug, clap::Args)]
pub struct EventsArgs {
    /// A binary event stream, as `--events FILE.mtev` wrote it.
    #[arg(value_name = "FILE.mtev")]
    pub file: PathBuf,

    /// Write the JSON lines to PATH instead of stdout (`-`). A regular file
    /// appears whole once every line was written; an existing one is
    /// refused unless --force.
    #[arg(short, long, value_name = "PATH")]
    pub output: Option<PathBuf>,

    /// Replace the file --output names, as `memtrail run --force` does
    /// (without it, an existing regular file is refused: exit 73).
    #[arg(long)]
    pub force: bool,
}

/// The format of `--events PATH` given `--events-format`.
pub fn events_format(
    path: Option<&std::path::Path>,
    format: Option<crate::events::writer::EventsFormat>,
) -> crate::events::writer::EventsFormat {
    format.unwrap_or_else(|| {
        path.map(crate::events::writer::EventsFormat::for_path)
            .unwrap_or_default()
    })
}

#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// Run the benchmarks of a TOML suite file (name, command, cwd, env,
    /// runs: docs/bench.md) instead of one command.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["name", "command"])]
    pub suite: Option<PathBuf>,

    /// Run nothing: render the results document RESULTS.json (e.g.
    /// target/memtrail/new/results.json) in --format (a regular file of at
    /// most 1 GiB).
    #[arg(long, value_name = "RESULTS.json",
          conflicts_with_all = ["suite", "name", "command", "runs", "save_baseline", "baseline"])]
    pub from: Option<PathBuf>,

    /// The name of the command-line benchmark [default: the program's file
    /// name].
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,

    /// Runs of each benchmark (overrides the suite's). With more than one,
    /// the spread of each metric is reported and a benchmark whose metrics
    /// differ between runs is flagged non-deterministic, with the sites that
    /// differed. [default: the suite's, else 1]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub runs: Option<u32>,

    /// Format of the results on stdout or --output: text, json (the results
    /// document, docs/bench.md), markdown, bmf (Bencher Metric Format), gab
    /// (github-action-benchmark customSmallerIsBetter). [default: from
    /// --output's extension: `.json` the results document, `.md` Markdown;
    /// else text]
    #[arg(short, long, value_enum, value_name = "FORMAT")]
    pub format: Option<BenchFormat>,

    /// Write the results in --format to PATH instead of stdout (a file
    /// appears whole once every benchmark ran; PATH may not be a file the
    /// bench reads). The JSON results document is also always saved as
    /// DIR/new/results.json (or DIR/NAME/ with --save-baseline), with the
    /// profiles it names; written to PATH, it keeps a copy of its profiles
    /// beside it, in STEM.profiles/ (A.profiles/ for A.json), so that it
    /// compares fully whatever later benches replace.
    #[arg(short, long, value_name = "PATH")]
    pub output: Option<PathBuf>,

    /// Replace the file --output names, as `memtrail run --force` does
    /// (and, for a JSON document, its STEM.profiles/). Without it, an
    /// existing regular file (or profiles directory) there is refused
    /// (exit 73) before any benchmark runs.
    #[arg(long)]
    pub force: bool,

    /// Save the results and profiles as baseline NAME (DIR/NAME/) instead of
    /// DIR/new/.
    #[arg(long, value_name = "NAME")]
    pub save_baseline: Option<String>,

    /// Compare the results with the saved baseline NAME, as `memtrail
    /// compare` would (the comparison goes to stderr); exit 1 if a metric
    /// regressed.
    #[arg(long, value_name = "NAME")]
    pub baseline: Option<String>,

    /// With --baseline: how much a metric may grow, as in `memtrail
    /// compare --threshold` [default: 0, exact].
    #[arg(long = "threshold", value_name = "LIMITS", value_parser = compare::check_threshold,
          requires = "baseline")]
    pub thresholds: Vec<String>,

    /// Where results and baselines are kept [default: $CARGO_TARGET_DIR/memtrail,
    /// else target/memtrail].
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,

    /// Passed on to every capture, as `memtrail run --pressure-timeout`.
    #[arg(long, value_name = "TIMEOUT", env = "MEMTRAIL_PRESSURE_TIMEOUT",
          allow_hyphen_values = true, value_parser = check_timeout)]
    pub pressure_timeout: Option<String>,

    /// Passed on to every capture, as `memtrail run --ring-size`.
    #[arg(long, value_name = "BYTES", value_parser = check_size)]
    pub ring_size: Option<String>,

    /// Passed on to every capture, as `memtrail run --stack-ring-size`.
    #[arg(long, value_name = "BYTES", value_parser = check_size)]
    pub stack_ring_size: Option<String>,

    /// Passed on to every capture, as `memtrail run --watermark`.
    #[arg(long, value_name = "PERCENT", value_parser = clap::value_parser!(u8).range(1..=99))]
    pub watermark: Option<u8>,

    /// Passed on to every capture, as `memtrail run --stack-depth` (0 leaves
    /// no sites for compare to name).
    #[arg(long, value_name = "FRAMES",
          value_parser = clap::value_parser!(u32).range(0..=crate::session::MAX_STACK_DEPTH as i64))]
    pub stack_depth: Option<u32>,

    /// No progress on stderr.
    #[arg(short, long)]
    pub quiet: bool,

    /// The benchmark command and its arguments (without --suite).
    #[arg(last = true, value_name = "CMD", required_unless_present_any = ["suite", "from"])]
    pub command: Vec<String>,
}

/// `memtrail compare` output formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum CompareFormat {
    /// For a terminal.
    Text,
    /// For a pull-request comment.
    Markdown,
    /// The comparison as a JSON document (docs/bench.md).
    Json,
    /// A differential flame graph (SVG) of one benchmark's two profiles.
    Flamegraph,
}

#[derive(Debug, clap::Args)]
pub struct CompareArgs {
    /// The base: bench results (results.json) or a profile.
    #[arg(value_name = "BASE")]
    pub base: PathBuf,

    /// The new results or profile. A profile is a benchmark named
    /// `profile`, so it compares with another profile.
    #[arg(value_name = "NEW")]
    pub new: PathBuf,

    /// How much a metric may grow before it regresses: `1%` for every
    /// metric, `peak=0.5%,allocations=0` per metric (a percentage of the
    /// base, an absolute count or bytes, or `inf`: never a regression), or
    /// both (`1%,leaked=0`). Repeatable; each metric's limit (and the one
    /// for every metric) may be given once. Judged metrics, smaller is
    /// better: allocations, allocated_bytes (bytes), peak_live_bytes (peak),
    /// leaked_bytes (leaked), leaked_blocks (blocks), mmap_peak_bytes
    /// (mmap). Shown, never judged (no limit but `inf`): frees, and
    /// temporary_allocations (temporary), whose changes follow from the
    /// others' (a leak fixed adds frees). [default: 0, exact]
    #[arg(long = "threshold", value_name = "LIMITS", value_parser = compare::check_threshold)]
    pub thresholds: Vec<String>,

    /// Report format: text, markdown, json or flamegraph. [default: from
    /// --output's extension: `.json` JSON, `.md` Markdown, `.svg` a flame
    /// graph; else text]
    #[arg(short, long, value_enum, value_name = "FORMAT")]
    pub format: Option<CompareFormat>,

    /// With --format flamegraph: the benchmark to draw (needed when the
    /// inputs have more than one).
    #[arg(long, value_name = "NAME")]
    pub bench: Option<String>,

    /// With --format flamegraph: what the graph is sized by.
    #[arg(long, value_enum, value_name = "METRIC", default_value_t = FlameMetric::Bytes)]
    pub by: FlameMetric,

    /// Allocation sites named per regressed benchmark (0: none).
    #[arg(long, value_name = "N", default_value_t = compare::DEFAULT_SITES)]
    pub sites: usize,

    /// Write the report to PATH instead of stdout (a file appears whole;
    /// PATH may not be BASE or NEW; an existing file is refused unless
    /// --force).
    #[arg(short, long, value_name = "PATH")]
    pub output: Option<PathBuf>,

    /// Replace the file --output names, as `memtrail run --force` does
    /// (without it, an existing regular file is refused: exit 73).
    #[arg(long)]
    pub force: bool,
}

/// The extension of `path`, lower case.
fn extension(path: Option<&Path>) -> Option<String> {
    path.and_then(Path::extension)
        .map(|e| e.to_string_lossy().to_ascii_lowercase())
}

/// The format of `bench` results: `--format`, else by --output's
/// extension, as `--events` picks by `.mtev` (issue 26: `-o results.json`
/// wrote a text table).
pub fn bench_format(format: Option<BenchFormat>, output: Option<&Path>) -> BenchFormat {
    format.unwrap_or_else(|| match extension(output).as_deref() {
        Some("json") => BenchFormat::Json,
        Some("md" | "markdown") => BenchFormat::Markdown,
        _ => BenchFormat::Text,
    })
}

/// The format of a comparison: `--format`, else by --output's extension.
pub fn compare_format(format: Option<CompareFormat>, output: Option<&Path>) -> CompareFormat {
    format.unwrap_or_else(|| match extension(output).as_deref() {
        Some("json") => CompareFormat::Json,
        Some("md" | "markdown") => CompareFormat::Markdown,
        Some("svg") => CompareFormat::Flamegraph,
        _ => CompareFormat::Text,
    })
}
