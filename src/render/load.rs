//! Reading a profile file for `memtrail report`.
//!
//! The `format` and `version` fields are checked before the document is
//! read as a profile, so a file of another kind or version gets an error
//! that says so rather than a complaint about a missing field.

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

/// Reads and checks the profile at `path`.
pub fn load_profile(path: &Path) -> Result<Profile, ReportError> {
    let bytes = std::fs::read(path).map_err(|source| ReportError::Read {
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
