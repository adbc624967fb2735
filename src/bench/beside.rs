//! The profiles of a results document written with `--output`, kept
//! beside it (issue 41: `bench -o A.json` then `bench -o B.json` left A's
//! results naming profiles the second bench replaced, and `compare A.json
//! B.json` named no function).
//!
//! `bench -o DIR/A.json` (the JSON results document) also writes
//! `DIR/A.profiles/`: a copy of every run's profile (a hard link where the
//! file system allows), under the same relative paths as in the results
//! directory (`BENCH/run-K.json`), and the document's `profile_dir` names
//! it. Each `-o` document thus owns its profiles: two of them always
//! compare fully, and a later bench replaces only its own `DIR/new/`. A
//! reader that does not find them under `profile_dir` (the two moved
//! elsewhere together) looks in `A.profiles/` next to the document
//! ([`super::results::Results::profile_paths`]).
//!
//! The directory is made whole in `DIR/.A.profiles.tmp-PID/` and renamed
//! into place just before the document is committed; an existing one is
//! replaced only with `--force`, as the document is.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use super::BenchError;
use super::results::{Results, profiles_dir};

/// Refuses to replace `doc`'s profiles directory without `force`, before
/// any benchmark runs: the output file itself is checked by its
/// [`crate::output::OutputFile`].
pub fn check(doc: &Path, force: bool) -> Result<(), BenchError> {
    let dir = profiles_dir(doc);
    match fs::symlink_metadata(&dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Ok(m) if force && m.is_dir() => Ok(()),
        Ok(m) if m.is_dir() => Err(BenchError::Io {
            what: "will not replace (without --force) the profiles directory",
            path: dir,
            source: io::Error::from(io::ErrorKind::AlreadyExists),
        }),
        Ok(_) => Err(BenchError::Io {
            what: "cannot keep the profiles in",
            path: dir,
            source: io::Error::other("not a directory"),
        }),
        Err(source) => Err(BenchError::Io {
            what: "cannot keep the profiles in",
            path: dir,
            source,
        }),
    }
}

/// The profiles of `results`, copied for `doc`: [`Beside::commit`] puts
/// them in place; dropped before, they are removed.
pub struct Beside {
    work: PathBuf,
    dir: PathBuf,
    /// `results`, its `profile_dir` the kept directory's.
    pub results: Results,
}

/// Copies every profile `results` names into a temporary directory next
/// to `doc`.
pub fn stage(results: &Results, doc: &Path) -> Result<Beside, BenchError> {
    let doc = std::path::absolute(doc).unwrap_or_else(|_| doc.to_owned());
    let dir = profiles_dir(&doc);
    let name = dir.file_name().unwrap_or_default().to_string_lossy();
    let work = dir.with_file_name(format!(".{name}.tmp-{}", std::process::id()));
    let _ = fs::remove_dir_all(&work);
    let staged = copy_all(results, &work);
    if staged.is_err() {
        let _ = fs::remove_dir_all(&work);
    }
    staged?;
    let mut kept = results.clone();
    kept.profile_dir.clone_from(&dir);
    Ok(Beside {
        work,
        dir,
        results: kept,
    })
}

fn copy_all(results: &Results, work: &Path) -> Result<(), BenchError> {
    let io_err = |what, path: &Path| {
        let path = path.to_owned();
        move |source| BenchError::Io { what, path, source }
    };
    fs::create_dir(work).map_err(io_err("cannot create", work))?;
    for rel in results.benchmarks.iter().flat_map(|b| &b.profiles) {
        // Names a bench wrote (BENCH/run-K.json): never absolute, no `..`.
        if rel
            .components()
            .any(|c| !matches!(c, std::path::Component::Normal(_)))
        {
            return Err(BenchError::Io {
                what: "cannot keep the profile",
                path: rel.clone(),
                source: io::Error::other("not a path under the results directory"),
            });
        }
        let (from, to) = (results.profile_dir.join(rel), work.join(rel));
        if let Some(parent) = to.parent() {
            fs::create_dir_all(parent).map_err(io_err("cannot create", parent))?;
        }
        if fs::hard_link(&from, &to).is_err() {
            fs::copy(&from, &to).map_err(io_err("cannot copy the profile", &from))?;
        }
    }
    Ok(())
}

impl Beside {
    /// Puts the profiles in place (replacing the directory there).
    pub fn commit(&self) -> Result<(), BenchError> {
        super::replace_dir(&self.work, &self.dir)
    }
}

impl Drop for Beside {
    /// Removes the staged copies when they were not put in place (the
    /// document was not written): nothing half-made is left.
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.work);
    }
}
