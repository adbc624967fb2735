//! `memtrail`: parse flags, run, map errors to exit codes.

use std::io::{self, IsTerminal, Write};
use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches};
use memtrail::internals::cli::bench;
use memtrail::internals::cli::{self, Cli, Command};
use memtrail::internals::sys::error_chain;
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
    let parsed = command
        .try_get_matches()
        .and_then(|matches| Cli::from_arg_matches(&matches));
    let cli = match parsed {
        Ok(cli) => cli,
        Err(err) => {
            let code = if err.use_stderr() {
                cli::exit::USAGE
            } else {
                0
            };
            let _ = err.print();
            return ExitCode::from(code as u8);
        }
    };
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
    // Unlocked: each write takes the lock for itself. Holding it for the
    // whole run would block every tracing event of the worker threads
    // (issue 11: a held attach, and so a stopped process, until exit).
    let mut stderr = io::stderr();
    let code = match cli.command {
        Command::Run(args) => match cli::run(args, &mut stderr) {
            Ok(code) => code,
            Err(err) => {
                let _ = writeln!(stderr, "memtrail: error: {}", error_chain(&err));
                cli::exit_code(&err)
            }
        },
        Command::Attach(args) => match cli::attach(args, &mut stderr) {
            Ok(code) => code,
            Err(err) => {
                let _ = writeln!(stderr, "memtrail: error: {}", error_chain(&err));
                cli::attach_exit_code(&err)
            }
        },
        Command::Events(args) => match cli::events(args, &mut io::stdout().lock()) {
            Ok(_) => 0,
            Err(err) if err.is_broken_pipe() => 0,
            Err(err) => {
                let _ = writeln!(stderr, "memtrail: error: {}", error_chain(&err));
                cli::events_exit_code(&err)
            }
        },
        Command::Report(args) => match cli::report(args, &mut io::stdout().lock()) {
            Ok(()) => 0,
            // `memtrail report | head`: the reader has all it wanted.
            Err(err) if err.is_broken_pipe() => 0,
            Err(err) => {
                let _ = writeln!(stderr, "memtrail: error: {}", error_chain(&err));
                cli::report_exit_code(&err)
            }
        },
        Command::Completions { shell } => written(
            cli::completions(shell, &mut io::stdout().lock()),
            "the completion script",
            &mut stderr,
        ),
        Command::Man { page } => written(
            cli::man(page.as_deref(), &mut io::stdout().lock()),
            "the man page",
            &mut stderr,
        ),
        Command::Bench(args) => {
            let mut stdout = io::stdout().lock();
            match bench::bench(args, &mut stdout, &mut stderr) {
                Ok(code) => code,
                Err(err) => {
                    let _ = writeln!(stderr, "memtrail: error: {}", error_chain(&err));
                    bench::bench_exit_code(&err)
                }
            }
        }
        Command::Compare(args) => match bench::compare(args, &mut io::stdout().lock()) {
            Ok(code) => code,
            Err(err) => {
                let _ = writeln!(stderr, "memtrail: error: {}", error_chain(&err));
                bench::compare_exit_code(&err)
            }
        },
    };
    ExitCode::from(code.clamp(0, 255) as u8)
}

/// The exit code of writing `what` to stdout: 0 also when the reader
/// closed it early (`| head`), 73 when it could not be written.
fn written(result: io::Result<()>, what: &str, stderr: &mut impl Write) -> i32 {
    match result {
        Ok(()) => 0,
        Err(err) if err.kind() == io::ErrorKind::BrokenPipe => 0,
        Err(err) => {
            let _ = writeln!(stderr, "memtrail: error: writing {what}: {err}");
            cli::exit::OUTPUT
        }
    }
}
