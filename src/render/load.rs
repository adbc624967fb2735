//! Reading a profile file for `memtrail report`.
//!
//! Only a regular file of at most [`MAX_PROFILE_BYTES`] is read: a device
//! (`/dev/zero`) or a FIFO is refused before any read (a FIFO is opened
//! without waiting for a writer), and a larger file before it fills memory.
//!
//! The `format` and `version` fields are checked before the document is
//! read as a profile, so a file of another kind or version gets an error
//! that says so rather than a complaint about a missing field. Every field
//! of the profile must then be present (`null` where the schema allows it).

use std::fs::{self, File};
use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use super::ReportError;
use crate::report::{PROFILE_FORMAT, PROFILE_VERSION, Profile};

/// The fields that say what a document is.
#[derive(Deserialize)]
#[serde(expecting = "a memtrail profile (a JSON object)")]
struct Header {
    format: Option<Value>,
    version: Option<Value>,
}

/// The largest profile `memtrail report` reads: 1 GiB, far above what a
/// capture writes (a profile with 100,000 distinct stacks of 30 frames is
/// about 500 MiB).
pub const MAX_PROFILE_BYTES: u64 = 1 << 30;

/// What a file that is not a regular file is, for messages.
fn kind_of(ft: fs::FileType) -> &'static str {
    if ft.is_fifo() {
        "a FIFO"
    } else if ft.is_char_device() {
        "a character device"
    } else if ft.is_block_device() {
        "a block device"
    } else if ft.is_socket() {
        "a socket"
    } else {
        "not a file"
    }
}

/// Reads the whole file at `path` if it is a regular file of at most
/// [`MAX_PROFILE_BYTES`].
fn read_capped(path: &Path) -> io::Result<Vec<u8>> {
    let file = File::options()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let meta = file.metadata()?;
    if meta.is_dir() {
        return Err(io::Error::from_raw_os_error(libc::EISDIR));
    }
    if !meta.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("not a regular file ({})", kind_of(meta.file_type())),
        ));
    }
    let too_large = || {
        io::Error::new(
            io::ErrorKind::FileTooLarge,
            format!(
                "larger than the {} GiB a profile may have",
                MAX_PROFILE_BYTES >> 30
            ),
        )
    };
    if meta.len() > MAX_PROFILE_BYTES {
        return Err(too_large());
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    // The file may grow while it is read.
    file.take(MAX_PROFILE_BYTES + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_PROFILE_BYTES {
        return Err(too_large());
    }
    Ok(bytes)
}

/// Reads and checks the profile at `path`.
pub fn load_profile(path: &Path) -> Result<Profile, ReportError> {
    let bytes = read_capped(path).map_err(|source| ReportError::Read {
        path: path.to_owned(),
        source,
    })?;
    let invalid = |source| ReportError::Invalid {
        path: path.to_owned(),
        source,
    };
    let header: Header = serde_json::from_slice(&bytes).map_err(invalid)?;
    let shown = |v: Option<Value>| v.map_or_else(|| "missing".to_owned(), |v| v.to_string());
    if header.format.as_ref().and_then(Value::as_str) != Some(PROFILE_FORMAT) {
        return Err(ReportError::Format {
            path: path.to_owned(),
            found: shown(header.format),
        });
    }
    if header.version.as_ref().and_then(Value::as_u64) != Some(u64::from(PROFILE_VERSION)) {
        return Err(ReportError::Version {
            path: path.to_owned(),
            found: shown(header.version),
        });
    }
    serde_json::from_slice(&bytes).map_err(invalid)
}
