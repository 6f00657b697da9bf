//! One DNS message in, one out. Only standard queries with exactly one question are decided
//! (`answer.rs`); anything else is refused here, and every question is recorded
//! (`record.rs`) before its answer is sent. Parsing and encoding are hickory-proto's.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use hickory_resolver::proto::op::{
    Edns, Header, Message, MessageType, OpCode, Query, ResponseCode,
};
use hickory_resolver::proto::serialize::binary::{BinDecodable, BinDecoder};

use super::answer::{answer, Outcome};
use super::ede::ExtendedError;
use super::record;
use crate::pipeline::refusal::Refusal;
use crate::policy::Policy;
use crate::proxy::Proxy;
use crate::record::ErrorCode;

/// The largest UDP answer we send (RFC 9715's advice for EDNS: no IP fragmentation).
const MAX_UDP_PAYLOAD: u16 = 1232;
/// Without EDNS a UDP answer is at most 512 bytes (RFC 1035).
const CLASSIC_UDP_PAYLOAD: usize = 512;

/// Who asked, and how.
#[derive(Debug, Clone)]
pub(crate) struct Asker {
    /// The TCP connection, or one id per datagram.
    pub conn_id: u64,
    pub client: SocketAddr,
    /// Where the agent sent it (the original destination), when known; else the stub's own
    /// address.
    pub dst: SocketAddr,
    pub uid: Option<u32>,
    pub udp: bool,
}

/// When a question arrived, and the policy it is decided (and recorded) under.
pub(crate) struct Asked {
    pub started: Instant,
    pub at: time::OffsetDateTime,
    pub policy: Arc<Policy>,
}

/// The response to `bytes`, or `None` when nothing is to be sent (not a query, or not even
/// a DNS header).
pub(crate) async fn respond(proxy: &Arc<Proxy>, asker: &Asker, bytes: &[u8]) -> Option<Vec<u8>> {
    let asked = Asked {
        started: Instant::now(),
        at: time::OffsetDateTime::now_utc(),
        policy: proxy.policy(),
    };
    let request = match Message::from_vec(bytes) {
        Ok(m) => m,
        Err(e) => {
            let header = Header::read(&mut BinDecoder::new(bytes)).ok()?;
            if header.metadata.message_type != MessageType::Query {
                return None;
            }
            let r = Refusal::new(ErrorCode::BadRequest, format!("malformed DNS query: {e}"));
            let outcome = Outcome::refused(String::new(), ResponseCode::FormErr, r);
            record::record(proxy, asker, &asked, None, &outcome).await;
            let mut resp = Message::response(header.metadata.id, header.metadata.op_code);
            resp.metadata.response_code = ResponseCode::FormErr;
            return resp.to_vec().ok();
        }
    };
    if request.metadata.message_type != MessageType::Query {
        return None;
    }
    let query = request.queries.first();
    let outcome = match (request.metadata.op_code, request.queries.len(), query) {
        (OpCode::Query, 1, Some(q)) => answer(proxy, &asked.policy, q, asker.uid).await,
        (OpCode::Query, n, _) => Outcome::refused(
            name_of(query),
            ResponseCode::FormErr,
            Refusal::new(
                ErrorCode::BadRequest,
                format!("{n} questions in one query (exactly one is answered)"),
            ),
        ),
        (op, _, _) => Outcome::refused(
            name_of(query),
            ResponseCode::NotImp,
            Refusal::new(
                ErrorCode::QueryTypeRefused,
                format!("opcode {op:?} is not answered (only standard queries)"),
            ),
        ),
    };
    let written = record::record(proxy, asker, &asked, query, &outcome).await;
    if written {
        for ip in &outcome.addrs {
            proxy
                .dns
                .names
                .remember(asker.uid, *ip, &outcome.host, outcome.ttl);
        }
    }
    // Why it was refused, for clients that read EDNS options (never a secret's value).
    let ede = outcome.refusal.as_ref().map(|r| {
        let mut e = ExtendedError::for_refusal(r, &outcome.host);
        e.text = proxy.vault.current().redact(&e.text).into_owned();
        e
    });
    Some(encode(&request, outcome, written, asker.udp, ede.as_ref()))
}

fn name_of(query: Option<&Query>) -> String {
    query.map(|q| q.name().to_ascii()).unwrap_or_default()
}

/// The response message: the question echoed, the outcome's answers (none when the audit
/// log could not record it: then SERVFAIL) and, when the query had EDNS, the Extended DNS
/// Error of a refusal; truncated with TC set where UDP needs it.
fn encode(
    request: &Message,
    outcome: Outcome,
    written: bool,
    udp: bool,
    ede: Option<&ExtendedError>,
) -> Vec<u8> {
    let mut resp = Message::response(request.metadata.id, request.metadata.op_code);
    resp.metadata.recursion_desired = request.metadata.recursion_desired;
    resp.metadata.recursion_available = true;
    resp.metadata.checking_disabled = request.metadata.checking_disabled;
    resp.queries = request.queries.clone();
    if written {
        resp.metadata.response_code = outcome.rcode;
        resp.answers = outcome.answers;
    } else {
        resp.metadata.response_code = ResponseCode::ServFail;
    }
    let limit = match &request.edns {
        Some(edns) => {
            let mut ours = Edns::new();
            ours.set_max_payload(MAX_UDP_PAYLOAD);
            if let Some(e) = ede.filter(|_| written) {
                ours.options_mut().insert(e.option());
            }
            resp.set_edns(ours);
            usize::from(edns.max_payload().clamp(512, MAX_UDP_PAYLOAD))
        }
        None => CLASSIC_UDP_PAYLOAD,
    };
    let bytes = resp.to_vec().unwrap_or_default();
    if udp && bytes.len() > limit {
        return resp.truncate().to_vec().unwrap_or_default();
    }
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_resolver::proto::rr::rdata::TXT;
    use hickory_resolver::proto::rr::{Name, RData, Record, RecordType};

    fn request(edns: Option<u16>) -> Message {
        let mut m = Message::query();
        m.add_query(Query::query(
            Name::from_ascii("big.test.").expect("name"),
            RecordType::TXT,
        ));
        if let Some(size) = edns {
            let mut e = Edns::new();
            e.set_max_payload(size);
            m.set_edns(e);
        }
        m
    }

    fn outcome(records: usize) -> Outcome {
        let name = Name::from_ascii("big.test.").expect("name");
        Outcome {
            host: "big.test".into(),
            rcode: ResponseCode::NoError,
            answers: (0..records)
                .map(|i| {
                    Record::from_rdata(
                        name.clone(),
                        60,
                        RData::TXT(TXT::new(vec![format!("{i:0>200}")])),
                    )
                })
                .collect(),
            addrs: Vec::new(),
            ttl: 60,
            dlp: None,
            decision: None,
            refusal: None,
        }
    }

    #[test]
    fn udp_answers_over_the_limit_are_truncated_and_tcp_ones_are_not() {
        let req = request(None);
        let small = Message::from_vec(&encode(&req, outcome(1), true, true, None)).expect("parse");
        assert!(!small.metadata.truncation);
        assert_eq!(small.answers.len(), 1);
        assert_eq!(small.metadata.id, req.metadata.id);
        let big = Message::from_vec(&encode(&req, outcome(5), true, true, None)).expect("parse");
        assert!(big.metadata.truncation, "over 512 bytes without EDNS");
        assert!(big.answers.is_empty());
        let tcp = Message::from_vec(&encode(&req, outcome(5), true, false, None)).expect("parse");
        assert_eq!(tcp.answers.len(), 5);
        // With EDNS the client's size is honoured, up to 1232.
        let req = request(Some(4096));
        let fits = Message::from_vec(&encode(&req, outcome(5), true, true, None)).expect("parse");
        assert!(!fits.metadata.truncation);
        assert_eq!(fits.answers.len(), 5);
    }

    #[test]
    fn a_refusal_carries_its_extended_error_to_an_edns_client_only() {
        use super::super::ede::{InfoCode, OPTION_CODE};
        use hickory_resolver::proto::rr::rdata::opt::{EdnsCode, EdnsOption};
        let ede = ExtendedError {
            code: InfoCode::Blocked,
            text: "denied by rule no-paste".into(),
        };
        let mut nx = outcome(0);
        nx.rcode = ResponseCode::NXDomain;
        let resp = encode(&request(Some(1232)), nx, true, true, Some(&ede));
        let resp = Message::from_vec(&resp).expect("parse");
        assert_eq!(resp.metadata.response_code, ResponseCode::NXDomain);
        let opt = resp.edns.as_ref().expect("EDNS in the answer");
        let Some(EdnsOption::Unknown(OPTION_CODE, payload)) =
            opt.option(EdnsCode::Unknown(OPTION_CODE))
        else {
            panic!("no EDE in {opt:?}")
        };
        assert_eq!(&payload[..2], &15u16.to_be_bytes());
        assert_eq!(&payload[2..], b"denied by rule no-paste");
        // Without EDNS in the query there is no OPT record to carry it (RFC 8914 §3).
        let mut nx = outcome(0);
        nx.rcode = ResponseCode::NXDomain;
        let plain = encode(&request(None), nx, true, true, Some(&ede));
        assert!(Message::from_vec(&plain).expect("parse").edns.is_none());
    }

    #[test]
    fn an_unrecorded_answer_is_withheld() {
        let req = request(None);
        let resp = Message::from_vec(&encode(&req, outcome(1), false, true, None)).expect("parse");
        assert_eq!(resp.metadata.response_code, ResponseCode::ServFail);
        assert!(resp.answers.is_empty());
    }
}
