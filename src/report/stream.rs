//! The event stream: one JSON object a line (format in docs/profile.md).
//!
//! Lines are formatted by hand on the poller thread: serde's generic
//! machinery is not needed for flat records of integers.

use std::fs::File;
use std::io::{self, BufWriter, Write};

use crate::record::{Body, Kind, Mem, Record};

use super::output::OutputFile;

/// Writes records as JSON lines into an [`OutputFile`].
pub struct EventWriter {
    out: BufWriter<File>,
    file: OutputFile,
}

impl EventWriter {
    pub fn new(file: OutputFile) -> io::Result<Self> {
        let out = BufWriter::with_capacity(1 << 20, file.file().try_clone()?);
        Ok(Self { out, file })
    }

    /// Writes one record (the internal realloc opening is not written).
    pub fn write(&mut self, rec: &Record<'_>) -> io::Result<()> {
        let h = &rec.hdr;
        if h.kind == Kind::ReallocBegin {
            return Ok(());
        }
        let w = &mut self.out;
        write!(
            w,
            r#"{{"ts_ns":{},"pid":{},"tid":{},"kind":"{}""#,
            h.ts_ns,
            h.pid,
            h.tid,
            h.kind.name()
        )?;
        match rec.body {
            Body::Mem(Mem {
                addr,
                size,
                old_addr,
                old_size,
                stack_id,
            }) => {
                write!(w, r#","addr":{addr}"#)?;
                if h.kind != Kind::Free {
                    write!(w, r#","size":{size}"#)?;
                }
                if h.kind.is_realloc() || h.kind == Kind::Mremap {
                    write!(w, r#","old_addr":{old_addr}"#)?;
                }
                if h.kind == Kind::Mremap {
                    write!(w, r#","old_size":{old_size}"#)?;
                }
                if stack_id != 0 {
                    write!(w, r#","stack_id":"{stack_id}""#)?;
                }
                if matches!(h.kind, Kind::Mmap | Kind::Munmap | Kind::Mremap | Kind::Brk) {
                    write!(w, r#","in_allocator":{}"#, h.in_allocator)?;
                }
            }
            Body::Fork { child_pid } => write!(w, r#","child_pid":{child_pid}"#)?,
            Body::Exec { filename } => {
                w.write_all(br#","filename":"#)?;
                serde_json::to_writer(&mut *w, &String::from_utf8_lossy(filename))?;
            }
            Body::Exit { exit_code } => write!(w, r#","exit_code":{exit_code}"#)?,
            Body::Region { name } => {
                if h.kind == Kind::RegionBegin {
                    w.write_all(br#","name":"#)?;
                    serde_json::to_writer(&mut *w, &String::from_utf8_lossy(name))?;
                }
            }
        }
        w.write_all(b"}\n")
    }

    /// Flushes and renames the stream into place.
    pub fn commit(mut self) -> Result<(), super::output::OutputError> {
        self.out
            .flush()
            .map_err(|source| super::output::OutputError {
                path: self.file.path().to_owned(),
                source,
            })?;
        drop(self.out);
        self.file.commit()
    }
}
