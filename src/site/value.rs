//! Scalar values of the site language: quotas (`3`, `"30%"`, `"all"`) and durations (`"1m30s"`).

use serde::{Deserialize, Serialize};
use std::fmt;
use std::time::Duration;

/// A number of hosts, given absolutely or as a share of some total.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub enum Quota {
    /// Every host.
    All,
    /// Exactly this many hosts (clamped to the total).
    Count(u64),
    /// A share, in hundredths of a percent (`"12.5%"` is 1250).
    Percent(u32),
}

/// How a share becomes a whole number of hosts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Round {
    /// Never exceed the share (batches, failure budgets).
    Down,
    /// Never fall short of the share (health requirements).
    Up,
}

impl Quota {
    /// The number of hosts this quota means out of `total`, never more than `total`.
    pub fn of(self, total: usize, round: Round) -> usize {
        match self {
            Quota::All => total,
            Quota::Count(n) => usize::try_from(n).unwrap_or(usize::MAX).min(total),
            Quota::Percent(bp) => {
                let scaled = total as u128 * u128::from(bp);
                let n = match round {
                    Round::Down => scaled / 10_000,
                    Round::Up => scaled.div_ceil(10_000),
                };
                usize::try_from(n).unwrap_or(usize::MAX).min(total)
            }
        }
    }

    /// Parses `"all"`, `"30%"` or `"12.5%"`; integers are handled by the caller.
    pub fn parse(text: &str) -> Result<Quota, String> {
        let text = text.trim();
        if text == "all" {
            return Ok(Quota::All);
        }
        let Some(number) = text.strip_suffix('%') else {
            return match text.parse::<u64>() {
                Ok(n) => Ok(Quota::Count(n)),
                Err(_) => Err(format!("`{text}` is not a count, a percentage or \"all\"")),
            };
        };
        let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
        let digits_ok = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
        if whole.is_empty() || !digits_ok(whole) || !digits_ok(frac) || frac.len() > 2 {
            return Err(format!(
                "`{text}` is not a percentage like \"30%\" or \"12.5%\""
            ));
        }
        let whole: u32 = whole
            .parse()
            .map_err(|_| format!("`{text}` is too large"))?;
        let frac: u32 = format!("{frac:0<2}").parse().unwrap_or(0);
        let bp = whole.saturating_mul(100).saturating_add(frac);
        if bp > 10_000 {
            return Err(format!("`{text}` is more than 100%"));
        }
        Ok(Quota::Percent(bp))
    }
}

impl From<Quota> for String {
    fn from(q: Quota) -> String {
        q.to_string()
    }
}

impl TryFrom<String> for Quota {
    type Error = String;
    fn try_from(s: String) -> Result<Quota, String> {
        Quota::parse(&s)
    }
}

impl fmt::Display for Quota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Quota::All => f.write_str("all"),
            Quota::Count(n) => write!(f, "{n}"),
            Quota::Percent(bp) if bp % 100 == 0 => write!(f, "{}%", bp / 100),
            Quota::Percent(bp) => write!(f, "{}.{:02}%", bp / 100, bp % 100),
        }
    }
}

/// Parses a duration such as `"30s"`, `"1m30s"`, `"500ms"`, `"2h"` or `"0s"`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let bad = || format!("`{text}` is not a duration like \"30s\", \"1m30s\" or \"500ms\"");
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err(bad());
    }
    let mut total = Duration::ZERO;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(bad());
        }
        let value: u64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let unit_len = rest.bytes().take_while(u8::is_ascii_alphabetic).count();
        let unit = match &rest[..unit_len] {
            "ms" => Duration::from_millis(value),
            "s" => Duration::from_secs(value),
            "m" => Duration::from_secs(value.saturating_mul(60)),
            "h" => Duration::from_secs(value.saturating_mul(3600)),
            _ => return Err(bad()),
        };
        rest = &rest[unit_len..];
        total = total.saturating_add(unit);
    }
    Ok(total)
}

/// Parses a size such as `"64MiB"`, `"500KB"`, `"1GiB"` or `"4096B"`: binary units (KiB,
/// MiB, GiB) count in 1024s, decimal ones (KB, MB, GB) in 1000s.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let bad = || format!("`{text}` is not a size like \"64MiB\", \"500KB\" or \"4096B\"");
    let t = text.trim();
    let digits = t.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return Err(bad());
    }
    let value: u64 = t[..digits].parse().map_err(|_| bad())?;
    let unit: u64 = match &t[digits..] {
        "B" => 1,
        "KB" => 1000,
        "MB" => 1000 * 1000,
        "GB" => 1000 * 1000 * 1000,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        _ => return Err(bad()),
    };
    value.checked_mul(unit).ok_or_else(bad)
}

/// Formats a duration the way the site language writes it.
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 {
        return "0s".into();
    }
    if !ms.is_multiple_of(1000) {
        return format!("{ms}ms");
    }
    let s = ms / 1000;
    let (h, m, s) = (s / 3600, (s % 3600) / 60, s % 60);
    let mut out = String::new();
    for (v, u) in [(h, "h"), (m, "m"), (s, "s")] {
        if v > 0 {
            out.push_str(&format!("{v}{u}"));
        }
    }
    out
}

/// Serde for an optional duration as the site writes it (`"10m"`, `"1500ms"`): what a saved
/// plan holds.
pub mod duration_text {
    use std::time::Duration;

    pub fn serialize<S: serde::Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_some(&super::format_duration(*d)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: serde::Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Duration>, D::Error> {
        let text: Option<String> = serde::Deserialize::deserialize(d)?;
        text.map(|t| {
            super::parse_duration(&t)
                .map_err(|e| serde::de::Error::custom(format!("duration {t:?}: {e}")))
        })
        .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A size as the site language may write it: the largest binary unit that divides it.
    fn format_size(bytes: u64) -> String {
        for (shift, unit) in [(30, "GiB"), (20, "MiB"), (10, "KiB")] {
            if bytes > 0 && bytes.is_multiple_of(1 << shift) {
                return format!("{}{unit}", bytes >> shift);
            }
        }
        format!("{bytes}B")
    }

    #[test]
    fn sizes_parse_in_binary_and_decimal_units() {
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("500KB"), Ok(500_000));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("2GB"), Ok(2_000_000_000));
        assert_eq!(parse_size("4096B"), Ok(4096));
        for bad in [
            "",
            "64",
            "MiB",
            "64mib",
            "64 MiB",
            "-1B",
            "1.5MiB",
            "99999999999GiB",
        ] {
            assert!(parse_size(bad).is_err(), "{bad:?} parsed");
        }
        assert_eq!(format_size(64 << 20), "64MiB");
        assert_eq!(format_size(1500), "1500B");
        assert_eq!(format_size(3 << 10), "3KiB");
    }

    proptest! {
        #[test]
        fn a_formatted_size_parses_back(bytes in 0u64..(1 << 50)) {
            prop_assert_eq!(parse_size(&format_size(bytes)), Ok(bytes));
        }
    }

    #[test]
    fn quotas_parse() {
        assert_eq!(Quota::parse("all"), Ok(Quota::All));
        assert_eq!(Quota::parse("30%"), Ok(Quota::Percent(3000)));
        assert_eq!(Quota::parse("12.5%"), Ok(Quota::Percent(1250)));
        assert_eq!(Quota::parse("7"), Ok(Quota::Count(7)));
        assert!(Quota::parse("101%").is_err());
        assert!(Quota::parse("%").is_err());
        assert!(Quota::parse("3.333%").is_err());
        assert!(Quota::parse("half").is_err());
    }

    #[test]
    fn quota_rounding() {
        assert_eq!(Quota::Percent(3000).of(12, Round::Down), 3);
        assert_eq!(Quota::Percent(5000).of(3, Round::Up), 2);
        assert_eq!(Quota::Percent(1000).of(12, Round::Down), 1);
        assert_eq!(Quota::Count(50).of(3, Round::Down), 3);
        assert_eq!(Quota::All.of(9, Round::Up), 9);
    }

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        assert!(parse_duration("30").is_err());
        assert!(parse_duration("s").is_err());
        assert!(parse_duration("3 days").is_err());
    }

    proptest! {
        #[test]
        fn duration_roundtrips(ms in 0u64..10_000_000_000) {
            let d = Duration::from_millis(ms);
            prop_assert_eq!(parse_duration(&format_duration(d)), Ok(d));
        }

        #[test]
        fn quota_never_exceeds_total(bp in 0u32..=10_000, total in 0usize..100_000) {
            let q = Quota::Percent(bp);
            prop_assert!(q.of(total, Round::Down) <= q.of(total, Round::Up));
            prop_assert!(q.of(total, Round::Up) <= total);
        }

        #[test]
        fn percent_roundtrips(bp in 0u32..=10_000) {
            let q = Quota::Percent(bp);
            prop_assert_eq!(Quota::parse(&q.to_string()), Ok(q));
        }
    }
}
