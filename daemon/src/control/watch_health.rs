//! How the policy watcher proves it really sees edits; what it found is its health
//! (`policy::WatchHealth`), which `ctl status` and `agenshield_proxy_policy_watch_active`
//! report.
//!
//! A watch that was set is no proof: events can be lost on the way (a path that never matches
//! the directory's, a filesystem whose changes bypass the watch). So the watcher proves it
//! with a probe: the daemon opens the policy directory, which inotify reports like any edit,
//! and the probe must be heard within [`PROBE_WAIT`]. It is sent at start, after every re-arm
//! and every [`PROBE_EVERY`]; any event from inside the directory counts as heard. Until one
//! is heard, or once one goes unheard, the watcher is not "active" (and says why); the
//! directory is compared every couple of seconds regardless, so edits still apply.

use std::time::Duration;

use tokio::time::Instant;

/// How long a probe may take to be heard before the watcher is taken for deaf.
pub(crate) const PROBE_WAIT: Duration = Duration::from_secs(3);

/// How often a watcher that is heard is probed again.
pub(crate) const PROBE_EVERY: Duration = Duration::from_secs(30);

/// What the probes have shown so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Liveness {
    /// No probe answered yet.
    Unknown,
    /// The last probe (or a later event) was heard.
    Heard,
    /// A probe went unheard for [`PROBE_WAIT`]: events are not arriving.
    Deaf,
}

/// The probe schedule and its verdicts; pure, so it is tested without a filesystem.
#[derive(Debug)]
pub(crate) struct Probe {
    /// When the probe now waiting to be heard was sent.
    pending: Option<Instant>,
    /// When the next probe is due.
    next: Instant,
    state: Liveness,
}

impl Probe {
    /// A schedule whose first probe is due at once.
    pub(crate) fn new(now: Instant) -> Probe {
        Probe {
            pending: None,
            next: now,
            state: Liveness::Unknown,
        }
    }

    pub(crate) fn state(&self) -> Liveness {
        self.state
    }

    /// A probe should be sent now.
    pub(crate) fn due(&self, now: Instant) -> bool {
        self.pending.is_none() && now >= self.next
    }

    pub(crate) fn sent(&mut self, now: Instant) {
        self.pending = Some(now);
        self.next = now + PROBE_EVERY;
    }

    /// The watch could not be set (the directory is gone): nothing is known, and nothing is
    /// probed, until a watch is set again (`rearmed`) and heard.
    pub(crate) fn lost(&mut self, now: Instant) {
        self.pending = None;
        self.state = Liveness::Unknown;
        self.next = now + Duration::from_secs(365 * 24 * 3600);
    }

    /// The watch was moved: probe it at once.
    pub(crate) fn rearmed(&mut self, now: Instant) {
        self.pending = None;
        self.next = now;
    }

    /// An event from inside the directory arrived. Returns the new state if it changed.
    pub(crate) fn heard(&mut self) -> Option<Liveness> {
        self.pending = None;
        self.become_(Liveness::Heard)
    }

    /// Declares the watcher deaf if the pending probe has waited [`PROBE_WAIT`].
    pub(crate) fn expire(&mut self, now: Instant) -> Option<Liveness> {
        match self.pending {
            Some(sent) if now.duration_since(sent) >= PROBE_WAIT => {
                self.pending = None;
                self.become_(Liveness::Deaf)
            }
            _ => None,
        }
    }

    /// How long until the pending probe expires (`None`: none pending).
    pub(crate) fn wait_left(&self, now: Instant) -> Option<Duration> {
        self.pending
            .map(|sent| PROBE_WAIT.saturating_sub(now.duration_since(sent)))
    }

    fn become_(&mut self, s: Liveness) -> Option<Liveness> {
        (self.state != s).then(|| {
            self.state = s;
            s
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_probe_heard_in_time_makes_the_watcher_heard() {
        let t0 = Instant::now();
        let mut p = Probe::new(t0);
        assert!(p.due(t0));
        p.sent(t0);
        assert!(!p.due(t0), "one probe at a time");
        assert_eq!(p.expire(t0 + Duration::from_secs(1)), None);
        assert_eq!(p.heard(), Some(Liveness::Heard));
        assert_eq!(p.heard(), None, "no change, no transition");
        assert_eq!(p.expire(t0 + PROBE_WAIT * 2), None, "nothing pending");
        assert!(!p.due(t0 + PROBE_EVERY - Duration::from_millis(1)));
        assert!(p.due(t0 + PROBE_EVERY));
    }

    #[tokio::test(start_paused = true)]
    async fn an_unheard_probe_makes_the_watcher_deaf_until_an_event_arrives() {
        let t0 = Instant::now();
        let mut p = Probe::new(t0);
        p.sent(t0);
        assert_eq!(
            p.wait_left(t0 + Duration::from_secs(1)),
            Some(PROBE_WAIT - Duration::from_secs(1))
        );
        assert_eq!(p.expire(t0 + PROBE_WAIT - Duration::from_millis(1)), None);
        assert_eq!(p.expire(t0 + PROBE_WAIT), Some(Liveness::Deaf));
        assert_eq!(p.state(), Liveness::Deaf);
        // Heard before: deaf as soon as a later probe goes unheard.
        let mut q = Probe::new(t0);
        q.sent(t0);
        q.heard();
        let t1 = t0 + PROBE_EVERY;
        q.sent(t1);
        assert_eq!(
            q.state(),
            Liveness::Heard,
            "still heard while the probe may come"
        );
        assert_eq!(q.expire(t1 + PROBE_WAIT), Some(Liveness::Deaf));
        // Any event from inside the directory proves it again.
        assert_eq!(q.heard(), Some(Liveness::Heard));
    }

    #[tokio::test(start_paused = true)]
    async fn a_watch_lost_and_set_again_is_heard_again() {
        let t0 = Instant::now();
        let mut p = Probe::new(t0);
        p.sent(t0);
        p.heard();
        p.lost(t0);
        assert_eq!(p.state(), Liveness::Unknown);
        assert!(
            !p.due(t0 + PROBE_EVERY * 10),
            "no probe of a directory not watched"
        );
        p.rearmed(t0);
        assert!(p.due(t0));
        p.sent(t0);
        assert_eq!(
            p.heard(),
            Some(Liveness::Heard),
            "a transition, so it is reported"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_rearmed_watch_is_probed_at_once() {
        let t0 = Instant::now();
        let mut p = Probe::new(t0);
        p.sent(t0);
        p.heard();
        assert!(!p.due(t0 + Duration::from_secs(1)));
        p.rearmed(t0 + Duration::from_secs(1));
        assert!(p.due(t0 + Duration::from_secs(1)));
    }
}
