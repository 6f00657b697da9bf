//! Secret bindings in policy: parsing, validation with positions, decisions, the store check.

use super::super::{Action, Policy, PolicySource, RequestFacts, Scheme, SwapPlaces};
use super::*;

/// `text` as the one policy file `/p/s.toml`; the error as the linter prints it.
pub(in crate::policy) fn policy(text: &str) -> Result<Policy, String> {
    Policy::from_sources(&[PolicySource {
        name: "/p/s.toml".into(),
        text: text.into(),
    }])
    .map_err(|e| e.to_string())
}

/// One allow rule `api` for `api.test`, with `extra` lines.
pub(in crate::policy) fn rule(extra: &str) -> String {
    format!("version = 1\n[[rule]]\nid = \"api\"\nhosts = [\"api.test\"]\naction = \"allow\"\n{extra}\n")
}

fn get(p: &Policy, host: &str) -> super::super::Decision {
    p.decide(&RequestFacts {
        host,
        port: 443,
        scheme: Scheme::Https,
        method: Some("GET"),
        path: Some("/"),
        agent: None,
    })
}

#[test]
fn templates_and_lists_compile_into_the_deciding_rules_bindings() {
    let p = policy(&rule(
        "secrets = [\"extra\"]\ninject = [{ header = \"Authorization\", value = \"Bearer ${secret:tok}\" },\n  { query = \"key\", value = \"${secret:maps}\" },\n  { header = \"X-Note\", value = \"costs $$5\" }]",
    ))
    .expect("valid");
    let d = get(&p, "api.test");
    let b = d.secrets.expect("bindings");
    assert_eq!(
        b.names.iter().map(|n| &**n).collect::<Vec<_>>(),
        ["extra", "maps", "tok"]
    );
    assert!(b.binds("tok") && !b.binds("other"));
    assert_eq!(b.inject.len(), 3);
    assert_eq!(
        b.inject[0].target,
        InjectTarget::Header(http::header::AUTHORIZATION)
    );
    assert_eq!(
        &*b.inject[0].template,
        [
            TemplatePart::Literal("Bearer ".into()),
            TemplatePart::Secret("tok".into())
        ]
    );
    assert_eq!(b.inject[1].target, InjectTarget::Query("key".into()));
    assert_eq!(
        &*b.inject[2].template,
        [TemplatePart::Literal("costs $5".into())]
    );
    // Another host (default deny) carries no bindings.
    let other = get(&p, "other.test");
    assert_eq!(other.action, Action::Deny);
    assert!(other.secrets.is_none());
    assert_eq!(p.secret_binders("tok"), ["api"]);
    assert!(p.secret_binders("nope").is_empty());
}

#[test]
fn swap_defaults_to_the_credential_positions_and_names_the_rest() {
    let places = |extra: &str| {
        let p = policy(&rule(extra)).expect("valid");
        get(&p, "api.test").secrets.expect("binds").swap.clone()
    };
    let auth = http::HeaderName::from_static("authorization");
    let custom = http::HeaderName::from_static("x-api-key");
    let d = places("secrets = [\"k\"]");
    assert_eq!(d, SwapPlaces::default());
    assert!(d.names().is_empty());
    assert!(d.swaps_header(&auth) && !d.swaps_header(&custom));
    assert!(!d.path && !d.swaps_query("key") && !d.body);
    let all = places("secrets = [\"k\"]\nswap = [\"body\", \"headers\", \"url\"]");
    assert_eq!(all.names(), ["headers", "url", "body"]);
    let body = places("secrets = [\"k\"]\nswap = [\"body\"]");
    assert_eq!(
        (body.all_headers, body.path, body.all_query, body.body),
        (false, false, false, true)
    );
    let named = places(
        "secrets = [\"k\"]\nswap = [\"path\", \"header:X-Api-Key\", \"query:key\", \"websocket\"]",
    );
    assert_eq!(
        named.names(),
        ["header:x-api-key", "path", "query:key", "websocket"]
    );
    assert!(named.swaps_header(&custom) && named.swaps_query("key"));
    assert!(!named.swaps_query("other"));
    // What `inject` sets is a credential position.
    let inj = places(
        "inject = [{ header = \"x-api-key\", value = \"${secret:k}\" }, { query = \"key\", value = \"${secret:k}\" }]",
    );
    assert!(inj.swaps_header(&custom) && inj.swaps_query("key"));
    for (swap, says) in [
        ("[\"url\", \"url\"]", "listed twice"),
        ("[\"header:bad name\"]", "invalid header name"),
        ("[\"header:host\"]", "may not name"),
        ("[\"query:a=b\"]", "invalid query parameter name"),
        ("[\"everything\"]", "unknown place"),
    ] {
        let e = policy(&rule(&format!("secrets = [\"k\"]\nswap = {swap}")))
            .expect_err(swap)
            .to_string();
        assert!(e.contains(says), "{swap}: {e}");
    }
}

#[test]
fn binding_mistakes_are_reported_where_they_are() {
    let cases = [
        (
            "inject = [{ header = \"Host\", value = \"x\" }]",
            "6:22: rule `api`: `inject` may not set \"host\"",
        ),
        (
            "inject = [{ header = \"bad name\", value = \"x\" }]",
            "6:22: rule `api`: invalid header name",
        ),
        (
            "inject = [{ value = \"x\" }]",
            "6:21: rule `api`: each `inject` entry needs exactly one of",
        ),
        (
            "inject = [{ header = \"a\", query = \"b\", value = \"x\" }]",
            "6:48: rule `api`: each `inject` entry needs exactly one of",
        ),
        (
            "inject = [{ header = \"a\", value = \"${secret:bad name}\" }]",
            "6:35: rule `api`: invalid secret name \"bad name\"",
        ),
        (
            "inject = [{ header = \"a\", value = \"${secret:x\" }]",
            "6:35: rule `api`: unterminated",
        ),
        (
            "inject = [{ header = \"a\", value = \"$HOME\" }]",
            "6:35: rule `api`: unexpected `$`",
        ),
        (
            "inject = [{ header = \"a\", value = \"\" }]",
            "6:35: rule `api`: `value` must not be empty",
        ),
        (
            "inject = [{ header = \"a\", value = \"x\" }, { header = \"A\", value = \"y\" }]",
            "6:53: rule `api`: header \"a\" is injected twice",
        ),
        (
            "inject = [{ query = \"a&b\", value = \"x\" }]",
            "6:21: rule `api`: invalid query parameter name",
        ),
        (
            "inject = [{ header = \"a\", value = \"x\", extra = 1 }]",
            "6:40: unknown field `extra`",
        ),
        (
            "secrets = []",
            "6:11: rule `api`: `secrets` must not be empty",
        ),
        (
            "secrets = [\"a.b\"]",
            "6:12: rule `api`: invalid secret name",
        ),
        (
            "secrets = [\"k\"]\nswap = [\"bodies\"]",
            "7:9: rule `api`: unknown place \"bodies\" in `swap`; expected any of \"headers\", \"header:NAME\", \"path\", \"query:NAME\", \"url\", \"body\"",
        ),
        (
            "secrets = [\"k\"]\nswap = [\"url\", \"url\"]",
            "7:16: rule `api`: \"url\" is listed twice in `swap`",
        ),
        (
            "swap = [\"body\"]",
            "6:8: rule `api`: `swap` says where placeholders of the rule's secrets are swapped, and it binds none",
        ),
    ];
    for (extra, want) in cases {
        let e = policy(&rule(extra)).expect_err(extra);
        assert!(
            e.starts_with(&format!("/p/s.toml:{want}")),
            "{extra}\n got: {e}"
        );
    }
    let deny = "version = 1\n[[rule]]\nid = \"d\"\nhosts = [\"x\"]\naction = \"deny\"\nsecrets = [\"k\"]\n";
    let e = policy(deny).expect_err("deny with secrets");
    assert!(
        e.contains("apply only to \"allow\" and \"ask\" rules"),
        "{e}"
    );
}

#[test]
fn the_store_check_names_the_rule_the_file_and_the_fix() {
    let p = policy(&rule(
        "inject = [{ header = \"Authorization\", value = \"Bearer ${secret:gh}\" }]",
    ))
    .expect("valid");
    let e = p.check_secrets(&|_| false).expect_err("missing");
    assert_eq!(
        e.to_string(),
        "/p/s.toml:6:47: rule `api` uses secret \"gh\", which is not in the store (add it with `agenshield proxy ctl secrets set gh`)"
    );
    p.check_secrets(&|n| n == "gh").expect("present");
}

#[test]
fn per_secret_rates_are_validated_and_checked_against_bindings() {
    let text = rule("secrets = [\"gh\"]") + "[secrets.gh]\nrate = { requests = 2, per = \"1m\" }\n";
    let p = policy(&text).expect("valid");
    let r = p.secret_rate("gh").expect("rate");
    assert_eq!((r.requests, r.per.as_secs(), r.burst), (2, 60, 2));
    assert!(p.secret_rate("other").is_none());
    p.check_secrets(&|_| true).expect("bound and present");
    let e = p.check_secrets(&|n| n != "gh").expect_err("missing");
    assert!(e.to_string().contains("uses secret \"gh\""), "{e}");

    let unbound = rule("") + "[secrets.lonely]\nrate = { requests = 2, per = \"1m\" }\n";
    let e = policy(&unbound)
        .expect("valid")
        .check_secrets(&|_| true)
        .expect_err("unbound");
    assert!(
        e.to_string()
            .contains("[secrets.lonely]: no rule binds this secret"),
        "{e}"
    );

    let bad = rule("") + "[secrets.x]\nrate = { requests = 0, per = \"1m\" }\n";
    assert!(policy(&bad).expect_err("zero").contains("rate.requests"));
    let bad_name = rule("") + "[secrets.\"a b\"]\nrate = { requests = 1, per = \"1m\" }\n";
    assert!(policy(&bad_name)
        .expect_err("name")
        .contains("invalid secret name"));
}

#[test]
fn sigv4_binds_its_keys_for_signing_only() {
    let p = policy(&rule(
        "sigv4 = { access_key_id = \"aws_key\", secret_access_key = \"aws_secret\", session_token = \"aws_token\", services = [\"s3\"], regions = [\"eu-west-1\"] }",
    ))
    .expect("valid");
    let b = get(&p, "api.test").secrets.expect("bindings");
    let keys = b.sigv4.as_ref().expect("sigv4");
    assert_eq!(
        keys.names().map(|n| &**n).collect::<Vec<_>>(),
        ["aws_key", "aws_secret", "aws_token"]
    );
    // Used only to sign: never swapped, never injected, but fetched when needed.
    assert!(b.names.is_empty() && !b.binds("aws_secret"));
    assert_eq!(
        b.needs.iter().map(|n| &**n).collect::<Vec<_>>(),
        ["aws_key", "aws_secret", "aws_token"]
    );
    assert_eq!(p.secret_binders("aws_secret"), ["api"]);

    for (extra, says) in [
        (
            "sigv4 = { access_key_id = \"k\", secret_access_key = \"k\", services = [\"*\"], regions = [\"*\"] }",
            "names secret \"k\" twice",
        ),
        (
            "secrets = [\"k\"]\nsigv4 = { access_key_id = \"k\", secret_access_key = \"s\", services = [\"*\"], regions = [\"*\"] }",
            "may not also be swapped or injected",
        ),
        (
            "sigv4 = { access_key_id = \"k\" }",
            "missing field `secret_access_key`",
        ),
        (
            "sigv4 = { access_key_id = \"k\", secret_access_key = \"s\", region = \"x\" }",
            "unknown field `region`",
        ),
        (
            "sigv4 = { access_key_id = \"bad name\", secret_access_key = \"s\", services = [\"*\"], regions = [\"*\"] }",
            "bad name",
        ),
        (
            "sigv4 = { access_key_id = \"k\", secret_access_key = \"s\", regions = [\"*\"] }",
            "`sigv4` must say which services it signs for: services = [",
        ),
        (
            "sigv4 = { access_key_id = \"k\", secret_access_key = \"s\", services = [\"s3\"] }",
            "`sigv4` must say which regions it signs for",
        ),
        (
            "sigv4 = { access_key_id = \"k\", secret_access_key = \"s\", services = [\"s 3\"], regions = [\"*\"] }",
            "invalid `sigv4` services entry",
        ),
        (
            "sigv4 = { access_key_id = \"k\", secret_access_key = \"s\", services = [\"*\"], regions = [\"*\"], actions = [] }",
            "must not be empty",
        ),
    ] {
        let e = policy(&rule(extra)).expect_err(extra);
        assert!(e.contains(says), "{extra}: {e}");
        assert!(e.starts_with("/p/s.toml:"), "{e}");
    }
    let deny = "version = 1\n[[rule]]\nid = \"d\"\nhosts = [\"a.test\"]\naction = \"deny\"\nsigv4 = { access_key_id = \"k\", secret_access_key = \"s\", services = [\"*\"], regions = [\"*\"] }\n";
    let e = policy(deny).expect_err("deny rule");
    assert!(e.contains("only to \"allow\" and \"ask\" rules"), "{e}");
}
