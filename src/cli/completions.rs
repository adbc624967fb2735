//! `memtrail completions SHELL`: a completion script for the shell.

use std::io::{self, Write};

use super::flags::command;

/// Writes the completion script for `shell`.
pub fn completions(shell: clap_complete::Shell, out: &mut impl Write) -> io::Result<()> {
    // clap_complete panics on a failed write: generate into memory.
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut command(), "memtrail", &mut script);
    out.write_all(&script)?;
    out.flush()
}
