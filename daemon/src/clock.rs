//! Wall-clock time as records, events and the audit envelope show it: RFC 3339, UTC,
//! milliseconds (`2026-11-23T10:00:00.012Z`). Taking the time is cheap and formatting it is
//! not, so a connection notes when it arrived and formats that only if a record needs it.

use time::OffsetDateTime;

/// Now, formatted. Every request takes the time at least twice (its start, its audit
/// line), tens of thousands of times a second, and the text changes once a millisecond: each
/// thread keeps the last one it made and formats again only when the millisecond moved.
pub(crate) fn now_rfc3339() -> String {
    thread_local! {
        static LAST: std::cell::RefCell<(i128, String)> =
            const { std::cell::RefCell::new((i128::MIN, String::new())) };
    }
    let now = OffsetDateTime::now_utc();
    let ms = now.unix_timestamp_nanos() / 1_000_000;
    LAST.with(|last| {
        let mut last = last.borrow_mut();
        if last.0 != ms {
            *last = (ms, rfc3339(now));
        }
        last.1.clone()
    })
}

/// `d` from now, formatted.
pub(crate) fn rfc3339_after(d: std::time::Duration) -> String {
    rfc3339(OffsetDateTime::now_utc() + d)
}

/// `t` (taken with `OffsetDateTime::now_utc`), formatted.
pub(crate) fn rfc3339(t: OffsetDateTime) -> String {
    let t = t.to_offset(time::UtcOffset::UTC);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second(),
        t.millisecond()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn milliseconds_always_three_digits_and_utc() {
        let t = time::Date::from_calendar_date(2026, time::Month::November, 3)
            .and_then(|d| d.with_hms_nano(4, 5, 6, 7_891_234))
            .expect("a time")
            .assume_utc();
        assert_eq!(rfc3339(t), "2026-11-03T04:05:06.007Z");
        let east = t.to_offset(time::UtcOffset::from_hms(2, 0, 0).expect("offset"));
        assert_eq!(rfc3339(east), "2026-11-03T04:05:06.007Z");
        assert_eq!(now_rfc3339().len(), 24);
    }

    #[test]
    fn now_is_formatted_again_when_the_millisecond_moves() {
        let parse = |s: &str| {
            OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339)
                .expect("rfc3339")
        };
        let first = now_rfc3339();
        std::thread::sleep(std::time::Duration::from_millis(3));
        let second = now_rfc3339();
        let gap = parse(&second) - parse(&first);
        assert!(
            gap >= time::Duration::milliseconds(3) && gap < time::Duration::seconds(5),
            "{first} then {second}"
        );
        // Within one millisecond the same text comes back (or the next millisecond's).
        let (a, b) = (now_rfc3339(), now_rfc3339());
        assert!(parse(&b) - parse(&a) <= time::Duration::milliseconds(1));
    }
}
