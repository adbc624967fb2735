//! CPython 3.11+'s location table (`co_linetable`, `Objects/locations.md`
//! in CPython): entries of code-unit ranges, each a line delta and columns.

/// A reader of the table's varints.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn byte(&mut self) -> Option<u8> {
        let b = *self.bytes.get(self.at)?;
        self.at += 1;
        Some(b)
    }

    /// 6-bit chunks, least significant first, 0x40 set on all but the last.
    fn varint(&mut self) -> Option<u32> {
        let mut b = self.byte()?;
        let mut value = u32::from(b & 63);
        let mut shift = 6;
        while b & 64 != 0 && shift < 32 {
            b = self.byte()?;
            value |= u32::from(b & 63) << shift;
            shift += 6;
        }
        Some(value)
    }

    /// A varint with the sign in its lowest bit.
    fn svarint(&mut self) -> Option<i64> {
        let v = self.varint()?;
        let magnitude = i64::from(v >> 1);
        Some(if v & 1 != 0 { -magnitude } else { magnitude })
    }
}

/// The line of the instruction `offset` code units into a code object
/// whose first line is `first` and location table `table`; None when the
/// instruction has no location or lies past the table.
pub fn line_of(table: &[u8], first: i32, offset: u32) -> Option<u32> {
    let mut r = Reader {
        bytes: table,
        at: 0,
    };
    let mut line = i64::from(first);
    let mut unit: u64 = 0;
    while let Some(head) = r.byte() {
        if head & 0x80 == 0 {
            continue; // not an entry's first byte (a malformed table)
        }
        let code = (head >> 3) & 15;
        let len = u64::from(head & 7) + 1;
        let mut has_line = true;
        match code {
            15 => has_line = false, // no location
            14 => {
                line += r.svarint()?;
                r.varint()?; // end line delta
                r.varint()?; // column + 1
                r.varint()?; // end column + 1
            }
            13 => line += r.svarint()?, // no column
            10..=12 => {
                line += i64::from(code - 10);
                r.byte()?;
                r.byte()?;
            }
            _ => {
                r.byte()?; // short form: same line, a column byte
            }
        }
        if u64::from(offset) < unit + len {
            return (has_line && line > 0)
                .then(|| u32::try_from(line).ok())
                .flatten();
        }
        unit += len;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::line_of;

    #[test]
    fn python_line_table_forms() {
        // 2 units on the first line (short form), 1 unit one line down
        // (one-line form 11), 3 units 5 lines down (no-column form), 1 unit
        // without location, 2 units 2 lines up (long form).
        let table = [
            0x80 | 1,
            0x00, // code 0, len 2
            0x80 | (11 << 3),
            0x01,
            0x02, // len 1, line + 1
            0x80 | (13 << 3) | 2,
            10,               // len 3, line + 5
            0x80 | (15 << 3), // len 1, no location
            0x80 | (14 << 3) | 1,
            5,
            0,
            1,
            1, // len 2, line - 2
        ];
        let lines: Vec<_> = (0..10).map(|u| line_of(&table, 10, u)).collect();
        assert_eq!(
            lines,
            [
                Some(10),
                Some(10),
                Some(11),
                Some(16),
                Some(16),
                Some(16),
                None,
                Some(14),
                Some(14),
                None
            ]
        );
    }
}
