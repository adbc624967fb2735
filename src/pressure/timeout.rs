//! `--pressure-timeout`: the longest a pressure pause may last, parsed and
//! bounded ([`MIN_TIMEOUT`], [`MAX_TIMEOUT`]). What the timeout bounds is
//! in the module's docs (`pressure`, Timeouts).

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// `--pressure-timeout`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PressureTimeout {
    /// No pausing; loss detection only.
    #[default]
    Off,
    /// Pausing; an episode that does not recover in time kills the tree.
    After(Duration),
    /// Pausing, waiting as long as recovery takes.
    Infinite,
}

impl PressureTimeout {
    pub fn enabled(self) -> bool {
        self != Self::Off
    }
}

/// The shortest finite timeout: a pause (a wakeup, a freeze, a drain) takes
/// tens to hundreds of microseconds, so a shorter bound could not be kept.
pub const MIN_TIMEOUT: Duration = Duration::from_millis(1);

/// The longest finite timeout: anything longer is `inf` in all but name.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(86_400);

/// Why a timeout was rejected.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ParseTimeoutError {
    #[error(
        "invalid pressure timeout `{0}`: use 0 (no pausing), a number with a unit, ns, us, ms, \
         s or m (250ms, 2s, 1m), or inf"
    )]
    Invalid(String),
    #[error(
        "pressure timeout `{0}` has no unit: use a number with a unit, ns, us, ms, s or m \
         (`{0}s` is {0} seconds), or 0 (no pausing), or inf"
    )]
    NoUnit(String),
    #[error(
        "pressure timeout `{0}` is shorter than the {MIN_TIMEOUT:?} memtrail can keep: use at \
         least 1ms, or 0 for no pausing"
    )]
    TooShort(String),
    #[error("pressure timeout `{0}` is longer than a day: use inf to wait as long as it takes")]
    TooLong(String),
}

/// Whether `s` is a plain decimal number (`5`, `1.5`): a duration without
/// its unit.
pub fn is_plain_number(s: &str) -> bool {
    let (int, frac) = s.split_once('.').unwrap_or((s, ""));
    !int.is_empty()
        && int.bytes().all(|b| b.is_ascii_digit())
        && frac.bytes().all(|b| b.is_ascii_digit())
}

impl FromStr for PressureTimeout {
    type Err = ParseTimeoutError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || ParseTimeoutError::Invalid(s.to_owned());
        if s == "inf" {
            return Ok(Self::Infinite);
        }
        if s == "0" {
            return Ok(Self::Off);
        }
        let (number, unit_ns) = if let Some(n) = s.strip_suffix("ns") {
            (n, 1u128)
        } else if let Some(n) = s.strip_suffix("us").or_else(|| s.strip_suffix("µs")) {
            (n, 1_000)
        } else if let Some(n) = s.strip_suffix("ms") {
            (n, 1_000_000)
        } else if let Some(n) = s.strip_suffix('s') {
            (n, 1_000_000_000)
        } else if let Some(n) = s.strip_suffix('m') {
            (n, 60_000_000_000)
        } else if is_plain_number(s) {
            return Err(ParseTimeoutError::NoUnit(s.to_owned()));
        } else {
            return Err(err());
        };
        // Plain decimal numbers only: no sign, exponent or empty part.
        let valid = !number.is_empty()
            && number.chars().all(|c| c.is_ascii_digit() || c == '.')
            && number.chars().filter(|&c| c == '.').count() <= 1
            && !number.starts_with('.')
            && !number.ends_with('.');
        if !valid {
            return Err(err());
        }
        let (int, frac) = number.split_once('.').unwrap_or((number, ""));
        let int: u128 = int.parse().map_err(|_| err())?;
        let mut ns = int.checked_mul(unit_ns).ok_or_else(err)?;
        let mut scale = unit_ns;
        for digit in frac.bytes() {
            // Digits past a nanosecond add nothing (they only matter to
            // tell zero from nonzero, below).
            scale /= 10;
            ns += u128::from(digit - b'0') * scale;
        }
        // One rule: zero, in any unit and with any number of zero digits,
        // is off; any other duration must be one the coordinator can keep.
        // Nothing is rounded: `0.0000000001s` is not 0.
        if number.bytes().all(|c| c == b'0' || c == b'.') {
            return Ok(Self::Off);
        }
        if ns < MIN_TIMEOUT.as_nanos() {
            return Err(ParseTimeoutError::TooShort(s.to_owned()));
        }
        if ns > MAX_TIMEOUT.as_nanos() {
            return Err(ParseTimeoutError::TooLong(s.to_owned()));
        }
        Ok(Self::After(Duration::from_nanos(ns as u64)))
    }
}

impl fmt::Display for PressureTimeout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Off => write!(f, "0"),
            Self::After(d) => write!(f, "{d:?}"),
            Self::Infinite => write!(f, "inf"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Check that every documented form of --pressure-timeout parses.
    #[test]
    fn pressure_timeout_accepted_forms() {
        let ok = |s: &str| s.parse::<PressureTimeout>().unwrap();
        assert_eq!(ok("0"), PressureTimeout::Off);
        assert_eq!(ok("0s"), PressureTimeout::Off);
        assert_eq!(ok("inf"), PressureTimeout::Infinite);
        assert_eq!(
            ok("250ms"),
            PressureTimeout::After(Duration::from_millis(250))
        );
        assert_eq!(ok("2s"), PressureTimeout::After(Duration::from_secs(2)));
        assert_eq!(ok("1m"), PressureTimeout::After(Duration::from_secs(60)));
        assert_eq!(
            ok("1.5s"),
            PressureTimeout::After(Duration::from_millis(1500))
        );
        assert_eq!(ok("0.000ms"), PressureTimeout::Off);
        assert_eq!(ok("0ns"), PressureTimeout::Off);
        assert_eq!(ok("1ms"), PressureTimeout::After(MIN_TIMEOUT));
        assert_eq!(ok("1000us"), PressureTimeout::After(MIN_TIMEOUT));
        assert_eq!(ok("1000000ns"), PressureTimeout::After(MIN_TIMEOUT));
        assert_eq!(ok("0.001s"), PressureTimeout::After(MIN_TIMEOUT));
        assert_eq!(ok("1440m"), PressureTimeout::After(MAX_TIMEOUT));
    }

    /// Check that a nonzero timeout below the 1 ms minimum is rejected as
    /// too short, whatever its unit and however many digits it has, rather
    /// than rounded to 0 (off) (issue 11: `0.0000000001s` became 0 while
    /// `1us` was rejected as malformed).
    #[test]
    fn pressure_timeout_below_minimum_rejected() {
        for short in [
            "0.0000000001s",
            "0.00000000000000000000000000000000000001s",
            "1us",
            "1µs",
            "999us",
            "999999ns",
            "1ns",
            "0.5ms",
            "0.000999s",
        ] {
            assert_eq!(
                short.parse::<PressureTimeout>(),
                Err(ParseTimeoutError::TooShort(short.to_owned())),
                "{short:?}"
            );
        }
        assert_eq!(
            "1441m".parse::<PressureTimeout>(),
            Err(ParseTimeoutError::TooLong("1441m".to_owned()))
        );
    }

    /// Check that malformed, negative, exponent and absurd timeouts are
    /// rejected.
    #[test]
    fn pressure_timeout_rejected_forms() {
        for bad in [
            "",
            "-1",
            "abc",
            "1e99s",
            "1e3ms",
            "-1s",
            "s",
            "1",
            "10h",
            ".5s",
            "5.s",
            "1..2s",
            "99999999999999999999999m",
            "2d",
            "inf ",
            " 1s",
        ] {
            assert!(bad.parse::<PressureTimeout>().is_err(), "{bad:?} accepted");
        }
    }
}
