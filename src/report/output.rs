//! Output files that appear whole or not at all.
//!
//! The temporary file is created next to the destination when the capture
//! starts, so an unwritable path fails before the command runs; it is renamed
//! into place only when the capture succeeded, and removed otherwise.

use std::fs::File;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use tempfile::NamedTempFile;

/// Errors creating or committing an output file.
#[derive(Debug, thiserror::Error)]
#[error("cannot write {}", path.display())]
pub struct OutputError {
    pub path: PathBuf,
    #[source]
    pub source: io::Error,
}

/// A file written under a temporary name and renamed into place.
#[derive(Debug)]
pub struct AtomicOutput {
    tmp: NamedTempFile,
    path: PathBuf,
}

impl AtomicOutput {
    /// Creates the temporary file beside `path`.
    pub fn create(path: &Path) -> Result<Self, OutputError> {
        let err = |source| OutputError {
            path: path.to_owned(),
            source,
        };
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        let name = path.file_name().ok_or_else(|| {
            err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a file name",
            ))
        })?;
        if path.is_dir() {
            return Err(err(io::Error::new(
                io::ErrorKind::IsADirectory,
                "is a directory",
            )));
        }
        let tmp = tempfile::Builder::new()
            .prefix(&format!(".{}.", name.to_string_lossy()))
            .suffix(".tmp")
            // Like any file a program writes (tempfile's default is 0600);
            // the umask still applies.
            .permissions(std::fs::Permissions::from_mode(0o644))
            .tempfile_in(dir)
            .map_err(err)?;
        Ok(Self {
            tmp,
            path: path.to_owned(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The temporary file, to write into.
    pub fn file(&self) -> &File {
        self.tmp.as_file()
    }

    /// Flushes to disk and renames into place.
    pub fn commit(self) -> Result<(), OutputError> {
        let path = self.path;
        let err = |source| OutputError {
            path: path.clone(),
            source,
        };
        self.tmp.as_file().sync_all().map_err(err)?;
        self.tmp.persist(&path).map_err(|e| err(e.error))?;
        Ok(())
    }
}
