//! `ctl tail [-f]`: the daemon's recent decisions, then (with `-f`) each new one, one line
//! each, in time order. The daemon sends records as they are written, which is when each
//! decision ends: a long request that started first comes after short ones that started
//! later. So lines are held briefly ([`REORDER`] with `-f`; until the end without) and let out
//! in order of when they happened. With `-f`, the feed ending means the daemon stopped or is
//! restarting: that is said, and the exit code is 1.

use std::collections::VecDeque;
use std::io::Write;
use std::time::{Duration, Instant};

use http::Method;
use http_body_util::BodyExt;

use super::{escape, fail, render, Client, CtlError, FAILED, OK};

/// How long a followed line waits for earlier ones that are still being written.
const REORDER: Duration = Duration::from_millis(500);

pub(super) async fn run(
    client: &Client,
    follow: bool,
    lines: Option<usize>,
    decision: Option<String>,
    host: Option<String>,
    json: bool,
) -> u8 {
    let mut path = format!("/v1/tail?follow={}", u8::from(follow));
    if let Some(n) = lines {
        path.push_str(&format!("&n={n}"));
    }
    for (k, v) in [("decision", decision), ("host", host)] {
        if let Some(v) = v {
            let enc = percent_encoding::utf8_percent_encode(&v, percent_encoding::NON_ALPHANUMERIC);
            path.push_str(&format!("&{k}={enc}"));
        }
    }
    let (status, mut body) = match client.send(Method::GET, &path, None).await {
        Ok(r) => r,
        Err(e) => return fail(e),
    };
    if !status.is_success() {
        let text = match body.collect().await {
            Ok(b) => serde_json::from_slice::<serde_json::Value>(&b.to_bytes())
                .ok()
                .and_then(|v| v["error"].as_str().map(str::to_string)),
            Err(_) => None,
        };
        let msg = format!("tail: {}", text.unwrap_or_else(|| format!("HTTP {status}")));
        return fail(if status == http::StatusCode::BAD_REQUEST {
            CtlError::BadInput(msg)
        } else {
            CtlError::Refused(msg)
        });
    }
    let hold = if follow { REORDER } else { Duration::MAX };
    let mut order = Reorder::default();
    let mut pending = Vec::new();
    let mut out = std::io::stdout().lock();
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let ended = loop {
        tokio::select! {
            frame = body.frame() => match frame {
                Some(Ok(frame)) => {
                    if let Some(data) = frame.data_ref() {
                        pending.extend_from_slice(data);
                        while let Some(nl) = pending.iter().position(|b| *b == b'\n') {
                            let line: Vec<u8> = pending.drain(..=nl).collect();
                            order.push(&line);
                        }
                    }
                }
                Some(Err(e)) => break e.to_string(),
                None => break "the daemon closed it".to_string(),
            },
            _ = tick.tick(), if follow => {}
        }
        for held in order.due(hold) {
            if !show(&mut out, &held, json) {
                return OK; // stdout closed (e.g. piped into head)
            }
        }
    };
    for held in order.due(Duration::ZERO) {
        if !show(&mut out, &held, json) {
            return OK;
        }
    }
    if follow {
        eprintln!(
            "agenshield: the live feed ended ({ended}): the daemon stopped or is restarting; \
             `agenshield proxy ctl status` says whether it runs"
        );
        return FAILED;
    }
    OK
}

/// Writes one line; `false` when stdout is gone.
fn show(out: &mut std::io::StdoutLock<'_>, held: &Held, json: bool) -> bool {
    let text = if json {
        held.raw.clone()
    } else {
        escape::render_safely(&held.value, render::event)
    };
    writeln!(out, "{text}").and_then(|()| out.flush()).is_ok()
}

/// One record waiting to be shown.
struct Held {
    when: Option<time::OffsetDateTime>,
    seq: u64,
    arrived: Instant,
    raw: String,
    value: serde_json::Value,
}

/// Records held until their time comes, let out in the order they happened.
#[derive(Default)]
struct Reorder {
    held: VecDeque<Held>,
    seq: u64,
}

impl Reorder {
    fn push(&mut self, line: &[u8]) {
        let Ok(value) = serde_json::from_slice::<serde_json::Value>(line) else {
            return;
        };
        self.seq += 1;
        let held = Held {
            when: render::when(&value),
            seq: self.seq,
            arrived: Instant::now(),
            raw: String::from_utf8_lossy(line).trim_end().to_string(),
            value,
        };
        // Kept sorted by (time, arrival): most lines arrive in order, so from the back.
        let at = self
            .held
            .iter()
            .rposition(|h| (h.when, h.seq) <= (held.when, held.seq))
            .map_or(0, |i| i + 1);
        self.held.insert(at, held);
    }

    /// The lines that have waited `hold` (and every earlier one), in time order.
    fn due(&mut self, hold: Duration) -> Vec<Held> {
        let mut out = Vec::new();
        while self
            .held
            .front()
            .is_some_and(|h| hold.is_zero() || h.arrived.elapsed() >= hold)
        {
            out.extend(self.held.pop_front());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(kind: &str, started: &str, ms: f64, host: &str) -> Vec<u8> {
        let v = serde_json::json!({"kind": kind, "started": started, "ms": ms, "host": host});
        let mut b = serde_json::to_vec(&v).expect("json");
        b.push(b'\n');
        b
    }

    #[test]
    fn lines_come_out_in_the_order_their_decisions_happened() {
        let mut r = Reorder::default();
        // Written in the order the decisions ended.
        r.push(&line("request", "2026-01-02T03:04:05.300Z", 1.0, "short"));
        r.push(&line("request", "2026-01-02T03:04:05.100Z", 900.0, "long"));
        r.push(&line("close", "2026-01-02T03:04:04.000Z", 1500.0, "tunnel"));
        r.push(&line("query", "2026-01-02T03:04:05.200Z", 0.0, "dns"));
        assert!(r.due(Duration::from_secs(60)).is_empty(), "held");
        let hosts: Vec<String> = r
            .due(Duration::ZERO)
            .iter()
            .map(|h| h.value["host"].as_str().unwrap_or("").to_string())
            .collect();
        assert_eq!(hosts, ["long", "dns", "short", "tunnel"]);
    }
}
