//! A budget's window: fixed, aligned to the Unix epoch (`per = "1d"` runs from 00:00 to
//! 24:00 UTC, `"1h"` from the hour, `"2s"` from an even second), the same on every daemon,
//! so a fleet's shared counter and each daemon's reset agree without talking.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Which window a moment falls in, and when it ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Window {
    /// Windows since the epoch.
    pub index: u64,
    /// When it ends (and the next begins), in milliseconds since the epoch.
    pub ends_ms: u64,
}

impl Window {
    /// The window of `per` that `now_ms` (milliseconds since the epoch) falls in.
    pub(crate) fn at(per: Duration, now_ms: u64) -> Window {
        let per_ms = u64::try_from(per.as_millis()).unwrap_or(u64::MAX).max(1);
        let index = now_ms / per_ms;
        Window {
            index,
            ends_ms: index.saturating_add(1).saturating_mul(per_ms),
        }
    }

    /// Whole seconds until it ends, rounded up, at least 1 (a `Retry-After`).
    pub(crate) fn retry_after(&self, now_ms: u64) -> u64 {
        self.ends_ms.saturating_sub(now_ms).div_ceil(1000).max(1)
    }

    /// When it ends, RFC 3339 (UTC, milliseconds).
    pub(crate) fn resets(&self) -> String {
        let nanos = i128::from(self.ends_ms) * 1_000_000;
        match time::OffsetDateTime::from_unix_timestamp_nanos(nanos) {
            Ok(t) => crate::clock::rfc3339(t),
            Err(_) => "9999-12-31T23:59:59.999Z".into(),
        }
    }
}

/// Milliseconds since the epoch.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_align_to_the_epoch() {
        let day = Duration::from_secs(86_400);
        // 2026-12-07T05:40:00Z
        let t = 1_796_622_000_000;
        let w = Window::at(day, t);
        assert_eq!(w.resets(), "2026-12-08T00:00:00.000Z");
        assert_eq!(Window::at(day, w.ends_ms - 1), w);
        assert_eq!(Window::at(day, w.ends_ms).index, w.index + 1);
        let two = Window::at(Duration::from_secs(2), 5_500);
        assert_eq!((two.index, two.ends_ms), (2, 6_000));
        assert_eq!(two.retry_after(5_500), 1);
        assert_eq!(
            Window::at(Duration::from_secs(60), 1_000).retry_after(1_000),
            59
        );
    }
}
