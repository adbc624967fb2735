//! The `memtrail` command line: flags, exit codes, user-facing output.
//!
//! Output for the user goes through explicit writers (the summary to
//! stderr); diagnostics go through `tracing`.

use std::ffi::OsString;
use std::io::{self, BufWriter, Write};
use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::capture::{self, CaptureError, Options};
use crate::proctree::SpawnError;
use crate::render::{self, Format, Metric, ReportError, ReportOptions};
use crate::report::{AtomicOutput, write_summary};

/// Exit codes of memtrail's own failures. Otherwise memtrail exits with the
/// command's code (128 + N when a signal N killed it).
pub mod exit {
    /// Bad command-line usage.
    pub const USAGE: i32 = 2;
    /// `memtrail report`: the profile is not a valid memtrail profile.
    pub const PROFILE_INVALID: i32 = 65;
    /// `memtrail report`: the profile cannot be read.
    pub const PROFILE_UNREADABLE: i32 = 66;
    /// memtrail itself failed.
    pub const INTERNAL: i32 = 70;
    /// Events were lost: the capture is incomplete and no report was written.
    pub const LOST: i32 = 71;
    /// Missing privileges or kernel feature.
    pub const UNSUPPORTED: i32 = 72;
    /// An output path cannot be written.
    pub const OUTPUT: i32 = 73;
    /// Another tracer's uprobe conflicts with ours.
    pub const CONFLICT: i32 = 74;
    /// An image the command loaded could not be examined or probed.
    pub const ATTACH: i32 = 75;
    /// A pressure pause did not recover within --pressure-timeout.
    pub const PRESSURE: i32 = 76;
    /// The command is not executable.
    pub const NOT_EXECUTABLE: i32 = 126;
    /// The command was not found.
    pub const NOT_FOUND: i32 = 127;
}

const EXIT_CODES_HELP: &str = "\
Exit status:
  memtrail exits with the command's exit status (128+N if signal N killed it),
  unless memtrail itself fails:
    2    bad usage
    65   memtrail report: the profile is not a valid memtrail profile
    66   memtrail report: the profile cannot be read
    70   internal failure
    71   events were lost: the capture is incomplete, no report was written
    72   missing privileges or kernel feature
    73   an output file cannot be written (checked before the command starts;
         for memtrail report, also standard output)
    74   another tracer holds a conflicting uprobe (ref_ctr_offset mismatch)
    75   an executable image the command loaded could not be examined or probed
    76   a pressure pause did not recover within --pressure-timeout (tree killed)
    126  the command is not executable
    127  the command was not found";

const REPORT_EXIT_CODES_HELP: &str = "\
Exit status:
    0    the report was written (or standard output was closed early)
    2    bad usage
    65   the profile is not a valid memtrail profile (not JSON, another format
         or version, a missing or mistyped field)
    66   the profile cannot be read (missing, not a file, no permission)
    73   the report cannot be written (--output or standard output)";

/// Track every heap allocation of a command's whole process tree with eBPF.
#[derive(Debug, Parser)]
#[command(name = "memtrail", version, after_long_help = EXIT_CODES_HELP)]
pub struct Cli {
    /// Diagnostics to show: error, warn, info, debug or trace (also
    /// MEMTRAIL_LOG, which takes tracing filter directives).
    #[arg(long, global = true, default_value = "warn", value_name = "LEVEL")]
    pub log: String,

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
}

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Write the profile (JSON, schema in docs/profile.md) to PATH. The file
    /// appears only when the capture succeeded.
    #[arg(short, long, value_name = "PATH")]
    pub output: Option<PathBuf>,

    /// Stream every event to PATH, one JSON object a line.
    #[arg(long, value_name = "PATH")]
    pub events: Option<PathBuf>,

    /// Size of the events ring buffer in bytes (a power of two; K, M and G
    /// suffixes accepted). Larger rings absorb longer bursts.
    #[arg(long, value_name = "BYTES", default_value = "64M", value_parser = parse_size)]
    pub ring_size: usize,

    /// Size of the stack ring buffer in bytes (a power of two; K, M and G
    /// suffixes accepted). Each new distinct stack takes about 1 KiB until
    /// it is read.
    #[arg(long, value_name = "BYTES", default_value = "16M", value_parser = parse_size)]
    pub stack_ring_size: usize,

    /// What to do when a ring fills past the watermark. `0` (default): no
    /// pausing; lost events are detected and fail the capture (exit 71). A
    /// duration (`250ms`, `2s`, `1m`): pause the tree until the rings drain,
    /// and if an episode takes longer, kill the tree and fail (exit 76).
    /// `inf`: pause as long as draining takes.
    #[arg(
        long,
        value_name = "TIMEOUT",
        default_value = "0",
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
    #[arg(long, value_name = "FRAMES", default_value_t = crate::capture::DEFAULT_STACK_DEPTH,
          value_parser = clap::value_parser!(u32).range(0..=crate::capture::MAX_STACK_DEPTH as i64))]
    pub stack_depth: u32,

    /// How stacks are walked: `auto` unwinds from each image's unwind
    /// tables (.eh_frame, compiled once per image and cached by build id)
    /// and takes frame-pointer steps where an image has none; `dwarf` uses
    /// tables only (a frame without one ends the stack); `fp` follows frame
    /// pointers only (code built without them gives short stacks).
    #[arg(long, value_name = "HOW", value_enum, default_value_t = crate::unwind::Mode::Auto)]
    pub unwind: crate::unwind::Mode,

    /// Do not print the summary.
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
    /// the command starts and appears only when the capture succeeded.
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

    /// The command and its arguments.
    #[arg(required = true, last = true, value_name = "CMD")]
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

    /// Write the report to PATH instead of stdout. The file appears whole,
    /// only when the report was written.
    #[arg(short, long, value_name = "PATH")]
    pub output: Option<PathBuf>,
}

/// Parses `4096`, `64K`, `64M`, `1G`.
pub fn parse_size(s: &str) -> Result<usize, String> {
    let (digits, mult) = match s.char_indices().last() {
        Some((i, 'k' | 'K')) => (&s[..i], 1usize << 10),
        Some((i, 'm' | 'M')) => (&s[..i], 1 << 20),
        Some((i, 'g' | 'G')) => (&s[..i], 1 << 30),
        _ => (s, 1),
    };
    let n: usize = digits
        .parse()
        .map_err(|_| format!("`{s}` is not a size (e.g. 4096, 256K, 64M)"))?;
    let bytes = n
        .checked_mul(mult)
        .filter(|b| *b <= u32::MAX as usize)
        .ok_or_else(|| format!("`{s}` is too large"))?;
    if !bytes.is_power_of_two() || bytes < rustix::param::page_size() {
        return Err(format!(
            "`{s}` must be a power of two of at least the page size ({} bytes)",
            rustix::param::page_size()
        ));
    }
    Ok(bytes)
}

/// The exit code for a failed capture.
pub fn exit_code(err: &CaptureError) -> i32 {
    match err {
        CaptureError::Spawn(SpawnError::NotFound(_)) => exit::NOT_FOUND,
        CaptureError::Spawn(SpawnError::NotExecutable(_)) => exit::NOT_EXECUTABLE,
        CaptureError::Spawn(SpawnError::Exec { source, .. }) => match source {
            crate::sys::ExecFailure::Exec(e) if e.kind() == io::ErrorKind::NotFound => {
                exit::NOT_FOUND
            }
            crate::sys::ExecFailure::Exec(_) => exit::NOT_EXECUTABLE,
            _ => exit::INTERNAL,
        },
        CaptureError::Output(_) | CaptureError::EventStream(_) => exit::OUTPUT,
        CaptureError::Privileges(_)
        | CaptureError::KernelFeature { .. }
        | CaptureError::Load(_) => exit::UNSUPPORTED,
        CaptureError::Attach(crate::attach::AttachError::Conflict { .. }) => exit::CONFLICT,
        CaptureError::Attach(_) | CaptureError::AttachTracepoint { .. } => exit::UNSUPPORTED,
        CaptureError::AttachImage {
            source: crate::attach::AttachError::Conflict { .. },
            ..
        } => exit::CONFLICT,
        CaptureError::AttachImage { .. } => exit::ATTACH,
        CaptureError::Lost(_) => exit::LOST,
        CaptureError::Pressure(_) => exit::PRESSURE,
        _ => exit::INTERNAL,
    }
}

/// The exit code for a failed report.
pub fn report_exit_code(err: &ReportError) -> i32 {
    match err {
        ReportError::Read { .. } => exit::PROFILE_UNREADABLE,
        ReportError::Invalid { .. } | ReportError::Format { .. } | ReportError::Version { .. } => {
            exit::PROFILE_INVALID
        }
        ReportError::Output(_) | ReportError::Stdout(_) => exit::OUTPUT,
    }
}

/// Runs `memtrail report`, writing to `--output` or `stdout`.
pub fn report(args: ReportArgs, stdout: &mut impl Write) -> Result<(), ReportError> {
    let profile = render::load_profile(&args.profile)?;
    let opts = ReportOptions {
        format: args.format,
        by: args.by,
        top: args.top,
    };
    match args.output {
        Some(path) => render::write_report_file(&profile, &opts, AtomicOutput::create(&path)?)?,
        None => {
            let mut w = BufWriter::new(stdout);
            render::write_report(&profile, &opts, &mut w)
                .and_then(|()| w.flush())
                .map_err(ReportError::Stdout)?;
        }
    }
    Ok(())
}

/// Runs `memtrail run`; returns the process exit code.
pub fn run(args: RunArgs, stderr: &mut impl Write) -> Result<i32, CaptureError> {
    let opts = Options {
        command: args.command,
        output: args.output,
        events: args.events,
        ring_size: args.ring_size,
        stack_depth: args.stack_depth,
        unwind: args.unwind,
        stack_ring_size: args.stack_ring_size,
        pressure_timeout: args.pressure_timeout,
        watermark_percent: args.watermark,
        faults: capture::Faults::parse(&std::env::var("MEMTRAIL_FAULT").unwrap_or_default()),
    };
    // Like --output, --report-output fails before the command runs.
    let report_output = args
        .report_output
        .as_deref()
        .map(AtomicOutput::create)
        .transpose()?;
    let outcome = capture::run(&opts)?;
    if !args.quiet {
        // A closed stderr must not turn a good capture into a failure.
        let _ = write_summary(stderr, &outcome.profile);
    }
    if let Some(format) = args.report {
        let report = ReportOptions {
            format,
            by: args.report_by.unwrap_or_default(),
            top: None,
        };
        match report_output {
            Some(out) => render::write_report_file(&outcome.profile, &report, out)?,
            // Only text gets here (clap requires --report-output otherwise).
            None => {
                if !args.quiet {
                    let _ = writeln!(stderr);
                }
                let _ = render::write_report(&outcome.profile, &report, stderr);
            }
        }
    }
    Ok(outcome.exit_code)
}

/// Re-export so `main` can use the default.
pub use capture::DEFAULT_RING_SIZE;
