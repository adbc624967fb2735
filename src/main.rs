//! `memtrail`: parse flags, run, map errors to exit codes.

use std::io::{self, IsTerminal};
use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches};
use memtrail::internals::cli::{self, Cli};
use tracing_subscriber::EnvFilter;

/// memtrail's own heap is not libc's: its probes on libc's malloc and free
/// are system-wide while a capture runs (and until the kernel has detached
/// them), so every allocation memtrail itself made trapped into them, with
/// a return probe besides; symbolizing a capture's stacks and writing its
/// profile make hundreds of thousands. (The library keeps the embedder's
/// allocator.)
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = match parse() {
        Ok(cli) => cli,
        Err(code) => return ExitCode::from(code),
    };
    init_tracing(&cli);
    let code = cli::dispatch(cli);
    ExitCode::from(code.clamp(0, 255) as u8)
}

/// The command line; else clap's message printed (help and version on
/// stdout, bad usage on stderr) and the exit code that goes with it.
fn parse() -> Result<Cli, u8> {
    let mut command = Cli::command();
    // `memtrail --version` probes the kernel: only when asked.
    let asks_version = std::env::args_os()
        .skip(1)
        .take_while(|a| !cli::SUBCOMMANDS.iter().any(|s| a == s))
        .any(|a| a == "--version");
    if asks_version {
        let long: &'static str = Box::leak(cli::version::long().into_boxed_str());
        command = command.long_version(long);
    }
    command
        .try_get_matches()
        .and_then(|matches| Cli::from_arg_matches(&matches))
        .map_err(|err| {
            let code = if err.use_stderr() {
                cli::exit::USAGE
            } else {
                0
            };
            let _ = err.print();
            code as u8
        })
}

/// Diagnostics to stderr, filtered by MEMTRAIL_LOG, else `--log` (and
/// `--quiet`).
fn init_tracing(cli: &Cli) {
    let filter = EnvFilter::try_from_env("MEMTRAIL_LOG")
        .or_else(|_| EnvFilter::try_new(cli.log_filter()))
        .unwrap_or_else(|_| EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(io::stderr)
        // Colours only for a person at a terminal: never escapes in a file
        // or a pipe (issue 16).
        .with_ansi(io::stderr().is_terminal())
        .with_target(false)
        .init();
}
