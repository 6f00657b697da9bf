//! `agents = [...]`: a rule for some agents only.

use super::super::inject::tests::{policy, rule};
use super::super::{Action, RequestFacts, Scheme};

/// A deny for some agents holds where the agent is unknown (a connection whose owner the OS
/// could not tell): it may be one of them. An allow or ask for them does not.
#[test]
fn a_deny_for_some_agents_applies_to_an_unknown_agent() {
    let p = policy(
        "version = 1\ndefault = \"allow\"\n\n[[rule]]\nid = \"no-7\"\nhosts = [\"api.test\"]\nagents = [7]\naction = \"deny\"\n",
    )
    .expect("valid");
    let decide = |agent| {
        p.decide(&RequestFacts {
            host: "api.test",
            port: 443,
            scheme: Scheme::Tcp,
            method: None,
            path: None,
            agent,
        })
    };
    assert_eq!(decide(Some(7)).action, Action::Deny);
    assert_eq!(decide(Some(8)).action, Action::Allow);
    let unknown = decide(None);
    assert_eq!(
        (unknown.action, unknown.rule_id.as_deref()),
        (Action::Deny, Some("no-7")),
        "an unknown agent may be agent 7"
    );
}

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
