//! One DNS question, decided and answered: the secret guard on the name, the policy
//! (`Policy::decide_name`), the question's type, then our own resolver and the
//! private-address guard on what it returns. Nothing about a name leaves the machine unless
//! the policy could allow a connection to it: a name no rule allows, and a name only an `ask`
//! rule covers, are answered here (a synthetic address, or NXDOMAIN).

use std::net::{IpAddr, SocketAddr};

use hickory_resolver::proto::op::{Query, ResponseCode};
use hickory_resolver::proto::rr::rdata::svcb::{IpHint, SvcParamKey, SvcParamValue, SVCB};
use hickory_resolver::proto::rr::rdata::HTTPS;
use hickory_resolver::proto::rr::{DNSClass, RData, Record, RecordType};

use crate::config::DeniedAnswer;
use crate::pipeline::dlp::DlpPhase;
use crate::pipeline::refusal::Refusal;
use crate::pipeline::secrets::{Head, SecretPhase};
use crate::pipeline::{record, secrets};
use crate::policy::{Action, Decision, Policy};
use crate::proxy::Proxy;
use crate::record::ErrorCode;
use crate::secrets::placeholder;
use crate::upstream::guard::AddressGuard;
use crate::upstream::resolve::Answer;

/// The types answered for a name the policy could allow. Addresses (A, AAAA) and what leads
/// to them (CNAME; HTTPS and SVCB, without ECH and with their address hints guarded; SRV and
/// MX, whose targets are names decided again when looked up), plus TXT and CAA, which name
/// nothing to connect to. Anything else (ANY, PTR of an allowed name, NS, SOA, NULL,
/// zone transfers…) is refused: the agent's tools do not need it to connect.
pub(crate) const ANSWERED: [RecordType; 9] = [
    RecordType::A,
    RecordType::AAAA,
    RecordType::CNAME,
    RecordType::HTTPS,
    RecordType::SVCB,
    RecordType::SRV,
    RecordType::MX,
    RecordType::TXT,
    RecordType::CAA,
];

/// How a question was answered.
#[derive(Debug)]
pub(crate) struct Outcome {
    /// The name as the record shows it: normalized when it could be, else as asked (escaped).
    pub host: String,
    pub rcode: ResponseCode,
    /// The answer section.
    pub answers: Vec<Record>,
    /// The addresses given (A and AAAA answers that passed the guard).
    pub addrs: Vec<IpAddr>,
    /// The smallest TTL of the answers (0 when none).
    pub ttl: u32,
    /// The policy's verdict on the name, when one was asked.
    pub decision: Option<Decision>,
    /// Why it was refused or failed; `None` when answered.
    pub refusal: Option<Refusal>,
    /// Credentials found in the name (`docs/dlp.md`), for the record.
    pub dlp: Option<crate::record::DlpFacts>,
}

impl Outcome {
    /// Refused (or failed) before anything was answered.
    pub(super) fn refused(host: String, rcode: ResponseCode, refusal: Refusal) -> Outcome {
        Outcome {
            host,
            rcode,
            answers: Vec::new(),
            addrs: Vec::new(),
            ttl: 0,
            decision: None,
            refusal: Some(refusal),
            dlp: None,
        }
    }
}

/// Decides and answers `query`, asked by `agent`.
pub(crate) async fn answer(
    proxy: &Proxy,
    policy: &Policy,
    query: &Query,
    agent: Option<u32>,
) -> Outcome {
    let asked = query.name().to_ascii();
    let asked = asked.strip_suffix('.').unwrap_or(&asked).to_string();
    if let Some(r) = secret_in(proxy, &asked) {
        return Outcome::refused(asked, ResponseCode::Refused, r);
    }
    if query.query_class() != DNSClass::IN {
        let r = Refusal::new(
            ErrorCode::QueryTypeRefused,
            format!("class {} is not answered (only IN)", query.query_class()),
        );
        return Outcome::refused(asked, ResponseCode::Refused, r);
    }
    let decision = policy.decide_name(&asked, agent);
    let asked_name = asked.clone();
    let normalized = crate::policy::normalize_host(&asked);
    let is_host = normalized.is_ok();
    let host = normalized.unwrap_or(asked);
    let rtype = query.query_type();
    if decision.action == Action::Deny {
        let r = Refusal {
            rule_id: decision.rule_id.as_deref().map(str::to_string),
            ..Refusal::new(
                if decision.unavailable {
                    ErrorCode::PolicyUnavailable
                } else {
                    ErrorCode::PolicyDenied
                },
                decision.explanation.clone(),
            )
        };
        let nxdomain = Outcome {
            decision: Some(decision),
            ..Outcome::refused(host, ResponseCode::NXDomain, r)
        };
        return match proxy.dns.denied {
            DeniedAnswer::Synthetic if is_host => denied(proxy, agent, rtype, nxdomain),
            _ => nxdomain,
        };
    }
    // A name is a place too: a credential in it would leave with the question.
    let dlp = match DlpPhase::new(decision.dlp.as_deref(), &host) {
        None => None,
        Some(check) => {
            let mut scratch = crate::dlp::Findings::default();
            let verdict = check.scan(
                asked_name.as_bytes(),
                crate::dlp::Place::DnsName,
                &mut scratch,
            );
            if let Err(b) = verdict {
                let r = b.refusal(&host, decision.rule_id.as_deref());
                return Outcome {
                    dlp: check.facts(),
                    decision: Some(decision),
                    ..Outcome::refused(host, ResponseCode::Refused, r)
                };
            }
            check.facts()
        }
    };
    if !ANSWERED.contains(&rtype) {
        let r = Refusal::new(
            ErrorCode::QueryTypeRefused,
            format!(
                "{rtype} questions are not answered; {}",
                decision.explanation
            ),
        );
        return Outcome {
            decision: Some(decision),
            ..Outcome::refused(host, ResponseCode::Refused, r)
        };
    }
    if decision.action == Action::Ask {
        return synthetic(proxy, agent, host, rtype, decision);
    }
    // Our resolver asks on the agent's behalf: only while the audit log can record it.
    if let Err(r) = record::ready(proxy) {
        return Outcome {
            decision: Some(decision),
            ..Outcome::refused(host, ResponseCode::ServFail, r)
        };
    }
    let resolved = proxy.dialer.resolver().records(&host, rtype).await;
    let (rcode, records) = match resolved {
        Ok(Answer::Records(records)) => (ResponseCode::NoError, records),
        Ok(Answer::NoData) => (ResponseCode::NoError, Vec::new()),
        Ok(Answer::NxDomain) => (ResponseCode::NXDomain, Vec::new()),
        Err(e) => {
            let r = Refusal::new(ErrorCode::UpstreamDns, e.to_string());
            return Outcome {
                decision: Some(decision),
                ..Outcome::refused(host, ResponseCode::ServFail, r)
            };
        }
    };
    let (answers, addrs, forbidden) = guarded(records, proxy.dialer.guard());
    if addrs.is_empty() && !forbidden.is_empty() {
        let list: Vec<String> = forbidden.iter().map(ToString::to_string).collect();
        let r = Refusal::new(
            ErrorCode::DestinationForbidden,
            format!(
                "{host} resolves only to addresses the proxy would refuse to dial ({}); see \
                 upstream.allow_private",
                list.join(", ")
            ),
        );
        return Outcome {
            decision: Some(decision),
            ..Outcome::refused(host, ResponseCode::Refused, r)
        };
    }
    let ttl = answers.iter().map(|r| r.ttl).min().unwrap_or(0);
    Outcome {
        host,
        rcode,
        answers,
        addrs,
        ttl,
        decision: Some(decision),
        refusal: None,
        dlp,
    }
}

/// A name only an `ask` rule covers, answered without asking anyone: an A question gets the
/// synthetic address standing for the name (the connection to it comes back to the proxy,
/// which asks the operator then); any other type an empty answer (clients go on with A).
fn synthetic(
    proxy: &Proxy,
    agent: Option<u32>,
    host: String,
    rtype: RecordType,
    decision: Decision,
) -> Outcome {
    let none = Outcome {
        host: host.clone(),
        rcode: ResponseCode::NoError,
        answers: Vec::new(),
        addrs: Vec::new(),
        ttl: 0,
        decision: Some(decision),
        refusal: None,
        dlp: None,
    };
    if rtype != RecordType::A {
        return none;
    }
    match synthetic_answer(proxy, agent, &host) {
        Ok((record, ip)) => Outcome {
            answers: vec![record],
            addrs: vec![ip],
            ttl: crate::dns_state::synthetic::TTL,
            ..none
        },
        Err((rcode, r)) => Outcome {
            decision: none.decision,
            ..Outcome::refused(host, rcode, r)
        },
    }
}

/// A name no rule allows (`dns.denied = "synthetic"`, the default), answered as an `ask`
/// name is, without asking anyone: an A question gets the synthetic address standing for the
/// name, any other type an empty answer. The connection that follows comes back through the
/// redirect, and the agent is told which rule refused it (a JSON 403 over HTTP) instead of
/// failing a lookup as for a typo. Still a refusal, recorded as one. `nxdomain` (that
/// refusal as NXDOMAIN) is the answer when no synthetic address is free.
fn denied(proxy: &Proxy, agent: Option<u32>, rtype: RecordType, nxdomain: Outcome) -> Outcome {
    let answered = Outcome {
        rcode: ResponseCode::NoError,
        ..nxdomain
    };
    if rtype != RecordType::A {
        return answered;
    }
    match synthetic_answer(proxy, agent, &answered.host) {
        Ok((record, ip)) => Outcome {
            answers: vec![record],
            addrs: vec![ip],
            ttl: crate::dns_state::synthetic::TTL,
            ..answered
        },
        Err(_) => Outcome {
            rcode: ResponseCode::NXDomain,
            ..answered
        },
    }
}

/// The A record giving `host` its synthetic address for `agent`, or why there is none (and
/// the response code that says so).
fn synthetic_answer(
    proxy: &Proxy,
    agent: Option<u32>,
    host: &str,
) -> Result<(Record, IpAddr), (ResponseCode, Refusal)> {
    let Some(ip) = proxy.dns.synthetic.address(agent, host) else {
        let r = Refusal::new(
            ErrorCode::Busy,
            format!("no synthetic address is free for {host} (this agent holds them all)"),
        );
        return Err((ResponseCode::ServFail, r));
    };
    let Ok(name) = hickory_resolver::proto::rr::Name::from_ascii(format!("{host}.")) else {
        let r = Refusal::new(ErrorCode::BadRequest, format!("{host:?} is no DNS name"));
        return Err((ResponseCode::FormErr, r));
    };
    let record = Record::from_rdata(
        name,
        crate::dns_state::synthetic::TTL,
        RData::A(hickory_resolver::proto::rr::rdata::A(ip)),
    );
    Ok((record, IpAddr::V4(ip)))
}

/// A secret's value or placeholder in the name: the query would carry it to whoever answers
/// for the domain. Checked as asked and with the dots taken out (a value longer than a label,
/// 63 bytes, must be split across labels).
fn secret_in(proxy: &Proxy, name: &str) -> Option<Refusal> {
    // With no secret held there is no value to find (the placeholder check below remains).
    let joined = if proxy.vault.current().is_empty() {
        None
    } else {
        Some(name.replace('.', ""))
    };
    for text in [Some(name), joined.as_deref()].into_iter().flatten() {
        let head = Head {
            method: "",
            host: text,
            headers: &http::HeaderMap::new(),
            path_and_query: "",
            tls: false,
            upgrade: None,
        };
        if let Err(e) = SecretPhase::inspect(&proxy.vault, None, &head) {
            return Some(secrets::refusal(&e, None));
        }
    }
    let lower = name.to_ascii_lowercase();
    lower.contains(placeholder::PREFIX).then(|| {
        Refusal::new(
            ErrorCode::SecretScope,
            "the query name carries a secret placeholder; no secret is bound to DNS",
        )
    })
}

/// The answer section with every address checked as a dial would check it: A and AAAA
/// records the guard refuses are dropped, HTTPS/SVCB lose their ECH configuration (it would
/// hide the server name the policy decides on) and refused address hints. Also the
/// addresses kept, and those dropped.
fn guarded(records: Vec<Record>, guard: &AddressGuard) -> (Vec<Record>, Vec<IpAddr>, Vec<IpAddr>) {
    let mut kept = Vec::with_capacity(records.len());
    let (mut addrs, mut forbidden) = (Vec::new(), Vec::new());
    let allowed = |ip: IpAddr| guard.check(SocketAddr::new(ip, 0)).is_ok();
    for mut r in records {
        let ip = match &r.data {
            RData::A(a) => Some(IpAddr::V4(a.0)),
            RData::AAAA(a) => Some(IpAddr::V6(a.0)),
            _ => None,
        };
        match ip {
            Some(ip) if allowed(ip) => addrs.push(ip),
            Some(ip) => {
                forbidden.push(ip);
                continue;
            }
            None => {}
        }
        r.data = match r.data {
            RData::HTTPS(HTTPS(svcb)) => RData::HTTPS(HTTPS(sanitized(svcb, &allowed))),
            RData::SVCB(svcb) => RData::SVCB(sanitized(svcb, &allowed)),
            other => other,
        };
        kept.push(r);
    }
    (kept, addrs, forbidden)
}

fn sanitized(mut svcb: SVCB, allowed: &dyn Fn(IpAddr) -> bool) -> SVCB {
    svcb.svc_params.retain_mut(|(key, value)| match value {
        SvcParamValue::EchConfigList(_) => false,
        SvcParamValue::Ipv4Hint(IpHint(hints)) => {
            hints.retain(|a| allowed(IpAddr::V4(a.0)));
            !hints.is_empty()
        }
        SvcParamValue::Ipv6Hint(IpHint(hints)) => {
            hints.retain(|a| allowed(IpAddr::V6(a.0)));
            !hints.is_empty()
        }
        _ => !matches!(key, SvcParamKey::EchConfigList),
    });
    svcb
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_resolver::proto::rr::rdata::svcb::{Alpn, EchConfigList};
    use hickory_resolver::proto::rr::rdata::{A, AAAA};
    use hickory_resolver::proto::rr::Name;

    fn name() -> Name {
        Name::from_ascii("svc.test.").expect("name")
    }

    #[test]
    fn the_guard_drops_private_addresses_ech_and_private_hints() {
        let guard = AddressGuard::new(Vec::new(), Vec::new());
        let svcb = SVCB::new(
            1,
            Name::root(),
            vec![
                (
                    SvcParamKey::Alpn,
                    SvcParamValue::Alpn(Alpn(vec!["h2".into()])),
                ),
                (
                    SvcParamKey::Ipv4Hint,
                    SvcParamValue::Ipv4Hint(IpHint(vec![
                        A([192, 0, 2, 1].into()),
                        A([10, 0, 0, 1].into()),
                    ])),
                ),
                (
                    SvcParamKey::EchConfigList,
                    SvcParamValue::EchConfigList(EchConfigList(vec![1, 2, 3])),
                ),
                (
                    SvcParamKey::Ipv6Hint,
                    SvcParamValue::Ipv6Hint(IpHint(vec![AAAA("fd00::1".parse().expect("ip"))])),
                ),
            ],
        );
        let records = vec![
            Record::from_rdata(name(), 300, RData::A(A([93, 184, 216, 34].into()))),
            Record::from_rdata(name(), 60, RData::A(A([127, 0, 0, 1].into()))),
            Record::from_rdata(
                name(),
                60,
                RData::AAAA(AAAA("fe80::1".parse().expect("ip"))),
            ),
            Record::from_rdata(name(), 300, RData::HTTPS(HTTPS(svcb))),
        ];
        let (kept, addrs, forbidden) = guarded(records, &guard);
        assert_eq!(addrs, vec![IpAddr::from([93, 184, 216, 34])]);
        assert_eq!(forbidden.len(), 2);
        assert_eq!(kept.len(), 2);
        let RData::HTTPS(HTTPS(svcb)) = &kept[1].data else {
            panic!("HTTPS kept")
        };
        let keys: Vec<SvcParamKey> = svcb.svc_params.iter().map(|(k, _)| *k).collect();
        assert_eq!(keys, vec![SvcParamKey::Alpn, SvcParamKey::Ipv4Hint]);
        let SvcParamValue::Ipv4Hint(IpHint(hints)) = &svcb.svc_params[1].1 else {
            panic!("hint")
        };
        assert_eq!(hints, &vec![A([192, 0, 2, 1].into())]);
    }

    #[test]
    fn allowed_ranges_pass_the_guard() {
        let guard = AddressGuard::new(vec!["10.0.0.0/8".parse().expect("net")], Vec::new());
        let records = vec![Record::from_rdata(
            name(),
            60,
            RData::A(A([10, 1, 2, 3].into())),
        )];
        let (kept, addrs, forbidden) = guarded(records, &guard);
        assert_eq!((kept.len(), addrs.len(), forbidden.len()), (1, 1, 0));
    }
}
