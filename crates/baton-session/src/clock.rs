//! UTC calendar time from the system clock, enough for RFC 3339 stamps and file names;
//! a date crate would be a dependency for two format strings.

use std::time::{SystemTime, UNIX_EPOCH};

/// A UTC time of day on a civil date, to the second.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UtcTime {
    pub year: i64,
    pub month: u32,
    pub day: u32,
    pub hour: u32,
    pub minute: u32,
    pub second: u32,
}

impl UtcTime {
    pub fn now() -> Self {
        // A clock before 1970 is a misconfigured machine; the epoch is as good a stamp.
        let secs = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        Self::from_unix(secs as i64)
    }

    pub fn from_unix(secs: i64) -> Self {
        let days = secs.div_euclid(86_400);
        let of_day = secs.rem_euclid(86_400);
        let (year, month, day) = civil_from_days(days);
        Self {
            year,
            month,
            day,
            hour: (of_day / 3600) as u32,
            minute: (of_day % 3600 / 60) as u32,
            second: (of_day % 60) as u32,
        }
    }

    /// `2026-11-30T14:05:00Z`
    pub fn rfc3339(&self) -> String {
        self.format(':')
    }

    /// `2026-11-30T14-05-00Z`: colons are not allowed in file names everywhere.
    pub fn file_stamp(&self) -> String {
        self.format('-')
    }

    fn format(&self, time_sep: char) -> String {
        format!(
            "{:04}-{:02}-{:02}T{:02}{sep}{:02}{sep}{:02}Z",
            self.year,
            self.month,
            self.day,
            self.hour,
            self.minute,
            self.second,
            sep = time_sep
        )
    }
}

/// Days since 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_instants_format_as_utc() {
        assert_eq!(UtcTime::from_unix(0).rfc3339(), "1970-01-01T00:00:00Z");
        // 2000-02-29 is a leap day in a century year divisible by 400.
        assert_eq!(
            UtcTime::from_unix(951_782_400 + 3_661).rfc3339(),
            "2000-02-29T01:01:01Z"
        );
        assert_eq!(
            UtcTime::from_unix(1_795_961_100).file_stamp(),
            "2026-11-29T14-05-00Z"
        );
        assert_eq!(UtcTime::from_unix(-1).rfc3339(), "1969-12-31T23:59:59Z");
    }
}
