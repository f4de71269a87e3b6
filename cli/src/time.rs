//! Wall-clock times: RFC 3339 (or epoch milliseconds) in, RFC 3339 in UTC out, and durations
//! for people.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> u64 {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_millis();
    u64::try_from(ms).unwrap_or(u64::MAX)
}

/// Days since 1970-01-01 of a proleptic Gregorian date.
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The date of a day count since 1970-01-01.
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

fn is_leap(year: i64) -> bool {
    (year % 4 == 0 && year % 100 != 0) || year % 400 == 0
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Parses milliseconds since the Unix epoch (digits only) or an RFC 3339 time
/// (`2026-12-01T09:30:00Z`, `2026-12-01T10:30:00.250+01:00`). The error says what is wrong.
pub fn parse(text: &str) -> Result<u64, String> {
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        return text
            .parse::<u64>()
            .map_err(|_| "too large for milliseconds since the epoch".to_owned());
    }
    rfc3339(text)
}

fn field(text: &str, range: std::ops::Range<usize>, what: &str) -> Result<i64, String> {
    let part = text
        .get(range)
        .filter(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        .ok_or_else(|| format!("no {what} where expected"))?;
    part.parse::<i64>().map_err(|_| format!("bad {what}"))
}

fn rfc3339(text: &str) -> Result<u64, String> {
    let bytes = text.as_bytes();
    if bytes.len() < 20 {
        return Err("too short for YYYY-MM-DDTHH:MM:SSZ".to_owned());
    }
    let sep = |i: usize, want: &[u8], what: &str| -> Result<(), String> {
        if want.contains(&bytes[i]) {
            Ok(())
        } else {
            Err(format!("expected {what} at position {}", i + 1))
        }
    };
    let year = field(text, 0..4, "year")?;
    sep(4, b"-", "`-`")?;
    let month = field(text, 5..7, "month")?;
    sep(7, b"-", "`-`")?;
    let day = field(text, 8..10, "day")?;
    sep(10, b"Tt ", "`T`")?;
    let hour = field(text, 11..13, "hour")?;
    sep(13, b":", "`:`")?;
    let minute = field(text, 14..16, "minute")?;
    sep(16, b":", "`:`")?;
    let second = field(text, 17..19, "second")?;
    if !(1..=12).contains(&month) {
        return Err(format!("month {month} is not 1 to 12"));
    }
    if !(1..=days_in_month(year, month)).contains(&day) {
        return Err(format!("day {day} is not in {year}-{month:02}"));
    }
    if hour > 23 || minute > 59 || second > 59 {
        return Err(format!(
            "{hour:02}:{minute:02}:{second:02} is not a time of day"
        ));
    }
    let mut rest = &text[19..];
    let mut millis = 0_i64;
    if let Some(fraction) = rest.strip_prefix('.') {
        let digits = fraction.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err("no digits after the decimal point".to_owned());
        }
        // Milliseconds: the first three digits, padded.
        let first: String = fraction[..digits]
            .chars()
            .chain("000".chars())
            .take(3)
            .collect();
        millis = first
            .parse::<i64>()
            .map_err(|_| "bad fraction".to_owned())?;
        rest = &fraction[digits..];
    }
    let offset_minutes = match rest {
        "Z" | "z" => 0,
        _ => {
            let sign = match rest.as_bytes().first() {
                Some(b'+') => 1,
                Some(b'-') => -1,
                _ => return Err("no time zone (`Z` or `+HH:MM`) at the end".to_owned()),
            };
            if rest.len() != 6 || rest.as_bytes()[3] != b':' {
                return Err(format!("time zone `{rest}` is not `+HH:MM` or `-HH:MM`"));
            }
            let hours = field(rest, 1..3, "offset hour")?;
            let minutes = field(rest, 4..6, "offset minute")?;
            if hours > 23 || minutes > 59 {
                return Err(format!("time zone `{rest}` is out of range"));
            }
            sign * (hours * 60 + minutes)
        }
    };
    let days = days_from_civil(year, month, day);
    let seconds = days * 86_400 + hour * 3600 + minute * 60 + second - offset_minutes * 60;
    let ms = seconds * 1000 + millis;
    u64::try_from(ms).map_err(|_| "before 1970".to_owned())
}

/// `2026-12-01T09:30:00.000Z`.
pub fn format(ms: u64) -> String {
    let ms = i64::try_from(ms).unwrap_or(i64::MAX);
    let (days, in_day) = (ms.div_euclid(86_400_000), ms.rem_euclid(86_400_000));
    let (year, month, day) = civil_from_days(days);
    let seconds = in_day / 1000;
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        seconds / 3600,
        seconds / 60 % 60,
        seconds % 60,
        in_day % 1000
    )
}

/// A duration for people: `850ms`, `4.2s`, `3m12s`, `2h05m`, `3d04h`.
pub fn human(ms: u64) -> String {
    let s = ms / 1000;
    if ms < 1000 {
        format!("{ms}ms")
    } else if s < 60 {
        format!("{}.{}s", s, ms % 1000 / 100)
    } else if s < 3600 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else if s < 86_400 {
        format!("{}h{:02}m", s / 3600, s / 60 % 60)
    } else {
        format!("{}d{:02}h", s / 86_400, s / 3600 % 24)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_round_trips() {
        for (text, ms) in [
            ("1970-01-01T00:00:00Z", 0),
            ("2026-12-01T09:30:00Z", 1_796_117_400_000),
            ("2026-12-01T10:30:00.250+01:00", 1_796_117_400_250),
            ("2026-12-01 09:30:00.9z", 1_796_117_400_900),
            ("2024-02-29T23:59:59.999-00:30", 1_709_252_999_999),
            ("1796117400000", 1_796_117_400_000),
        ] {
            assert_eq!(parse(text), Ok(ms), "{text}");
        }
        assert_eq!(format(1_796_117_400_250), "2026-12-01T09:30:00.250Z");
        assert_eq!(format(0), "1970-01-01T00:00:00.000Z");
        for ms in [0, 951_782_400_000, 1_709_251_199_999, 4_102_444_800_000] {
            assert_eq!(parse(&format(ms)), Ok(ms));
        }
    }

    #[test]
    fn bad_times_say_why() {
        for (text, why) in [
            ("yesterday", "too short"),
            ("2026-13-01T00:00:00Z", "month 13"),
            ("2025-02-29T00:00:00Z", "day 29"),
            ("2026-12-01T24:00:00Z", "not a time of day"),
            ("2026-12-01T09:30:00", "too short"),
            ("2026-12-01T09:30:00+0100", "not `+HH:MM`"),
            ("2026-12-01T09:30:00.Z", "decimal point"),
            ("2026/12/01T09:30:00Z", "`-`"),
            ("1969-12-31T23:59:59Z", "before 1970"),
        ] {
            let err = parse(text).unwrap_err();
            assert!(err.contains(why), "{text}: {err}");
        }
    }

    #[test]
    fn durations_read_well() {
        assert_eq!(human(850), "850ms");
        assert_eq!(human(4_250), "4.2s");
        assert_eq!(human(192_000), "3m12s");
        assert_eq!(human(7_500_000), "2h05m");
        assert_eq!(human(273_600_000), "3d04h");
    }
}
