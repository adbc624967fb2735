//! The `memtrail` command line: flags, exit codes, user-facing output.
//!
//! Output for the user goes through explicit writers (the summary to
//! stderr); diagnostics go through `tracing`.

pub mod attach;
pub mod bench;
pub mod exit;
pub mod run;
pub mod status;
pub mod summary;
pub mod values;
pub mod version;

use std::ffi::OsString;
use std::io::{self, BufWriter, Write};
use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::cli::run::Options;
use crate::session::SessionOptions;
use values::{parse_duration, parse_size};

use crate::cli::summary::write_summary;
use crate::output::{OutputFile, check_distinct};
use crate::report::{self, Format, Metric, ReportError, ReportOptions};
use crate::{session, session::CaptureError};

const EXIT_CODES_HELP: &str = "\
Exit status:
  memtrail exits with the command's exit status (128+N if signal N killed it),
  unless memtrail itself fails (or SIGTERM or SIGHUP, N, ended it before the
  command started: 128+N). SIGTERM, SIGHUP, SIGUSR1 and SIGUSR2 are passed
  on to the command once it runs.
    2    bad usage (also: two outputs naming the same file)
    65   memtrail report: the profile is not a valid memtrail profile
    66   memtrail report: the profile cannot be read
    70   internal failure
    71   events were lost: the capture is incomplete, no report was written
    72   missing privileges or kernel feature
    73   an output cannot be written, or names an existing file and --force
         was not given (checked before the command starts; a stream output -
         a FIFO or a device - can also fail while written; for memtrail
         report, also standard output, or an output that is the profile it
         reads). The outputs of a capture are put in place together: when
         one cannot be written none appears, and the summary is printed
    74   another tracer holds a conflicting uprobe (ref_ctr_offset mismatch)
    75   an executable image the command loaded could not be examined or probed
         (a file that is no ELF image, or a malformed one, is skipped and
         named in the profile's skipped_images instead)
    76   a pressure pause did not recover within --pressure-timeout (tree killed)
    79   --preload: a tracked process corrupted its preload ring file: the
         profile was written, names the process and marks its counts
         incomplete (the summary says where reading stopped)
    126  the command is not executable, or cannot be reached (a directory on
         its path denies search permission: the message names it)
    127  the command was not found";

const ATTACH_EXIT_CODES_HELP: &str = "\
Exit status:
    0    memtrail detached (at --duration, on SIGINT/SIGTERM/SIGHUP, or when
         the process exited) and wrote its outputs
    2    bad usage
    70   internal failure
    71   events were lost: the capture is incomplete, no report was written
    72   missing privileges or kernel feature
    73   an output cannot be written, or names an existing file and --force
         was not given (when one cannot be written, none appears; the
         summary is printed)
    74   another tracer holds a conflicting uprobe
    75   an executable image the process loaded could not be probed
    77   a pressure pause did not recover within --pressure-timeout: memtrail
         resumed the process and detached (never killed it), no report
    78   no process memtrail can attach to has that PID (none, 0 included, a
         zombie, a kernel thread, a thread of another process, or memtrail
         itself)";

/// `memtrail events` exit codes.
const EVENTS_EXIT_CODES_HELP: &str = "\
Exit status:
    0    the events were written (or standard output was closed early)
    2    bad usage
    65   the file is not a memtrail binary event stream, or is corrupt: a
         checksum that does not match, a malformed record, a file cut short
         (the message names the record and its offset; lines before it may
         have been written to a stream output)
    66   the file cannot be read (also: not a regular file - a FIFO or a
         device is refused, not read)
    73   the output cannot be written, is the event stream itself, or
         names an existing file and --force was not given";

const REPORT_EXIT_CODES_HELP: &str = "\
Exit status:
    0    the report was written (or standard output was closed early)
    2    bad usage (also: --pid or --exe naming no process of the profile,
         --debuginfo-dir not a directory)
    65   the profile is not a valid memtrail profile (not JSON, another format
         or version, a missing or mistyped field; every field must be there,
         null where the schema allows it)
    66   the profile cannot be read (missing, no permission, not a regular
         file - a FIFO or a device is refused, not read - or larger than
         the 1 GiB a profile may have)
    73   the report cannot be written (--output or standard output), or
         would be written over the profile itself (the same file, through a
         symlink or a hard link too), or --output names an existing file and
         --force was not given";

/// Track every heap allocation of a command's whole process tree with eBPF.
#[derive(Debug, Parser)]
#[command(name = "memtrail", version = version::SHORT, after_long_help = EXIT_CODES_HELP)]
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
    #[command(after_long_help = EXIT_CODES_HELP)]
    Run(RunArgs),
    /// Report the allocation sites of a profile written by `memtrail run
    /// --output`: as text, JSON, folded stacks, a flame graph or pprof.
    #[command(after_long_help = REPORT_EXIT_CODES_HELP)]
    Report(ReportArgs),
    /// Attach to a running process and record its allocations (and those of
    /// the processes it forks) until --duration, Ctrl-C or its exit; then
    /// detach, leaving it running.
    #[command(after_long_help = ATTACH_EXIT_CODES_HELP)]
    Attach(AttachArgs),
    /// Convert a binary event stream (`--events FILE.mtev`) to JSON lines,
    /// the same lines `--events FILE.jsonl` would have written.
    #[command(after_long_help = EVENTS_EXIT_CODES_HELP)]
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
    #[command(after_long_help = crate::cli::bench::BENCH_EXIT_HELP)]
    Bench(crate::cli::bench::BenchArgs),
    /// Compare two bench results (or two profiles): per metric the change
    /// and a verdict, and the sites behind each regression.
    #[command(after_long_help = crate::cli::bench::COMPARE_EXIT_HELP)]
    Compare(crate::cli::bench::CompareArgs),
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

/// Writes the completion script for `shell`.
pub fn completions(shell: clap_complete::Shell, out: &mut impl Write) -> io::Result<()> {
    // clap_complete panics on a failed write: generate into memory.
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut cli_command(), "memtrail", &mut script);
    out.write_all(&script)?;
    out.flush()
}

/// Writes the man page of memtrail, or of its subcommand `page`.
pub fn man(page: Option<&str>, out: &mut impl Write) -> io::Result<()> {
    let cmd = cli_command();
    let cmd = match page {
        Some(name) => {
            let sub = cmd
                .find_subcommand(name)
                .cloned()
                .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no such subcommand"))?;
            // Its page is memtrail-NAME(1), as git's and cargo's are.
            let title = match name {
                "run" => "memtrail-run",
                "bench" => "memtrail-bench",
                "compare" => "memtrail-compare",
                "attach" => "memtrail-attach",
                "events" => "memtrail-events",
                _ => "memtrail-report",
            };
            sub.name(title).version(version::SHORT)
        }
        None => cmd,
    };
    clap_mangen::Man::new(cmd).render(out)
}

fn cli_command() -> clap::Command {
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

/// A `--wrapper`, `--focus` or `--hide` pattern.
fn parse_regex(s: &str) -> Result<regex::Regex, String> {
    regex::Regex::new(s).map_err(|e| e.to_string())
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
fn events_format(
    path: Option<&std::path::Path>,
    format: Option<crate::events::writer::EventsFormat>,
) -> crate::events::writer::EventsFormat {
    format.unwrap_or_else(|| {
        path.map(crate::events::writer::EventsFormat::for_path)
            .unwrap_or_default()
    })
}

/// The exit code for a failed `memtrail attach`.
pub fn attach_exit_code(err: &CaptureError) -> i32 {
    match err {
        CaptureError::NoProcess(_)
        | CaptureError::NotAttachable { .. }
        | CaptureError::ThreadOf { .. } => exit::NO_PROCESS,
        CaptureError::Pressure(p) if p.detached() => exit::DETACHED,
        _ => exit_code(err),
    }
}

/// Runs `capture` with a live status line on stderr (elapsed time,
/// processes, events/s, live heap, peak, pauses; redrawn every
/// [`STATUS_EVERY`](crate::cli::status::STATUS_EVERY)) when stderr is a
/// terminal and the run is not quiet; the line is erased before `capture`'s
/// result is returned, so the summary starts on a clean line.
fn with_status<T>(
    quiet: bool,
    capture: impl FnOnce(Option<std::sync::Arc<crate::engine::live::LiveCounters>>) -> T,
) -> T {
    use crate::cli::status::{STATUS_EVERY, StatusLine};
    use crate::engine::live::LiveCounters;
    use std::io::IsTerminal;
    use std::sync::mpsc::{RecvTimeoutError, channel};
    if quiet || !std::io::stderr().is_terminal() {
        return capture(None);
    }
    let live = std::sync::Arc::new(LiveCounters::default());
    let (done, finished) = channel::<()>();
    std::thread::scope(|scope| {
        let counters = live.clone();
        scope.spawn(move || {
            let mut line = StatusLine::new();
            let mut err = std::io::stderr();
            // Drawn at once (start-up takes a while: the verifier), then
            // every STATUS_EVERY until the capture ends.
            let _ = line.draw(&counters, &mut err);
            while finished.recv_timeout(STATUS_EVERY) == Err(RecvTimeoutError::Timeout) {
                let _ = line.draw(&counters, &mut err);
            }
            let _ = StatusLine::clear(&mut err);
        });
        let out = capture(Some(live));
        drop(done);
        out
    })
}

/// What `run` and `attach` make of their shared flags before the capture
/// starts: its options, and what to do once it ended.
struct Prepared {
    opts: Options,
    tail: Tail,
}

/// A capture's end as the user sees it: every output in place (or none),
/// the summary, a text report.
struct Tail {
    /// Where the profile goes (`--output` or a name of its own).
    output: Option<PathBuf>,
    /// `--report` (with `--report-by`).
    report: Option<ReportOptions>,
    /// `--report-output`, opened.
    report_output: Option<OutputFile>,
    quiet: bool,
}

impl Tail {
    /// Puts every output in place, or none; then (unless quiet) `intro`
    /// and the summary, whether the outputs were written or not (issue
    /// 28); then a text report without `--report-output`.
    fn conclude<W: Write>(
        self,
        stderr: &mut W,
        outputs: crate::output::Outputs,
        (profile, slow): (&crate::profile::Profile, &[crate::profile::SlowProbe]),
        intro: impl FnOnce(&mut W),
    ) -> Result<(), CaptureError> {
        // Only text gets here without --report-output (clap requires it
        // otherwise).
        let to_stderr = self.report.clone().filter(|_| self.report_output.is_none());
        let written = commit_outputs(
            outputs,
            profile,
            self.report.as_ref().zip(self.report_output),
        );
        if !self.quiet {
            intro(stderr);
            write_summary_and_where(
                stderr,
                profile,
                slow,
                self.output.as_deref(),
                written.is_ok(),
            );
        }
        if let Some(report) = to_stderr {
            if !self.quiet {
                let _ = writeln!(stderr);
            }
            let _ = report::write_report(profile, &report, stderr);
        }
        written
    }
}

impl CaptureArgs {
    /// Where the profile goes: `--output`, else a name of its own from
    /// `command` (said in the summary), or nowhere with `--quiet` (nothing
    /// would say it).
    fn output(&self, command: impl FnOnce() -> Vec<OsString>) -> Option<PathBuf> {
        match &self.output {
            Some(path) => Some(path.clone()),
            None if self.quiet => None,
            None => Some(default_profile_path(&command(), std::process::id())),
        }
    }

    /// The capture's options, with `--report-output` opened: every output
    /// is checked before anything runs.
    /// `named_after` is the argv whose program names the profile without
    /// `--output`.
    fn prepare(
        self,
        command: Vec<OsString>,
        named_after: impl FnOnce() -> Vec<OsString>,
    ) -> Result<Prepared, CaptureError> {
        let output = self.output(named_after);
        let outputs: Vec<_> = [
            ("--output", &output),
            ("--events", &self.events),
            ("--report-output", &self.report_output),
        ]
        .into_iter()
        .filter_map(|(flag, path)| Some((flag, path.as_deref()?)))
        .collect();
        check_distinct(&outputs)?;
        let report_output = self
            .report_output
            .as_deref()
            .map(|path| {
                let out = OutputFile::create_with(path, self.force)?;
                // Under sudo, the invoking user's, as the command is.
                crate::proctree::invoking_user().map_or(Ok(()), |owner| out.give_to(owner))?;
                Ok::<_, crate::output::OutputError>(out)
            })
            .transpose()?;
        let opts = Options {
            command,
            output,
            events_format: events_format(self.events.as_deref(), self.events_format),
            events: self.events,
            replace_outputs: self.force,
            session: SessionOptions {
                ring_size: self.ring_size,
                stack_ring_size: self.stack_ring_size,
                stack_depth: self.stack_depth,
                python_frames: !self.native_only,
                unwind: self.unwind,
                probes: self.probes,
                event_rings: self.event_rings,
                pressure_timeout: self.pressure_timeout,
                watermark_percent: self.watermark,
                process_effects: false,
                faults: session::Faults::parse(
                    &std::env::var("MEMTRAIL_FAULT").unwrap_or_default(),
                ),
                live: None,
                timeline: !self.no_timeline,
                debuginfo_dirs: self.debuginfo_dirs,
                preload: false,
            },
        };
        let report = self.report.map(|format| ReportOptions {
            format,
            by: self.report_by.unwrap_or_default(),
            top: None,
            shaping: Default::default(),
        });
        Ok(Prepared {
            tail: Tail {
                output: opts.output.clone(),
                report,
                report_output,
                quiet: self.quiet,
            },
            opts,
        })
    }
}

/// Runs `memtrail attach`; returns the exit code.
pub fn attach(args: AttachArgs, stderr: &mut impl Write) -> Result<i32, CaptureError> {
    let pid = args.pid;
    let quiet = args.capture.quiet;
    let Prepared { mut opts, tail } = args.capture.prepare(Vec::new(), || {
        let exe = std::fs::read_link(format!("/proc/{pid}/exe"))
            .map(PathBuf::into_os_string)
            .unwrap_or_default();
        vec![exe]
    })?;
    let mut outcome = with_status(quiet, |live| {
        opts.session.live = live;
        attach::attach(&opts, pid, args.duration, || {
            if !quiet {
                let until = match args.duration {
                    Some(d) => format!("for {d:?} (or until Ctrl-C)"),
                    None => "until Ctrl-C (SIGINT), SIGTERM or its exit".to_owned(),
                };
                let _ = writeln!(stderr, "memtrail: attached to process {pid}, {until}");
            }
        })
    })?;
    let why = match outcome.detach {
        attach::Detach::Duration => "after --duration".to_owned(),
        attach::Detach::Signal(sig) => format!("on {}", signal_name(sig)),
        attach::Detach::Exited => "when it exited".to_owned(),
        attach::Detach::PressureFailed => "after a failed pressure pause".to_owned(),
    };
    let seconds = outcome.profile.duration_ns as f64 / 1e9;
    tail.conclude(
        stderr,
        std::mem::take(&mut outcome.outputs),
        (&outcome.profile, &outcome.slow_probes),
        |stderr| {
            let _ = writeln!(
                stderr,
                "memtrail: attached to process {pid} for {seconds:.3} s; detached {why}"
            );
        },
    )?;
    Ok(0)
}

/// The capture's summary, then where the profile went when it is a file
/// (not a stream) and was written. A closed stderr must not turn a good
/// capture into a failure: what cannot be written is left out.
fn write_summary_and_where(
    stderr: &mut impl Write,
    profile: &crate::profile::Profile,
    slow: &[crate::profile::SlowProbe],
    output: Option<&std::path::Path>,
    written: bool,
) {
    let _ = write_summary(stderr, profile, slow);
    if let Some(path) = output.filter(|p| written && p.as_os_str() != "-" && p.is_file()) {
        let _ = writeln!(
            stderr,
            "memtrail: profile written to {} (memtrail report {0} ranks its allocation sites)",
            path.display()
        );
    }
}

fn signal_name(sig: i32) -> String {
    match sig {
        libc::SIGINT => "SIGINT".into(),
        sig => crate::sys::signals::name(sig),
    }
}

/// Runs `memtrail events`: a binary stream to JSON lines.
pub fn events(
    args: EventsArgs,
    stdout: &mut impl Write,
) -> Result<u64, crate::events::EventsError> {
    use crate::events::EventsError;
    // The reader every command shares: a regular file only (issue 28).
    let input = report::open_input(&args.file).map_err(|source| EventsError::Open {
        path: args.file.clone(),
        source,
    })?;
    let output = args.output.as_deref().unwrap_or(std::path::Path::new("-"));
    crate::output::check_not_input(output, &[("the event stream", &args.file, input.id())])?;
    let input = io::BufReader::with_capacity(1 << 20, input.stream());
    match Some(output).filter(|p| p.as_os_str() != "-") {
        Some(path) => {
            let out = OutputFile::create_with(path, args.force)?;
            let mut w = BufWriter::with_capacity(
                1 << 20,
                out.file().try_clone().map_err(EventsError::Write)?,
            );
            let n = crate::events::to_jsonl(input, &mut w)?;
            drop(w);
            out.commit()?;
            Ok(n)
        }
        None => {
            let mut w = BufWriter::with_capacity(1 << 20, stdout);
            crate::events::to_jsonl(input, &mut w)
        }
    }
}

/// The exit code for a failed `memtrail events`.
pub fn events_exit_code(err: &crate::events::EventsError) -> i32 {
    use crate::events::EventsError;
    match err {
        EventsError::Open { .. } | EventsError::Read(_) => exit::PROFILE_UNREADABLE,
        EventsError::Write(_) | EventsError::Output(_) => exit::OUTPUT,
        EventsError::NotBinary
        | EventsError::Version(_)
        | EventsError::Malformed { .. }
        | EventsError::Corrupt { .. }
        | EventsError::Truncated { .. } => exit::PROFILE_INVALID,
    }
}

/// The exit code for a failed capture.
pub fn exit_code(err: &CaptureError) -> i32 {
    use crate::session::ErrorKind;
    match err.kind() {
        ErrorKind::NotFound => exit::NOT_FOUND,
        ErrorKind::NotExecutable => exit::NOT_EXECUTABLE,
        ErrorKind::Output => exit::OUTPUT,
        ErrorKind::InvalidArgument => exit::USAGE,
        // As if the signal had ended memtrail, which it would have.
        ErrorKind::Interrupted => match err {
            CaptureError::Interrupted(sig) => 128 + sig,
            _ => exit::INTERNAL,
        },
        ErrorKind::Unsupported => exit::UNSUPPORTED,
        ErrorKind::Conflict => exit::CONFLICT,
        ErrorKind::Attach => exit::ATTACH,
        ErrorKind::Lost => exit::LOST,
        ErrorKind::Pressure => exit::PRESSURE,
        ErrorKind::State | ErrorKind::Internal => exit::INTERNAL,
    }
}

/// The exit code for a failed report.
pub fn report_exit_code(err: &ReportError) -> i32 {
    match err {
        ReportError::Read { .. } => exit::PROFILE_UNREADABLE,
        ReportError::Invalid { .. } | ReportError::Format { .. } | ReportError::Version { .. } => {
            exit::PROFILE_INVALID
        }
        ReportError::NoSuchProcess { .. }
        | ReportError::DebuginfoDir { .. }
        | ReportError::Suppressions(_)
        | ReportError::ViewFormat { .. }
        | ReportError::CallsWithoutFocus => exit::USAGE,
        ReportError::Output(_) | ReportError::Stdout(_) => exit::OUTPUT,
    }
}

/// Runs `memtrail report`, writing to `--output` or `stdout`.
pub fn report(args: ReportArgs, stdout: &mut impl Write) -> Result<(), ReportError> {
    // Before the profile: a bad file fails fast.
    let suppressions = report::read_suppressions(&args.suppressions)?;
    let (mut profile, id) = report::load_profile_with_id(&args.profile)?;
    // Never over the profile itself (issue 28), by whatever path.
    let output = args.output.as_deref().unwrap_or(std::path::Path::new("-"));
    crate::output::check_not_input(output, &[("the profile", &args.profile, id)])?;
    let filter = report::StackFilter {
        pids: args.pids,
        exes: args.exes,
    };
    filter.apply(&mut profile, &args.profile)?;
    if let Some(dir) = args.debuginfo_dirs.iter().find(|d| !d.is_dir()) {
        return Err(ReportError::DebuginfoDir { path: dir.clone() });
    }
    let dirs = crate::symbolize::debug_dirs(&args.debuginfo_dirs);
    let found = crate::symbolize::StackSymbolizer::new().resymbolize(&mut profile.stacks, &dirs);
    if found > 0 {
        tracing::info!(frames = found, "symbolized again from debug files");
    }
    let grouping = if args.no_group {
        report::Grouping::none()
    } else {
        report::Grouping::new(args.wrappers)
    };
    let opts = ReportOptions {
        format: args.format,
        by: args.by,
        top: args.top,
        shaping: report::Shaping {
            grouping,
            view: args.view,
            focus: args.focus,
            hide: args.hide,
            suppressions,
        },
    };
    opts.check()?;
    match args.output.filter(|p| p.as_os_str() != "-") {
        Some(path) => {
            let out = OutputFile::create_with(&path, args.force)?;
            report::write_report_file(&profile, &opts, out)?;
        }
        // `-o -` is stdout: a closed pipe is then no failure either.
        None => {
            let mut w = BufWriter::new(stdout);
            report::write_report(&profile, &opts, &mut w)
                .and_then(|()| w.flush())
                .map_err(ReportError::Stdout)?;
        }
    }
    Ok(())
}

/// Runs `memtrail run`; returns the process exit code.
pub fn run(args: RunArgs, stderr: &mut impl Write) -> Result<i32, CaptureError> {
    // Before any output is opened: SIGTERM and the like must not end
    // memtrail halfway (see sys::signals).
    crate::sys::signals::catch()?;
    let quiet = args.capture.quiet;
    let named_after = args.command.clone();
    let Prepared { mut opts, tail } = args.capture.prepare(args.command, || named_after)?;
    opts.session.preload = args.preload;
    let outcome = with_status(quiet, |live| {
        opts.session.live = live;
        run::run(&opts)
    });
    // Even with --quiet: what memtrail did with a signal is not the summary.
    let _ = write_signal_notes(stderr);
    let mut outcome = outcome?;
    tail.conclude(
        stderr,
        std::mem::take(&mut outcome.outputs),
        (&outcome.profile, &outcome.slow_probes),
        |_| {},
    )?;
    // A process that corrupted its preload ring (issue 40): the profile is
    // written, naming it, but its counts are incomplete.
    let code = if !outcome.profile.anomalies.corrupt_rings.is_empty() {
        exit::RING_FAULT
    } else {
        outcome.exit_code
    };
    // memtrail exits next, and its memory goes with it: freeing a large
    // capture's stacks one by one took ~7 ms of python3.11's imports.
    std::mem::forget(outcome);
    Ok(code)
}

/// Writes the --report file into `outputs` and puts them all in place, or
/// none of them.
fn commit_outputs(
    mut outputs: crate::output::Outputs,
    profile: &crate::profile::Profile,
    report: Option<(&ReportOptions, OutputFile)>,
) -> Result<(), CaptureError> {
    if let Some((opts, out)) = report {
        outputs.write(out, |out| report::stage_report(profile, opts, out));
    }
    Ok(outputs.commit()?)
}

/// Where the profile goes without --output: `memtrail.CMD.PID.json` in the
/// working directory, CMD the command's file name (characters other than
/// letters, digits, `-`, `_` and `.` as `_`), PID memtrail's own process id,
/// as heaptrack and memray name theirs.
pub fn default_profile_path(command: &[OsString], pid: u32) -> PathBuf {
    let name = command
        .first()
        .map(std::path::Path::new)
        .and_then(std::path::Path::file_name)
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let name: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect();
    let name = name.trim_start_matches('.');
    let name = if name.is_empty() { "command" } else { name };
    PathBuf::from(format!("memtrail.{name}.{pid}.json"))
}

/// Says what became of SIGTERM, SIGHUP, SIGUSR1 and SIGUSR2 sent to
/// memtrail (SIGTERM or SIGHUP before the command started is the capture's
/// error instead).
fn write_signal_notes(w: &mut impl Write) -> io::Result<()> {
    use crate::sys::signals::{self, Fate};
    for (sig, fate) in signals::notes() {
        let name = signals::name(sig);
        match fate {
            Fate::Sent => writeln!(w, "memtrail: received {name}: passed it on to the command")?,
            Fate::Late => writeln!(
                w,
                "memtrail: received {name} after the command exited: nothing to pass it on to"
            )?,
            // The capture's error says it.
            Fate::Early if matches!(sig, libc::SIGTERM | libc::SIGHUP) => {}
            Fate::Early => writeln!(
                w,
                "memtrail: received {name} before the command started: ignored it"
            )?,
        }
    }
    Ok(())
}

/// Re-export so `main` can use the default.
pub use crate::session::DEFAULT_RING_SIZE;

#[cfg(test)]
mod tests {
    use super::values::parse_size;

    #[test]
    fn sizes_as_people_write_them() {
        for (s, bytes) in [
            ("4096", 4096),
            ("4096B", 4096),
            ("64K", 64 << 10),
            ("64k", 64 << 10),
            ("64KiB", 64 << 10),
            ("64KB", 64 << 10),
            ("64M", 64 << 20),
            ("64MiB", 64 << 20),
            ("64mib", 64 << 20),
            ("64 MiB", 64 << 20),
            ("64MB", 64 << 20),
            ("1G", 1 << 30),
            ("1GiB", 1 << 30),
        ] {
            assert_eq!(parse_size(s), Ok(bytes), "{s}");
        }
        for s in [
            "", "M", "1.5M", "64Mi", "64MBs", "-64M", "64 M B", "48M", "8G", "1K",
        ] {
            assert!(parse_size(s).is_err(), "{s} was accepted");
        }
    }
}
