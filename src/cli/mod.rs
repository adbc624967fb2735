//! The `memtrail` command line: flags, exit codes, user-facing output.
//!
//! Output for the user goes through explicit writers (the summary to
//! stderr); diagnostics go through `tracing`.

use std::ffi::OsString;
use std::io::{self, Write};
use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::capture::{self, CaptureError, Options};
use crate::proctree::SpawnError;
use crate::report::write_summary;

/// Exit codes of memtrail's own failures. Otherwise memtrail exits with the
/// command's code (128 + N when a signal N killed it).
pub mod exit {
    /// Bad command-line usage.
    pub const USAGE: i32 = 2;
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
    70   internal failure
    71   events were lost: the capture is incomplete, no report was written
    72   missing privileges or kernel feature
    73   an output file cannot be written (checked before the command starts)
    74   another tracer holds a conflicting uprobe (ref_ctr_offset mismatch)
    126  the command is not executable
    127  the command was not found";

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

    /// Frames of call stack to record per allocation (at most 128); 0
    /// records no stacks. Stacks are walked by frame pointers: code built
    /// without them (-fomit-frame-pointer) gives short stacks.
    #[arg(long, value_name = "FRAMES", default_value_t = crate::capture::DEFAULT_STACK_DEPTH,
          value_parser = clap::value_parser!(u32).range(0..=crate::capture::MAX_STACK_DEPTH as i64))]
    pub stack_depth: u32,

    /// Do not print the summary.
    #[arg(short, long)]
    pub quiet: bool,

    /// The command and its arguments.
    #[arg(required = true, last = true, value_name = "CMD")]
    pub command: Vec<OsString>,
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
        CaptureError::Lost(_) => exit::LOST,
        _ => exit::INTERNAL,
    }
}

/// Runs `memtrail run`; returns the process exit code.
pub fn run(args: RunArgs, stderr: &mut impl Write) -> Result<i32, CaptureError> {
    let opts = Options {
        command: args.command,
        output: args.output,
        events: args.events,
        ring_size: args.ring_size,
        stack_depth: args.stack_depth,
        stall_events: std::env::var("MEMTRAIL_FAULT").is_ok_and(|f| f == "stall-events"),
    };
    let outcome = capture::run(&opts)?;
    if !args.quiet {
        // A closed stderr must not turn a good capture into a failure.
        let _ = write_summary(stderr, &outcome.profile);
    }
    Ok(outcome.exit_code)
}

/// Re-export so `main` can use the default.
pub use capture::DEFAULT_RING_SIZE;
