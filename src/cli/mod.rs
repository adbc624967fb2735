//! The `memtrail` command line: one file per subcommand (`run`, `attach`,
//! `report`, `events`, `bench`, `compare`, `completions`, `man`), every
//! flag in [`flags`], every exit code and the mapper of each subcommand's
//! error to its code in [`exit`]. This file only dispatches.
//!
//! `run` and `attach` share [`capture`] (their flags made into a capture,
//! its outputs put in place), [`status`] (the live status line) and
//! [`summary`]. Output for the user goes through explicit writers (the
//! summary to stderr); diagnostics go through `tracing`.

pub mod attach;
pub mod bench;
pub mod capture;
pub mod compare;
pub mod completions;
pub mod events;
pub mod exit;
pub mod flags;
pub mod man;
pub mod report;
pub mod run;
pub mod status;
pub mod summary;
pub mod values;
pub mod version;

use std::io::{self, Write};

pub use flags::{Cli, Command, SUBCOMMANDS};

use crate::sys::error_chain;

/// Runs the subcommand of a parsed command line; returns memtrail's exit
/// code. A failure is said on stderr (`memtrail: error: ...`) and mapped
/// to its code by [`exit`]; standard output closed early (`| head`) is no
/// failure.
pub fn dispatch(cli: Cli) -> i32 {
    // Unlocked: each write takes the lock for itself. Holding it for the
    // whole run would block every tracing event of the worker threads
    // (issue 11: a held attach, and so a stopped process, until exit).
    let mut stderr = io::stderr();
    match cli.command {
        Command::Run(args) => {
            let result = run::run(args, &mut stderr);
            code_of(result, exit::capture_code, &mut stderr)
        }
        Command::Attach(args) => {
            let result = attach::attach(args, &mut stderr);
            code_of(result, exit::attach_code, &mut stderr)
        }
        Command::Events(args) => {
            let result = match events::events(args, &mut io::stdout().lock()) {
                Err(err) if !err.is_broken_pipe() => Err(err),
                _ => Ok(0),
            };
            code_of(result, exit::events_code, &mut stderr)
        }
        Command::Report(args) => {
            let result = match report::report(args, &mut io::stdout().lock()) {
                // `memtrail report | head`: the reader has all it wanted.
                Err(err) if !err.is_broken_pipe() => Err(err),
                _ => Ok(0),
            };
            code_of(result, exit::report_code, &mut stderr)
        }
        Command::Completions { shell } => exit::written_code(
            completions::completions(shell, &mut io::stdout().lock()),
            "the completion script",
            &mut stderr,
        ),
        Command::Man { page } => exit::written_code(
            man::man(page.as_deref(), &mut io::stdout().lock()),
            "the man page",
            &mut stderr,
        ),
        Command::Bench(args) => {
            let result = bench::bench(args, &mut io::stdout().lock(), &mut stderr);
            code_of(result, exit::bench_code, &mut stderr)
        }
        Command::Compare(args) => {
            let result = compare::compare(args, &mut io::stdout().lock());
            code_of(result, exit::compare_code, &mut stderr)
        }
    }
}

/// The exit code of a subcommand's `result`: its own, or once the error is
/// said on `stderr`, the error's by `code`.
fn code_of<E: std::error::Error>(
    result: Result<i32, E>,
    code: impl FnOnce(&E) -> i32,
    stderr: &mut impl Write,
) -> i32 {
    result.unwrap_or_else(|err| {
        let _ = writeln!(stderr, "memtrail: error: {}", error_chain(&err));
        code(&err)
    })
}
