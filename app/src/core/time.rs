//! Timestamps as the contract writes them: ISO 8601 UTC with milliseconds and a `Z`.
use chrono::{DateTime, SecondsFormat, Utc};

pub fn iso(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

pub fn iso_opt(t: Option<DateTime<Utc>>) -> Option<String> {
    t.map(iso)
}
