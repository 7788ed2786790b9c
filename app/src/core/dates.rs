//! Dates named in text: the day a memory is about (from its metadata) and the days a search
//! query asks about ("on 9 November, 2022", "October 13, 2023", "in August 2023", "2023-05-08",
//! "in 2021"). Search favours memories whose day falls in the query's range.
use chrono::{Datelike, NaiveDate};
use serde_json::Value;

/// Days from `start` to `end`, both included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DayRange {
    pub start: NaiveDate,
    pub end: NaiveDate,
}

impl DayRange {
    fn day(d: NaiveDate) -> Self {
        Self { start: d, end: d }
    }

    fn month(year: i32, month: u32) -> Option<Self> {
        let start = NaiveDate::from_ymd_opt(year, month, 1)?;
        let next = if month == 12 {
            NaiveDate::from_ymd_opt(year + 1, 1, 1)?
        } else {
            NaiveDate::from_ymd_opt(year, month + 1, 1)?
        };
        Some(Self {
            start,
            end: next.pred_opt()?,
        })
    }

    fn year(year: i32) -> Option<Self> {
        Some(Self {
            start: NaiveDate::from_ymd_opt(year, 1, 1)?,
            end: NaiveDate::from_ymd_opt(year, 12, 31)?,
        })
    }

    /// How many days the range covers.
    pub fn days(&self) -> i64 {
        (self.end - self.start).num_days() + 1
    }
}

/// Metadata keys that may hold the day a memory is about, in the order they are tried.
pub const EVENT_KEYS: [&str; 5] = ["event_time", "event_date", "date", "timestamp", "time"];

/// The day a memory is about, from the first of [`EVENT_KEYS`] in its metadata that names a
/// whole day (an RFC 3339 or ISO date, or a written date such as "1:56 pm on 8 May, 2023").
pub fn event_day(metadata: Option<&Value>) -> Option<NaiveDate> {
    let object = metadata?.as_object()?;
    EVENT_KEYS.iter().find_map(|key| {
        let range = find_range(object.get(*key)?.as_str()?)?;
        (range.days() == 1).then_some(range.start)
    })
}

pub(crate) const MONTHS: [&str; 12] = [
    "january",
    "february",
    "march",
    "april",
    "may",
    "june",
    "july",
    "august",
    "september",
    "october",
    "november",
    "december",
];

/// A month's full name or its three-letter abbreviation ("Sept" too).
fn month_of(word: &str) -> Option<u32> {
    let w = word.to_ascii_lowercase();
    let i = MONTHS.iter().position(|m| {
        *m == w || (w.len() == 3 && m.starts_with(w.as_str())) || (w == "sept" && *m == "september")
    })?;
    Some(i as u32 + 1)
}

/// A day of the month: "9", "09", "9th", "1st".
fn day_of(word: &str) -> Option<u32> {
    let digits = word.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let suffix = &word[digits.len()..];
    if digits.is_empty()
        || digits.len() > 2
        || !digits.bytes().all(|b| b.is_ascii_digit())
        || !matches!(
            suffix.to_ascii_lowercase().as_str(),
            "" | "st" | "nd" | "rd" | "th"
        )
    {
        return None;
    }
    digits.parse().ok().filter(|d| (1..=31).contains(d))
}

fn year_of(word: &str) -> Option<i32> {
    (word.len() == 4 && word.bytes().all(|b| b.is_ascii_digit()))
        .then(|| word.parse().ok())
        .flatten()
        .filter(|y| (1900..=2100).contains(y))
}

/// `YYYY-MM-DD` at the start of `s`.
fn iso_day(s: &str) -> Option<NaiveDate> {
    let b = s.as_bytes();
    if b.len() < 10 || b[4] != b'-' || b[7] != b'-' {
        return None;
    }
    if b.len() > 10 && b[10].is_ascii_digit() {
        return None;
    }
    NaiveDate::from_ymd_opt(
        s[0..4].parse().ok()?,
        s[5..7].parse().ok()?,
        s[8..10].parse().ok()?,
    )
}

/// The first date named in `text`, as the days it covers: a day ("9 November, 2022",
/// "October 13, 2023", "2023-05-08"), a month ("August 2023") or a year ("in 2021").
pub fn find_range(text: &str) -> Option<DayRange> {
    for (i, _) in text.match_indices(|c: char| c.is_ascii_digit()) {
        if (i == 0 || !text.as_bytes()[i - 1].is_ascii_alphanumeric()) && i + 10 <= text.len() {
            if let Some(d) = text.get(i..).and_then(iso_day) {
                return Some(DayRange::day(d));
            }
        }
    }
    let words: Vec<&str> = text
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .collect();
    let at = |i: usize| words.get(i).copied().unwrap_or("");
    for i in 0..words.len() {
        // "9 November 2022", "9th of November, 2022"
        if let Some(day) = day_of(at(i)) {
            let m = if at(i + 1).eq_ignore_ascii_case("of") {
                i + 2
            } else {
                i + 1
            };
            if let (Some(month), Some(year)) = (month_of(at(m)), year_of(at(m + 1))) {
                if let Some(d) = NaiveDate::from_ymd_opt(year, month, day) {
                    return Some(DayRange::day(d));
                }
            }
        }
        if let Some(month) = month_of(at(i)) {
            // "November 9, 2022"
            if let (Some(day), Some(year)) = (day_of(at(i + 1)), year_of(at(i + 2))) {
                if let Some(d) = NaiveDate::from_ymd_opt(year, month, day) {
                    return Some(DayRange::day(d));
                }
            }
            // "November 2022"
            if let Some(year) = year_of(at(i + 1)) {
                return DayRange::month(year, month);
            }
        }
        if let Some(year) = year_of(at(i)) {
            return DayRange::year(year);
        }
    }
    None
}

/// The calendar day of a timestamp, in UTC.
pub fn utc_day(t: chrono::DateTime<chrono::Utc>) -> NaiveDate {
    NaiveDate::from_ymd_opt(t.year(), t.month(), t.day()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn day(y: i32, m: u32, d: u32) -> NaiveDate {
        NaiveDate::from_ymd_opt(y, m, d).unwrap()
    }

    #[test]
    fn written_and_iso_days_are_found() {
        for (text, expected) in [
            (
                "What dish did Nate make on 9 November, 2022?",
                day(2022, 11, 9),
            ),
            (
                "What did Caroline share on October 13, 2023?",
                day(2023, 10, 13),
            ),
            (
                "Where was the picture shared on December 1,2023 taken?",
                day(2023, 12, 1),
            ),
            ("1:56 pm on 8 May, 2023", day(2023, 5, 8)),
            ("the 3rd of Sept 2024", day(2024, 9, 3)),
            ("2023-05-08T13:56:00Z", day(2023, 5, 8)),
            ("logged 2021-12-31", day(2021, 12, 31)),
        ] {
            assert_eq!(find_range(text), Some(DayRange::day(expected)), "{text}");
        }
    }

    #[test]
    fn months_and_years_cover_their_days() {
        let august = find_range("What is John doing as a volunteer in August 2023?").unwrap();
        assert_eq!(
            (august.start, august.end),
            (day(2023, 8, 1), day(2023, 8, 31))
        );
        let feb = find_range("feb 2024").unwrap();
        assert_eq!(feb.end, day(2024, 2, 29));
        // An impossible day still names its month.
        let feb = find_range("31 February 2023").unwrap();
        assert_eq!((feb.start, feb.end), (day(2023, 2, 1), day(2023, 2, 28)));
        let year = find_range("How many times has Melanie gone to the beach in 2023?").unwrap();
        assert_eq!((year.start, year.end), (day(2023, 1, 1), day(2023, 12, 31)));
    }

    #[test]
    fn text_without_a_date_names_none() {
        for text in [
            "What may Caroline do next?",
            "I ran 5 km in 31 minutes",
            "serial XJ-4471",
            "",
        ] {
            assert_eq!(find_range(text), None, "{text}");
        }
    }

    #[test]
    fn the_event_day_comes_from_the_first_metadata_key_naming_a_day() {
        let m = json!({"session": 3, "event_time": "1:56 pm on 8 May, 2023"});
        assert_eq!(event_day(Some(&m)), Some(day(2023, 5, 8)));
        let m = json!({"date": "2022-01-02", "timestamp": "2020-01-01T00:00:00Z"});
        assert_eq!(event_day(Some(&m)), Some(day(2022, 1, 2)));
        // A month is not a day; numbers and other shapes are ignored.
        assert_eq!(event_day(Some(&json!({"date": "May 2023"}))), None);
        assert_eq!(event_day(Some(&json!({"timestamp": 1700000000}))), None);
        assert_eq!(event_day(Some(&json!([1, 2]))), None);
        assert_eq!(event_day(None), None);
    }
}
