//! Free ranges of the unwind tables' shared array of slots (issue 23): a
//! released table's slots go here, and a table loaded later takes the
//! lowest range it fits in (first fit) before the array grows.
//!
//! Invariant: ranges never overlap nor touch (a range given back merges
//! with its neighbours), so a table that fits in the slots freed by two
//! adjacent tables finds them as one range.

use std::collections::BTreeMap;

/// Free slot ranges, by first slot.
#[derive(Debug, Default)]
pub struct Free {
    /// First slot -> length.
    ranges: BTreeMap<u64, u64>,
}

impl Free {
    /// Takes `len` slots from the lowest range that holds them; their
    /// first slot.
    pub fn take(&mut self, len: u64) -> Option<u64> {
        let (&start, &have) = self.ranges.iter().find(|&(_, &have)| have >= len)?;
        self.ranges.remove(&start);
        if have > len {
            self.ranges.insert(start + len, have - len);
        }
        Some(start)
    }

    /// Takes the range that ends at `end` (the slots allocated so far): a
    /// table too large for any range starts there, and the slots grow only
    /// by what it needs past it. Its first slot.
    pub fn take_ending_at(&mut self, end: u64) -> Option<u64> {
        let (&start, &len) = self.ranges.iter().next_back()?;
        if start + len != end {
            return None;
        }
        self.ranges.remove(&start);
        Some(start)
    }

    /// Gives back `len` slots from `start` (not free already).
    pub fn give(&mut self, start: u64, len: u64) {
        if len == 0 {
            return;
        }
        let (mut start, mut len) = (start, len);
        if let Some((&before, &blen)) = self.ranges.range(..start).next_back() {
            debug_assert!(before + blen <= start, "slots freed twice");
            if before + blen == start {
                self.ranges.remove(&before);
                start = before;
                len += blen;
            }
        }
        if let Some(after) = self.ranges.remove(&(start + len)) {
            len += after;
        }
        self.ranges.insert(start, len);
    }

    /// Free slots in all.
    pub fn total(&self) -> u64 {
        self.ranges.values().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::Free;

    /// Check that freed ranges merge with both neighbours, that a take
    /// picks the lowest range that fits and keeps the rest, and that a
    /// take larger than every range finds none.
    #[test]
    fn unwind_free_slots_merge_and_first_fit() {
        let mut free = Free::default();
        assert_eq!(free.take(1), None);
        free.give(10, 5);
        free.give(30, 5);
        free.give(20, 5);
        assert_eq!(free.total(), 15);
        assert_eq!(free.take(6), None);
        free.give(15, 5); // 10..25 now one range
        free.give(25, 5); // 10..35
        assert_eq!(free.take(25), Some(10));
        assert_eq!(free.take(1), None);
        free.give(100, 10);
        free.give(0, 4);
        assert_eq!(free.take(3), Some(0));
        assert_eq!(free.take(3), Some(100));
        assert_eq!(free.take(7), Some(103));
        assert_eq!(free.take(1), Some(3));
        assert_eq!(free.total(), 0);
        free.give(0, 0);
        assert_eq!(free.take(1), None);
    }

    /// Check that only the range ending at the slots' end is taken to
    /// grow from.
    #[test]
    fn unwind_free_slots_grow_from_the_last_range() {
        let mut free = Free::default();
        assert_eq!(free.take_ending_at(50), None);
        free.give(10, 5);
        free.give(40, 10);
        assert_eq!(free.take_ending_at(60), None);
        assert_eq!(free.take_ending_at(50), Some(40));
        assert_eq!(free.take_ending_at(15), Some(10));
        assert_eq!(free.total(), 0);
    }
}
