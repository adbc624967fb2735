//! The event stream: one JSON object a line (format in docs/profile.md), or
//! the compact binary stream of [`crate::events`] (docs/events.md).
//!
//! JSON lines are formatted by hand on the poller thread: serde's generic
//! machinery is not needed for flat records of integers.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::Path;

use super::Encoder;
use super::json::write_json;
use crate::bpf::record::{Kind, Record};

use crate::output::OutputFile;

/// How `--events` writes its stream.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EventsFormat {
    /// One JSON object a line (~107 bytes an event).
    #[default]
    Jsonl,
    /// zstd-compressed length-prefixed binary records (docs/events.md);
    /// `memtrail events FILE` turns it into JSON lines.
    Binary,
}

impl EventsFormat {
    /// The format `path` asks for by its extension: `.mtev` is binary,
    /// anything else JSON lines.
    pub fn for_path(path: &Path) -> Self {
        if path.extension().is_some_and(|e| e == "mtev") {
            Self::Binary
        } else {
            Self::Jsonl
        }
    }
}

enum Out {
    Json(BufWriter<File>),
    Binary {
        zstd: zstd::stream::write::Encoder<'static, BufWriter<File>>,
        encoder: Encoder,
    },
}

/// Writes records into an [`OutputFile`], as JSON lines or binary.
pub struct EventWriter {
    out: Out,
    file: OutputFile,
}

impl EventWriter {
    pub fn new(file: OutputFile, format: EventsFormat) -> io::Result<Self> {
        let buf = BufWriter::with_capacity(1 << 20, file.file().try_clone()?);
        let out = match format {
            EventsFormat::Jsonl => Out::Json(buf),
            EventsFormat::Binary => Out::Binary {
                zstd: super::compressor(buf)?,
                encoder: Encoder::default(),
            },
        };
        Ok(Self { out, file })
    }

    /// Writes one record (the internal realloc opening is not written).
    pub fn write(&mut self, rec: &Record<'_>) -> io::Result<()> {
        if rec.hdr.kind == Kind::ReallocBegin {
            return Ok(());
        }
        match &mut self.out {
            Out::Json(w) => write_json(w, rec),
            Out::Binary { zstd, encoder } => encoder.encode(rec, zstd),
        }
    }

    /// Flushes (ends the zstd frame): the stream is then written, its file
    /// not yet in place (see [`crate::output::Outputs`]).
    pub fn finish(self) -> Result<OutputFile, crate::output::OutputError> {
        let fail = |source| crate::output::OutputError {
            path: self.file.path().to_owned(),
            source,
        };
        let mut buf = match self.out {
            Out::Json(buf) => buf,
            Out::Binary { zstd, .. } => zstd.finish().map_err(fail)?,
        };
        buf.flush().map_err(fail)?;
        drop(buf);
        Ok(self.file)
    }

    /// The path the stream goes to.
    pub fn path(&self) -> &Path {
        self.file.path()
    }
}
