//! Credentials that may only go home: data-loss prevention for secrets the operator never
//! stored. The engine, with no I/O: a [`Detector`] (one Aho-Corasick pass over every known
//! prefix, then verification of each candidate: charset, length, checksum, structure; one
//! level of percent, JSON-escape, base64 and hex decoding within a linear work cap) finds
//! credentials of well-known [`Format`]s in any bytes; [`decide`] says whether one may go to a
//! destination host in a given [`Place`]: only to its format's home hosts, in a credential
//! place, or when `dlp_allow` ([`AllowList`]) lists it. Everything else is
//! `credential_exfiltration`.
//!
//! Nothing here stores or prints a value: findings carry the format, where, the length and
//! a keyed fingerprint. Compressed bodies are the caller's to decompress first, within a cap
//! ([`decompress_capped`]); the pipeline wiring (which places are scanned, `dlp = "block" |
//! "report" | "off"`) sits above this engine.
//!
//! Layering: an engine like `policy/` and `secrets/`; it imports `record/` (the error code)
//! and `policy/` (the host matcher, so home patterns mean what rule hosts mean) only.

mod allow;
mod checksum;
mod decision;
mod decode;
mod decompress;
mod detector;
mod format;
mod marker;
mod redact;
mod stream;
mod verify;

#[allow(unused_imports)] // The constants are for tests and docs.
pub(crate) use allow::{AllowList, AWS_EXAMPLE_KEYS};
#[allow(unused_imports)]
pub(crate) use decision::{decide, Decision, Place, CREDENTIAL_HEADERS};
pub(crate) use decompress::{decompress_capped, ContentEncoding};
#[allow(unused_imports)]
pub(crate) use detector::{Detector, Encoding, Finding, Findings, Fingerprint};
pub(crate) use format::Format;
pub(crate) use redact::shown;
#[allow(unused_imports)]
pub(crate) use stream::{StreamScan, OVERLAP, STEP};

/// The one detector the data path uses (its automaton is built once, on first use; its
/// fingerprint key is drawn then, per process).
pub(crate) fn detector() -> &'static Detector {
    static DETECTOR: std::sync::LazyLock<Detector> = std::sync::LazyLock::new(Detector::new);
    &DETECTOR
}

/// A place as records name it.
impl From<Place> for crate::record::DlpPlace {
    fn from(p: Place) -> Self {
        use crate::record::DlpPlace as P;
        match p {
            Place::Path => P::Path,
            Place::Query => P::Query,
            Place::CredentialHeader => P::CredentialHeader,
            Place::OtherHeader => P::Header,
            Place::Body => P::Body,
            Place::WebSocket => P::Websocket,
            Place::DnsName => P::DnsName,
        }
    }
}

/// Why the engine could not read a body.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum DlpError {
    #[error("request body larger than {cap} bytes once decompressed")]
    TooLarge { cap: usize },
    #[error("request body is not valid {encoding}")]
    Corrupt { encoding: &'static str },
    #[error("request body has a content coding the proxy cannot read: {0:?}")]
    UnknownEncoding(String),
    #[error("request body {0}")]
    Unreadable(String),
}

#[cfg(test)]
mod testgen;

#[cfg(test)]
#[path = "detector_tests.rs"]
mod detector_tests;

#[cfg(test)]
#[path = "decision_tests.rs"]
mod decision_tests;

#[cfg(test)]
#[path = "corpus_tests.rs"]
mod corpus_tests;

#[cfg(test)]
#[path = "decompress_tests.rs"]
mod decompress_tests;

#[cfg(test)]
#[path = "stream_tests.rs"]
mod stream_tests;

#[cfg(test)]
#[path = "throughput_tests.rs"]
mod throughput_tests;
