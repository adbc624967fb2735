//! Benchmark suites: the TOML file `memtrail bench --suite` reads, or the
//! single benchmark of a command line.
//!
//! ```toml
//! runs = 1                        # default for every benchmark
//! [[bench]]
//! name = "parse"
//! command = ["./build/parse", "input.txt"]
//! cwd = "fixtures"                # relative to the suite file
//! env = { LC_ALL = "C" }
//! runs = 3
//! ```
//!
//! Unknown keys are errors (a typo must not silently drop a setting).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::BenchError;

/// One benchmark to run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Benchmark {
    pub name: String,
    /// The program and its arguments (no shell).
    pub command: Vec<String>,
    /// Absolute working directory.
    pub cwd: PathBuf,
    /// Added to memtrail's environment.
    pub env: BTreeMap<String, String>,
    pub runs: u32,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SuiteFile {
    runs: Option<u32>,
    #[serde(default)]
    bench: Vec<BenchEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BenchEntry {
    name: String,
    command: Vec<String>,
    cwd: Option<PathBuf>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    runs: Option<u32>,
}

/// Reads the suite at `path`. `runs`, when given, overrides every
/// benchmark's.
pub fn load(path: &Path, runs: Option<u32>) -> Result<Vec<Benchmark>, BenchError> {
    let text = crate::report::read_text(path, crate::report::MAX_SUITE_BYTES, "a suite").map_err(
        |source| BenchError::SuiteRead {
            path: path.to_owned(),
            source,
        },
    )?;
    let invalid = |msg: String| BenchError::SuiteInvalid {
        path: path.to_owned(),
        msg,
    };
    let file: SuiteFile = toml::from_str(&text).map_err(|e| invalid(e.message().to_owned()))?;
    if file.bench.is_empty() {
        return Err(invalid("no [[bench]] entry".to_owned()));
    }
    let base = std::path::absolute(path)
        .ok()
        .and_then(|p| p.parent().map(Path::to_owned))
        .unwrap_or_default();
    let mut out: Vec<Benchmark> = Vec::with_capacity(file.bench.len());
    for b in file.bench {
        check_name(&b.name).map_err(invalid)?;
        if out.iter().any(|o| o.name == b.name) {
            return Err(invalid(format!("two benchmarks are named `{}`", b.name)));
        }
        if b.command.is_empty() {
            return Err(invalid(format!(
                "benchmark `{}` has an empty command",
                b.name
            )));
        }
        let runs = runs.or(b.runs).or(file.runs).unwrap_or(1);
        if runs == 0 {
            return Err(invalid(format!(
                "benchmark `{}`: runs must be at least 1",
                b.name
            )));
        }
        let bench = Benchmark {
            name: b.name,
            command: b.command,
            cwd: base.join(b.cwd.unwrap_or_default()),
            env: b.env,
            runs,
        };
        bench.check().map_err(invalid)?;
        out.push(bench);
    }
    Ok(out)
}

impl Benchmark {
    /// Refuses what no process could be started with, before anything
    /// runs (issue 26: these were internal failures, exit 70, once the
    /// bench reached them): a working directory that is missing or not a
    /// directory, a NUL byte in the command or the environment, an
    /// environment variable whose name is empty or has a `=`.
    pub fn check(&self) -> Result<(), String> {
        let name = &self.name;
        match std::fs::metadata(&self.cwd) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(format!(
                    "benchmark `{name}`: its working directory {} is not a directory",
                    self.cwd.display()
                ));
            }
            Err(e) => {
                return Err(format!(
                    "benchmark `{name}`: its working directory {} cannot be used: {e}",
                    self.cwd.display()
                ));
            }
        }
        if let Some(i) = self.command.iter().position(|a| a.contains('\0')) {
            return Err(format!(
                "benchmark `{name}`: its command has a NUL byte (in argument {i})"
            ));
        }
        for (key, value) in &self.env {
            if key.is_empty() || key.contains(['=', '\0']) {
                return Err(format!(
                    "benchmark `{name}`: `{}` cannot name an environment variable (empty, or \
                     with `=` or a NUL byte)",
                    key.escape_debug()
                ));
            }
            if value.contains('\0') {
                return Err(format!(
                    "benchmark `{name}`: environment variable {key} has a NUL byte"
                ));
            }
        }
        Ok(())
    }
}

/// A benchmark name: it becomes a directory name under the results
/// directory, so letters, digits, `-`, `_` and `.` only, not `.` or `..`.
pub fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name != "."
        && name != ".."
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "benchmark name `{name}`: use letters, digits, `-`, `_` and `.` only"
        ))
    }
}

/// The name a command-line benchmark gets without `--name`: the program's
/// file name, made a valid name.
pub fn default_name(command: &[String]) -> String {
    let prog = command
        .first()
        .map(|p| p.rsplit('/').next().unwrap_or(p))
        .unwrap_or("bench");
    let name: String = prog
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if check_name(&name).is_ok() {
        name
    } else {
        "bench".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(check_name("parse-1.0_x").is_ok());
        for bad in ["", ".", "..", "a/b", "a b"] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
        assert_eq!(default_name(&["/usr/bin/true".into()]), "true");
        assert_eq!(default_name(&["./a b".into()]), "a_b");
        assert_eq!(default_name(&["..".into()]), "bench");
    }
}
