//! The Extended DNS Error (RFC 8914) a refused question carries, so that `dig` (and any client
//! that reads EDNS options) sees why: INFO-CODE 15 "Blocked" with EXTRA-TEXT naming the rule
//! (`denied by rule no-paste`) or saying that none allows the name. Sent only to a client
//! whose query had EDNS (RFC 8914 §3). The option's framing (code, length, the OPT record) is
//! hickory-proto's; this builds its payload: the INFO-CODE and the text.

use hickory_resolver::proto::rr::rdata::opt::EdnsOption;

use crate::pipeline::refusal::Refusal;
use crate::policy::DEFAULT_RULE;
use crate::record::ErrorCode;

/// The EDNS option code of an Extended DNS Error.
pub(crate) const OPTION_CODE: u16 = 15;
/// EXTRA-TEXT is cut (at a character boundary) to this many bytes: the answer must still fit
/// a 1232-byte datagram.
const MAX_TEXT: usize = 200;

/// The INFO-CODEs we send (RFC 8914 §4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum InfoCode {
    Other = 0,
    /// "The resolver attempted to perform a DNS query, but the domain is blocked due to a
    /// security policy": policy, a secret in the name, a forbidden address.
    Blocked = 15,
    /// The question's type, class or opcode is not answered.
    NotSupported = 21,
    /// Our resolver failed.
    NetworkError = 23,
}

/// One Extended DNS Error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ExtendedError {
    pub code: InfoCode,
    pub text: String,
}

impl ExtendedError {
    /// What `refusal` of a question for `host` tells the client. The text is the refusal's
    /// own (already free of secret values; the caller redacts it again).
    pub(crate) fn for_refusal(refusal: &Refusal, host: &str) -> ExtendedError {
        let code = match refusal.code {
            ErrorCode::PolicyDenied
            | ErrorCode::SecretLeak
            | ErrorCode::SecretScope
            | ErrorCode::DestinationForbidden => InfoCode::Blocked,
            ErrorCode::QueryTypeRefused => InfoCode::NotSupported,
            ErrorCode::UpstreamDns => InfoCode::NetworkError,
            _ => InfoCode::Other,
        };
        let text = match (refusal.code, refusal.rule_id.as_deref()) {
            (ErrorCode::PolicyDenied, None | Some(DEFAULT_RULE)) => {
                format!("no rule allows {host}")
            }
            (ErrorCode::PolicyDenied, Some(rule)) => format!("denied by rule {rule}"),
            _ => refusal.message.clone(),
        };
        ExtendedError { code, text }
    }

    /// The EDNS option: INFO-CODE (2 bytes, network order), then EXTRA-TEXT (UTF-8).
    pub(crate) fn option(&self) -> EdnsOption {
        let mut text = self.text.as_str();
        if text.len() > MAX_TEXT {
            let mut end = MAX_TEXT;
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            text = &text[..end];
        }
        let mut payload = (self.code as u16).to_be_bytes().to_vec();
        payload.extend_from_slice(text.as_bytes());
        EdnsOption::Unknown(OPTION_CODE, payload)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn denied(rule: Option<&str>) -> Refusal {
        Refusal {
            rule_id: rule.map(str::to_string),
            ..Refusal::new(ErrorCode::PolicyDenied, "rule x denies y")
        }
    }

    #[test]
    fn a_denied_name_is_blocked_naming_the_rule_or_saying_none_allows_it() {
        let e = ExtendedError::for_refusal(&denied(Some("no-paste")), "paste.test");
        assert_eq!(e.code, InfoCode::Blocked);
        assert_eq!(e.text, "denied by rule no-paste");
        let e = ExtendedError::for_refusal(&denied(Some(DEFAULT_RULE)), "x.test");
        assert_eq!(e.text, "no rule allows x.test");
        let EdnsOption::Unknown(15, payload) = e.option() else {
            panic!("an EDE option")
        };
        assert_eq!(&payload[..2], &[0, 15]);
        assert_eq!(&payload[2..], b"no rule allows x.test");
        let t = Refusal::new(ErrorCode::QueryTypeRefused, "NS questions are not answered");
        assert_eq!(
            ExtendedError::for_refusal(&t, "x.test").code,
            InfoCode::NotSupported
        );
    }

    #[test]
    fn long_text_is_cut_at_a_character_boundary() {
        let e = ExtendedError {
            code: InfoCode::Other,
            text: "é".repeat(150),
        };
        let EdnsOption::Unknown(_, payload) = e.option() else {
            panic!("an EDE option")
        };
        assert!(payload.len() <= 2 + MAX_TEXT);
        assert!(std::str::from_utf8(&payload[2..]).is_ok());
    }
}
