//! The 431s the HTTP/2 layer sends by itself, counted so that each is recorded.
//!
//! A request head over the HTTP server's cap (`http::server_head_cap`, twice
//! `limits.max_header_bytes`) never becomes a request: h2 decodes the header block, finds it
//! over `SETTINGS_MAX_HEADER_LIST_SIZE`, answers that stream a bare 431 and resets it, the
//! connection staying usable. Neither h2 nor hyper reports it to the server (no callback, no
//! error), and HTTP/1.1's counterpart is recorded (`http::unparsed`). The one trace h2 leaves
//! is a `debug` event from `h2::proto::streams::recv` ("stream error
//! REQUEST_HEADER_FIELDS_TOO_LARGE -- recv_headers: frame is over size"), emitted while the
//! connection's future is polled, on the thread polling it. So:
//!
//! - [`layer`] is a tracing layer, filtered to that one module at `debug` whatever the
//!   operator's log filter, that counts such events per thread;
//! - [`counting`] polls a connection's future and reports how many arrived during each poll,
//!   which are that connection's (a thread polls one future at a time; one poll of another
//!   connection, or of an upstream HTTP/2 client, is another poll).
//!
//! `tests/tests/e2e/records.rs` (`an_oversized_head_over_http2_…`) fails if an h2 release changes
//! the event: the 431 would then go unrecorded.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tracing::field::{Field, Visit};
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::layer::{Filter, Layer};

/// The h2 module that answers an over-size header block.
const TARGET: &str = "h2::proto::streams::recv";
/// How its event begins.
const MESSAGE: &str = "stream error REQUEST_HEADER_FIELDS_TOO_LARGE";

thread_local! {
    /// Over-size header blocks h2 answered on this thread, ever.
    static ANSWERED: Cell<u64> = const { Cell::new(0) };
}

/// The layer that counts h2's own 431s, with its filter: install it beside the log output.
pub(crate) fn layer<S>() -> impl Layer<S>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    Counter.with_filter(filter())
}

fn filter<S>() -> impl Filter<S> {
    Targets::new().with_target(TARGET, LevelFilter::DEBUG)
}

struct Counter;

impl<S: tracing::Subscriber> Layer<S> for Counter {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        let mut is_431 = IsOwn431(false);
        event.record(&mut is_431);
        if is_431.0 {
            ANSWERED.with(|n| n.set(n.get() + 1));
        }
    }
}

/// Whether an event's message is h2's over-size answer.
struct IsOwn431(bool);

impl Visit for IsOwn431 {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}").starts_with(MESSAGE);
        }
    }
}

/// Polls `fut`, calling `answered(n)` after each poll in which h2 answered `n` over-size
/// header blocks.
pub(super) async fn counting<F: Future>(fut: F, mut answered: impl FnMut(u64)) -> F::Output {
    let mut fut = std::pin::pin!(fut);
    std::future::poll_fn(move |cx: &mut Context<'_>| {
        let before = ANSWERED.with(Cell::get);
        let out: Poll<F::Output> = Pin::as_mut(&mut fut).poll(cx);
        let n = ANSWERED.with(Cell::get) - before;
        if n > 0 {
            answered(n);
        }
        out
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing_subscriber::prelude::*;

    #[test]
    fn only_h2s_over_size_answer_counts_and_only_during_the_poll() {
        let subscriber = tracing_subscriber::registry().with(layer());
        tracing::subscriber::with_default(subscriber, || {
            let mut seen = Vec::new();
            let fut = counting(
                async {
                    tracing::debug!(target: "h2::proto::streams::recv",
                        "stream error REQUEST_HEADER_FIELDS_TOO_LARGE -- recv_headers: frame is \
                         over size; stream={:?}", 3);
                    tracing::debug!(target: "h2::proto::streams::recv", "recv_reset");
                    tracing::debug!(target: "agenshield_proxy",
                        "stream error REQUEST_HEADER_FIELDS_TOO_LARGE");
                },
                |n| seen.push(n),
            );
            futures_util::FutureExt::now_or_never(fut).expect("ready");
            assert_eq!(seen, vec![1]);
            // Outside any counted poll: nobody's.
            tracing::debug!(target: "h2::proto::streams::recv",
                "stream error REQUEST_HEADER_FIELDS_TOO_LARGE -- stream=5");
            let mut later = Vec::new();
            futures_util::FutureExt::now_or_never(counting(async {}, |n| later.push(n)));
            assert!(later.is_empty());
        });
    }
}
