//! Records a tracked process wrote into its own ring (the preload shim's,
//! issue 22) that could not be read (issue 40). Such a ring is that
//! process's word, not memtrail's: a malformed record is its corruption,
//! not a disagreement between memtrail's BPF and userspace. The process is
//! named once, on its first such record (pid, executable, ring, what was
//! wrong), the others counted; its counts are marked incomplete and the
//! rest of the capture goes on.

use crate::profile::CorruptRing;

/// The processes whose rings held records that could not be read, in
/// order of their first.
#[derive(Debug, Default)]
pub(super) struct Corrupt {
    rings: Vec<CorruptRing>,
}

impl Corrupt {
    /// Counts a record refused from process `pid`'s ring `ring` (when
    /// known); `exe` is what the capture knows the process ran. Logs the
    /// first of each process.
    pub(super) fn refuse(&mut self, pid: u32, exe: &str, ring: Option<u32>, what: &str) {
        if let Some(known) = self.rings.iter_mut().find(|c| c.pid == pid) {
            known.records += 1;
            return;
        }
        tracing::warn!(
            pid,
            exe,
            ring = ring.map(i64::from).unwrap_or(-1),
            what,
            "a tracked process's own ring holds a record memtrail cannot read: its counts are \
             incomplete from here on (the capture goes on; more such records are counted)"
        );
        self.rings.push(CorruptRing {
            pid,
            exe: exe.to_owned(),
            ring,
            first: what.to_owned(),
            records: 1,
        });
    }

    /// Logs how many records each process had refused, when more than its
    /// first.
    pub(super) fn finish(&self) {
        for c in self.rings.iter().filter(|c| c.records > 1) {
            tracing::warn!(
                pid = c.pid,
                exe = %c.exe,
                records = c.records,
                "records refused from a tracked process's own ring"
            );
        }
    }

    pub(super) fn rings(&self) -> &[CorruptRing] {
        &self.rings
    }
}
