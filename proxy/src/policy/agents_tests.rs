//! `agents = [...]`: a rule for some agents only.

use super::super::inject::tests::{policy, rule};
use super::super::{Action, RequestFacts, Scheme};

#[test]
fn agents_scope_a_rule_to_their_uids_and_an_unknown_agent_matches_none() {
    let p = policy(&rule("agents = [1001, 7, 1001]")).expect("valid");
    let decide = |agent| {
        p.decide(&RequestFacts {
            host: "api.test",
            port: 443,
            scheme: Scheme::Https,
            method: Some("GET"),
            path: Some("/"),
            agent,
        })
        .action
    };
    assert_eq!(decide(Some(1001)), Action::Allow);
    assert_eq!(decide(Some(7)), Action::Allow);
    assert_eq!(decide(Some(1002)), Action::Deny);
    assert_eq!(
        decide(None),
        Action::Deny,
        "an unknown agent is none of them"
    );
    for (extra, says) in [
        ("agents = []", "must not be empty"),
        ("agents = [-1]", "-1 is not a uid"),
        ("agents = [\"no such one\"]", "invalid agent name"),
        (
            "agents = [\"surely-absent-agent\"]",
            "no user ash_surely-absent-agent_agent on this machine",
        ),
    ] {
        let e = policy(&rule(extra)).expect_err(extra);
        assert!(
            e.contains(says) && e.starts_with("/p/s.toml:6:"),
            "{extra}: {e}"
        );
    }
}
