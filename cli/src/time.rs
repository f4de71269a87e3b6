//! Wall-clock times: RFC 3339 (or epoch milliseconds) in, RFC 3339 in UTC out (both with
//! jiff), and durations for people.

use jiff::Timestamp;

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> u64 {
    u64::try_from(Timestamp::now().as_millisecond()).unwrap_or(0)
}

/// Parses milliseconds since the Unix epoch (digits only) or an RFC 3339 time
/// (`2026-12-01T09:30:00Z`, `2026-12-01T10:30:00.250+01:00`; digits below the millisecond are
/// dropped). The error says what is wrong.
pub fn parse(text: &str) -> Result<u64, String> {
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        return text
            .parse::<u64>()
            .map_err(|_| "too large for milliseconds since the epoch".to_owned());
    }
    let at: Timestamp = text.parse().map_err(|e: jiff::Error| e.to_string())?;
    if at < Timestamp::UNIX_EPOCH {
        return Err("before 1970".to_owned());
    }
    u64::try_from(at.as_millisecond()).map_err(|_| "before 1970".to_owned())
}

/// `2026-12-01T09:30:00.000Z`; beyond the year 9999, the milliseconds as they are.
pub fn format(ms: u64) -> String {
    match i64::try_from(ms).map(Timestamp::from_millisecond) {
        Ok(Ok(at)) => format!("{at:.3}"),
        _ => format!("{ms} ms after the Unix epoch"),
    }
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
            // ISO 8601's offset without a colon, and digits below the millisecond (dropped).
            ("2026-12-01T10:30:00+0100", 1_796_117_400_000),
            ("2026-12-01T09:30:00.123456789Z", 1_796_117_400_123),
            ("1796117400000", 1_796_117_400_000),
        ] {
            assert_eq!(parse(text), Ok(ms), "{text}");
        }
        assert_eq!(format(1_796_117_400_250), "2026-12-01T09:30:00.250Z");
        assert_eq!(format(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            format(u64::MAX),
            "18446744073709551615 ms after the Unix epoch"
        );
        for ms in [0, 951_782_400_000, 1_709_251_199_999, 4_102_444_800_000] {
            assert_eq!(parse(&format(ms)), Ok(ms));
        }
    }

    #[test]
    fn bad_times_say_why() {
        for (text, why) in [
            ("yesterday", "year"),
            (
                "2026-13-01T00:00:00Z",
                "'month' is not in the required range of 1..=12",
            ),
            ("2025-02-29T00:00:00Z", "'day' for `2025-02` is invalid"),
            (
                "2026-12-01T24:00:00Z",
                "'hour' is not in the required range",
            ),
            ("2026-12-01T09:30:00", "failed to find offset"),
            (
                "2026-12-01T09:30:00.Z",
                "did not find any digits after decimal",
            ),
            ("2026/12/01T09:30:00Z", "got /"),
            ("1969-12-31T23:59:59Z", "before 1970"),
            ("1969-12-31T23:59:59.9999Z", "before 1970"),
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
