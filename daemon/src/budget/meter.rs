//! One request's meter: it reads the response body as it goes to the agent (a tap that
//! passes every frame on at once, `Tap`), and once the request's record is completed it
//! settles: counts the tokens (the usage read, else the estimate), charges them to the
//! counter, and says what the record shows (`BudgetFacts`). Settling happens once, however
//! the request ended (complete, cut short, the client gone).

use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use super::decode::{Decoder, Plain};
use super::fleet::FleetCounter;
use super::json_scan::JsonScan;
use super::sse::SseScan;
use super::usage::Usage;
use super::{window, Standing, Subject, TokenBudgets};
use crate::body::{BodyError, ProxyBody};
use crate::policy::TokenBudget;
use crate::record::BudgetFacts;

/// How the response body is read.
#[derive(Debug, Default)]
enum Reader {
    /// No response (yet): nothing to read.
    #[default]
    None,
    Json(JsonScan),
    Sse(SseScan),
    /// A compressed body, decoded on the way.
    Decoded(super::decode::Decoder),
    /// A body it cannot read (a coding it does not know): estimated.
    Opaque,
}

#[derive(Debug, Default)]
struct Scan {
    reader: Reader,
    /// Response body bytes seen.
    down: u64,
}

/// What a request under a budget carries from its check to its record.
pub(crate) struct Meter {
    budgets: Arc<TokenBudgets>,
    rule: Arc<str>,
    budget: TokenBudget,
    subject: Subject,
    agent: String,
    /// The agent's uid (whose overflow counter a new host's spend may go to).
    uid: Option<u32>,
    /// The standing when the request was let through.
    before: Standing,
    /// A fleet-wide budget: where the tokens are added.
    fleet: Option<FleetCounter>,
    scan: Mutex<Scan>,
    settled: OnceLock<BudgetFacts>,
}

impl Meter {
    pub(crate) fn new(
        budgets: Arc<TokenBudgets>,
        rule: Arc<str>,
        budget: TokenBudget,
        subject: Subject,
        uid: Option<u32>,
        before: Standing,
        fleet: Option<FleetCounter>,
    ) -> Meter {
        Meter {
            budgets,
            rule,
            budget,
            subject,
            agent: super::agent_label(uid),
            uid,
            before,
            fleet,
            scan: Mutex::new(Scan::default()),
            settled: OnceLock::new(),
        }
    }

    /// The response's head arrived: how its body will be read.
    pub(crate) fn respond(&self, headers: &http::HeaderMap) {
        let header = |name| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(|v| v.trim().to_ascii_lowercase())
        };
        let coding =
            header(http::header::CONTENT_ENCODING).filter(|e| !e.is_empty() && e != "identity");
        let sse =
            header(http::header::CONTENT_TYPE).is_some_and(|t| t.starts_with("text/event-stream"));
        let plain = if sse {
            Plain::Sse(SseScan::default())
        } else {
            Plain::Json(JsonScan::default())
        };
        let reader = match (coding, plain) {
            (None, Plain::Sse(s)) => Reader::Sse(s),
            (None, Plain::Json(s)) => Reader::Json(s),
            (Some(c), plain) => Decoder::new(&c, plain).map_or(Reader::Opaque, Reader::Decoded),
        };
        self.lock().reader = reader;
    }

    /// A chunk of the response body on its way to the agent.
    pub(super) fn feed(&self, data: &[u8]) {
        let mut scan = self.lock();
        scan.down += data.len() as u64;
        match &mut scan.reader {
            Reader::Json(s) => s.feed(data),
            Reader::Sse(s) => s.feed(data),
            Reader::Decoded(d) => d.feed(data),
            Reader::None | Reader::Opaque => {}
        }
    }

    /// What the record shows at the decision, before the response: nothing counted yet.
    pub(crate) fn at_decision(&self) -> BudgetFacts {
        BudgetFacts {
            tokens: 0,
            estimated: false,
            spent: self.before.spent,
            limit: self.budget.tokens,
            resets: self.before.window.resets().into(),
        }
    }

    /// Counts this request's tokens (`up`: request body bytes sent) and charges them, once;
    /// what the record shows.
    pub(crate) fn settle(&self, up: u64) -> BudgetFacts {
        self.settled.get_or_init(|| self.charge(up)).clone()
    }

    fn charge(&self, up: u64) -> BudgetFacts {
        let (usage, down) = {
            let mut scan = self.lock();
            let usage: Option<Usage> = match &mut scan.reader {
                Reader::Json(s) => s.finish(),
                Reader::Sse(s) => s.finish(),
                Reader::Decoded(d) => d.finish(),
                Reader::None | Reader::Opaque => None,
            };
            (usage, scan.down)
        };
        let (tokens, estimated) = match usage.and_then(|u| u.tokens()) {
            Some(t) => (t, false),
            // Nothing went up and nothing came back (refused by a later phase): nothing spent.
            None if up == 0 && down == 0 => (0, false),
            None => (up.saturating_add(down).div_ceil(4), true),
        };
        let now = window::now_ms();
        let standing = match &self.fleet {
            // The fleet's count moves on the store; this daemon knows its own part now.
            Some(fleet) => {
                let seen = self.before.spent.saturating_add(tokens);
                let standing = self
                    .budgets
                    .seen(&self.rule, self.budget, &self.subject, seen, now);
                fleet.add_later(self.budgets.clone(), self.rule.clone(), self.budget, tokens);
                standing
            }
            None => self.budgets.charge(
                &self.rule,
                self.budget,
                &self.subject,
                self.uid,
                tokens,
                now,
            ),
        };
        let m = &self.budgets.metrics;
        m.counted(&self.rule, &self.agent, tokens, estimated);
        let left = self.budget.tokens.saturating_sub(standing.spent);
        match self.subject {
            Subject::Agent(_) => m.remaining(&self.rule, &self.agent, left),
            Subject::Fleet => m.remaining(&self.rule, "fleet", left),
            Subject::Host(_) | Subject::Overflow(_) => {}
        }
        BudgetFacts {
            tokens,
            estimated,
            spent: standing.spent,
            limit: self.budget.tokens,
            resets: standing.window.resets().into(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Scan> {
        self.scan.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The response body, read by `meter` on its way: every frame passes on as it comes.
pub(crate) fn tap(body: ProxyBody, meter: Arc<Meter>) -> ProxyBody {
    http_body_util::BodyExt::boxed(Tap { inner: body, meter })
}

struct Tap {
    inner: ProxyBody,
    meter: Arc<Meter>,
}

impl Body for Tap {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let frame = ready!(Pin::new(&mut self.inner).poll_frame(cx));
        if let Some(Ok(f)) = &frame {
            if let Some(d) = f.data_ref() {
                self.meter.feed(d);
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
