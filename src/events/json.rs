//! One event as a JSON object (`--events-format jsonl`, `memtrail events`).

use std::io::{self, Write};

use crate::bpf::record::{Body, Kind, Mem, Record};

/// Writes one record as a JSON line (the internal realloc opening is
/// skipped by the callers).
pub(crate) fn write_json(w: &mut impl Write, rec: &Record<'_>) -> io::Result<()> {
    let h = &rec.hdr;
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
            if matches!(h.kind, Kind::Mmap | Kind::Mprotect) {
                write!(w, r#","prot":{old_addr}"#)?;
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
            if matches!(
                h.kind,
                Kind::Mmap | Kind::Munmap | Kind::Mremap | Kind::Brk | Kind::Mprotect
            ) {
                write!(w, r#","in_allocator":{}"#, h.in_allocator)?;
            }
        }
        Body::Fork { child_pid } => write!(w, r#","child_pid":{child_pid}"#)?,
        Body::Exec { filename } => {
            w.write_all(br#","filename":"#)?;
            serde_json::to_writer(&mut *w, &String::from_utf8_lossy(filename))?;
        }
        Body::Exit { exit_code } => write!(w, r#","exit_code":{exit_code}"#)?,
        Body::Rss { rss, peak } => write!(w, r#","rss_bytes":{rss},"peak_rss_bytes":{peak}"#)?,
        Body::Region { name } => {
            if h.kind == Kind::RegionBegin {
                w.write_all(br#","name":"#)?;
                serde_json::to_writer(&mut *w, &String::from_utf8_lossy(name))?;
            }
        }
    }
    w.write_all(b"}\n")
}
