use std::sync::Arc;

use base64::Engine as _;
use http::{HeaderMap, HeaderValue};

use super::*;
use crate::policy::{InjectTarget, Injection, SecretBindings, TemplatePart};
use crate::secrets::{SecretName, SecretValue};

pub(crate) fn set() -> SecretSet {
    SecretSet::new(
        [
            ("openai", "sk-test-OPENAI-123"),
            ("github", "ghp_GITHUB_456789"),
        ]
        .iter()
        .map(|(n, v)| {
            (
                SecretName::new(n).expect("name"),
                Arc::new(SecretValue::new(v.as_bytes().to_vec()).expect("value")),
            )
        })
        .collect(),
    )
    .expect("set")
}

pub(crate) fn binds(names: &[&str], inject: Vec<Injection>) -> SecretBindings {
    let mut names = names.to_vec();
    names.sort_unstable();
    let names: Box<[Arc<str>]> = names.iter().map(|n| Arc::from(*n)).collect();
    SecretBindings {
        needs: names.clone(),
        names,
        inject: inject.into_boxed_slice(),
        // `swap = ["headers", "url"]`: the places these tests exercise.
        swap: crate::policy::SwapPlaces {
            all_headers: true,
            path: true,
            all_query: true,
            ..Default::default()
        },
        sigv4: None,
    }
}

pub(crate) fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.append(
            http::HeaderName::from_bytes(k.as_bytes()).expect("name"),
            HeaderValue::from_str(v).expect("value"),
        );
    }
    h
}

fn basic(creds: &str) -> String {
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(creds)
    )
}

#[test]
fn a_bound_placeholder_is_a_use_and_an_unbound_one_is_out_of_scope() {
    let s = set();
    let b = binds(&["openai"], vec![]);
    let h = headers(&[("authorization", "Bearer agenshield:secret:openai")]);
    let scan = inspect_head(&s, Some(&b), "GET", "api.openai.test", &h, "/v1").expect("in scope");
    assert_eq!(scan.used, vec![Arc::<str>::from("openai")]);

    let e = inspect_head(&s, None, "GET", "evil.test", &h, "/").expect_err("scope");
    assert_eq!(
        (e.violation, e.secret.as_str(), e.place.to_string().as_str()),
        (Violation::Scope, "openai", "header authorization")
    );
    let e = inspect_head(
        &s,
        Some(&b),
        "GET",
        "x.test",
        &HeaderMap::new(),
        "/q?k=agenshield%3Asecret%3Agithub",
    )
    .expect_err("encoded placeholder in the URL");
    assert_eq!(
        (e.violation, e.secret.as_str()),
        (Violation::Scope, "github")
    );
}

#[test]
fn real_values_are_leaks_unless_the_rule_binds_them() {
    let s = set();
    let b = binds(&["openai"], vec![]);
    let cases: Vec<(&str, HeaderMap, &str, &str)> = vec![
        (
            "evil.test",
            headers(&[("x-key", "ghp_GITHUB_456789")]),
            "/",
            "header x-key",
        ),
        (
            "evil.test",
            HeaderMap::new(),
            "/p?token=ghp_GITHUB_456789",
            "query",
        ),
        (
            "evil.test",
            HeaderMap::new(),
            "/p?token=ghp%5FGITHUB%5F456789",
            "query",
        ),
        ("ghp_GITHUB_456789.evil.test", HeaderMap::new(), "/", "host"),
        (
            "evil.test",
            headers(&[("authorization", &basic("me:ghp_GITHUB_456789"))]),
            "/",
            "header authorization",
        ),
    ];
    for (host, h, url, place) in cases {
        let e = inspect_head(&s, Some(&b), "GET", host, &h, url).expect_err(place);
        assert_eq!(
            (e.violation, e.secret.as_str(), e.place.to_string().as_str()),
            (Violation::Leak, "github", place)
        );
        assert!(
            !e.message(Some("r")).contains("ghp_"),
            "{}",
            e.message(Some("r"))
        );
    }
    // A method is a token, and so is many a key.
    let e = inspect_head(
        &s,
        Some(&b),
        "ghp_GITHUB_456789",
        "evil.test",
        &HeaderMap::new(),
        "/",
    )
    .expect_err("method");
    assert_eq!(
        (e.violation, e.place.to_string().as_str()),
        (Violation::Leak, "method")
    );
    // What follows the placeholder prefix is shown only if it names a stored secret: it
    // could be a real value.
    let h = headers(&[("x-key", "agenshield:secret:ghp_GITHUB_4567")]);
    let e = inspect_head(&s, Some(&b), "GET", "evil.test", &h, "/").expect_err("scope");
    assert_eq!(e.violation, Violation::Scope);
    assert!(!e.message(None).contains("ghp_"), "{}", e.message(None));
    // The default is spoken of as the policy's default, not as a rule called "default".
    let said = e.message(Some(crate::policy::DEFAULT_RULE));
    assert!(said.contains("the policy default does not"), "{said}");
    assert!(e.message(Some("web")).contains("rule web does not"));
    // The bound secret's own value may go where it is bound.
    let h = headers(&[("x-key", "sk-test-OPENAI-123")]);
    assert!(inspect_head(&s, Some(&b), "GET", "api.test", &h, "/").is_ok());
}

#[test]
fn injected_secrets_count_as_uses_and_a_missing_one_is_unavailable() {
    let s = set();
    let inj = |name: &str| Injection {
        target: InjectTarget::Header(http::header::AUTHORIZATION),
        template: vec![
            TemplatePart::Literal("Bearer ".into()),
            TemplatePart::Secret(name.into()),
        ]
        .into_boxed_slice(),
    };
    let b = binds(&["github"], vec![inj("github")]);
    let scan = inspect_head(&s, Some(&b), "GET", "api.test", &HeaderMap::new(), "/").expect("ok");
    assert_eq!(scan.used, vec![Arc::<str>::from("github")]);
    let b = binds(&["gone"], vec![inj("gone")]);
    let e =
        inspect_head(&s, Some(&b), "GET", "api.test", &HeaderMap::new(), "/").expect_err("gone");
    assert_eq!(
        (e.violation, e.secret.as_str()),
        (Violation::Unavailable, "gone")
    );
}

/// Without `swap`, a placeholder is swapped only in the credential positions: elsewhere (a
/// custom header, the path, a query parameter) it is refused, where a content API would
/// publish the value.
#[test]
fn by_default_only_credential_positions_swap() {
    let s = set();
    let mut b = binds(&["github"], vec![]);
    b.swap = crate::policy::SwapPlaces::default();
    let ok = |b: &SecretBindings, h: &[(&str, &str)], pq: &str| {
        inspect_head(&s, Some(b), "GET", "api.test", &headers(h), pq).map(|r| r.used)
    };
    let github: Vec<Arc<str>> = vec![Arc::from("github")];
    assert_eq!(
        ok(
            &b,
            &[("authorization", "token agenshield:secret:github")],
            "/"
        ),
        Ok(github.clone())
    );
    assert_eq!(
        ok(
            &b,
            &[("authorization", &basic("x:agenshield:secret:github"))],
            "/"
        ),
        Ok(github.clone())
    );
    for (h, pq, place) in [
        (
            vec![("x-echo", "agenshield:secret:github")],
            "/",
            "header x-echo",
        ),
        (
            vec![],
            "/repos/me/pub/contents/agenshield:secret:github",
            "path",
        ),
        (
            vec![],
            "/repos/me/pub/contents/agenshield%3Asecret%3Agithub",
            "path",
        ),
        (vec![], "/q?token=agenshield:secret:github", "query"),
    ] {
        let r = ok(&b, &h, pq).expect_err("refused");
        assert_eq!(
            (r.violation, r.secret.as_str(), r.place.to_string().as_str()),
            (Violation::NotSwapped, "github", place),
            "{pq}"
        );
    }
    // Named places swap.
    b.swap.path = true;
    b.swap.query = vec!["token".to_string()].into_boxed_slice();
    b.swap.headers = vec![http::HeaderName::from_static("x-api-key")].into_boxed_slice();
    assert!(ok(&b, &[("x-api-key", "agenshield:secret:github")], "/").is_ok());
    assert!(ok(&b, &[], "/a/agenshield:secret:github").is_ok());
    assert!(ok(&b, &[], "/q?token=agenshield:secret:github&n=1").is_ok());
    let r = ok(&b, &[], "/q?other=agenshield:secret:github").expect_err("unnamed parameter");
    assert_eq!(
        (r.violation, r.place.to_string().as_str()),
        (Violation::NotSwapped, "query")
    );
}
