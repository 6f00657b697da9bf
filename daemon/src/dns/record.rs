//! The record of a DNS decision. Volume is bounded by what is worth reading: every refusal
//! and failure is recorded (each is the agent asking for something the policy does not
//! allow, or the stub failing it), while an answered question is recorded once per agent,
//! name, type and response code for as long as its answer lives (its TTL, at least a minute,
//! at most an hour): a resolver library asking again and again for the same allowed name
//! says nothing new. A flood of refusals (a million distinct names no rule allows) is the
//! first in full and then a count: the audit log counts the same refusal from the same agent
//! within `audit.refusal_window`, whatever the name (`audit/repeats.rs`). The metric
//! `agenshield_proxy_dns_queries_total` counts every question.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hickory_resolver::proto::op::Query;

use super::answer::Outcome;
use super::message::{Asked, Asker};
use crate::dns_state::names::{MAX_TTL, MIN_TTL};
use crate::pipeline::record;
use crate::proxy::Proxy;
use crate::record::Dest;
use crate::record::{DnsFacts, ListenerKind, Record, RecordBase, Verdict};

/// Records `outcome` (or counts it only, for an answer recorded lately). `false`: the audit
/// log could not take a record that was due, and the answer must not be sent.
pub(super) async fn record(
    proxy: &Arc<Proxy>,
    asker: &Asker,
    asked: &Asked,
    query: Option<&Query>,
    outcome: &Outcome,
) -> bool {
    let verdict = outcome
        .refusal
        .as_ref()
        .map_or(Verdict::Allow, |r| r.verdict);
    proxy.dns.metrics.answered(verdict, outcome.rcode);
    let qtype = query.map(|q| q.query_type());
    if outcome.refusal.is_none() {
        let key = (
            asker.uid,
            Arc::<str>::from(outcome.host.as_str()),
            qtype.map_or(0, u16::from),
            u16::from(outcome.rcode),
        );
        let now = Instant::now();
        if proxy
            .dns
            .recorded
            .get(&key)
            .is_some_and(|until| until > now)
        {
            return true;
        }
        let ttl = Duration::from_secs(u64::from(outcome.ttl)).clamp(MIN_TTL, MAX_TTL);
        proxy.dns.recorded.insert(key, now + ttl);
    }
    let secrets = proxy.vault.current();
    // One base per question: a datagram is a connection of its own.
    let base = RecordBase::new(
        asker.conn_id,
        ListenerKind::Dns,
        asker.client,
        asker.uid,
        &Dest::from_addr(asker.dst),
        None,
        &secrets,
    );
    let reason = match (&outcome.refusal, &outcome.decision) {
        (Some(r), _) => Some(r.message.clone()),
        (None, Some(d)) => Some(d.explanation.clone()),
        (None, None) => None,
    };
    let rule = match (&outcome.refusal, &outcome.decision) {
        (Some(r), _) if r.rule_id.is_some() => r.rule_id.as_deref().map(Arc::from),
        (_, Some(d)) => d.rule_id.clone(),
        _ => None,
    };
    let facts = DnsFacts {
        qtype,
        rcode: outcome.rcode,
        answers: outcome.addrs.clone(),
    };
    let at = record::stamp(&asked.policy, Some(asked.at));
    let rec = Record {
        decision: verdict,
        rule,
        error_code: outcome.refusal.as_ref().map(|r| r.code),
        reason: reason.map(|r| {
            let r = secrets.redact(&r).into_owned();
            match &outcome.dlp {
                Some(_) => crate::dlp::shown(&r).into_owned(),
                None => r,
            }
        }),
        // Report mode answered a name enforcing would refuse: `ctl policy suggest` reads it.
        would_deny: outcome.decision.as_ref().is_some_and(|d| d.reported_deny),
        ms: record::ms_since(asked.started),
        dlp: outcome.dlp.clone(),
        ..base.query(
            match &outcome.dlp {
                // A credential in the name is not written.
                Some(_) => crate::dlp::shown(&secrets.redact(&outcome.host)).into(),
                None => secrets.redact(&outcome.host).into(),
            },
            facts,
            at,
        )
    };
    record::connection(proxy, rec).await
}
