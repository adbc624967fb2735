//! Records a tracked process wrote into its own ring (the preload shim's,
//! issue 22) that could not be read (issue 40). Such a ring is that
//! process's word, not memtrail's: a malformed record is its corruption,
//! not a disagreement between memtrail's BPF and userspace. Two lines per
//! process: one on its first such record (pid, executable if known yet,
//! ring, what was wrong), one at the end with the count and the executable
//! the capture knew it by (a shim's record can come before its process's
//! own, in ring order); its counts are marked incomplete and the rest of
//! the capture goes on. Logged as notes
//! ([`NOTE`](crate::profile::NOTE)): the profile and the summary record
//! them too.

use crate::profile::{CorruptRing, UnrecordedStacks};

/// The processes whose rings held records that could not be read, in
/// order of their first; and those whose rings named stacks they never
/// carried (`ring::merge`: handed on in no stack, counted there).
#[derive(Debug, Default)]
pub(super) struct Corrupt {
    rings: Vec<CorruptRing>,
    unrecorded: Vec<(u32, UnrecordedStacks)>,
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
            target: crate::profile::NOTE,
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

    /// Names each process by the executable the capture knows it ran
    /// (`exe_of`; a record can come before the process's own in ring
    /// order, and the process be gone by then), and logs how many records
    /// each had refused.
    pub(super) fn unrecorded(&mut self, pid: u32, counts: UnrecordedStacks) {
        match self.unrecorded.iter_mut().find(|(p, _)| *p == pid) {
            Some((_, u)) => u.add(&counts),
            None => self.unrecorded.push((pid, counts)),
        }
    }

    /// What every process's ring named and never carried.
    pub(super) fn unrecorded_total(&self) -> UnrecordedStacks {
        let mut all = UnrecordedStacks::default();
        for (_, u) in &self.unrecorded {
            all.add(u);
        }
        all
    }

    pub(super) fn finish<'a>(&mut self, exe_of: impl Fn(u32) -> Option<&'a str>) {
        for (pid, u) in &self.unrecorded {
            tracing::warn!(
                target: crate::profile::NOTE,
                pid,
                exe = exe_of(*pid).unwrap_or("(not known)"),
                stacks = u.stacks,
                more_stacks = u.more_stacks,
                allocations = u.allocations,
                bytes = u.bytes,
                "a tracked process's own ring named stacks never recorded: counted in the totals, \
                 in no stack (the profile's anomalies.unrecorded_stacks)"
            );
        }
        for c in &mut self.rings {
            if let Some(exe) = exe_of(c.pid) {
                exe.clone_into(&mut c.exe);
            }
        }
        for c in &self.rings {
            tracing::warn!(
                target: crate::profile::NOTE,
                pid = c.pid,
                exe = %c.exe,
                records = c.records,
                first = %c.first,
                "records refused from a tracked process's own ring: its counts are incomplete"
            );
        }
    }

    pub(super) fn rings(&self) -> &[CorruptRing] {
        &self.rings
    }
}
