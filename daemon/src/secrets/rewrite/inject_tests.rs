use http::{HeaderMap, HeaderValue};

use super::*;
use crate::policy::{Injection, TemplatePart};
use crate::secrets::guard::scan::tests::{binds, set};

fn header_inj(name: &'static str, parts: Vec<TemplatePart>) -> Injection {
    Injection {
        target: InjectTarget::Header(HeaderName::from_static(name)),
        template: parts.into_boxed_slice(),
    }
}

#[test]
fn templates_set_headers_and_replace_what_the_agent_sent() {
    let s = set();
    let b = binds(
        &["github"],
        vec![header_inj(
            "authorization",
            vec![
                TemplatePart::Literal("token ".into()),
                TemplatePart::Secret("github".into()),
            ],
        )],
    );
    let mut h = HeaderMap::new();
    h.append("authorization", HeaderValue::from_static("Bearer fake"));
    h.append("authorization", HeaderValue::from_static("Bearer fake2"));
    assert_eq!(apply(&s, &b, &mut h, "/", None), Url::default());
    let all: Vec<_> = h.get_all("authorization").iter().collect();
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].as_bytes(), b"token ghp_GITHUB_456789");
    assert!(all[0].is_sensitive());
    assert_eq!(format!("{:?}", all[0]), "Sensitive");
}

#[test]
fn bound_placeholders_are_swapped_in_headers_and_basic_credentials() {
    let s = set();
    let b = binds(&["openai", "github"], vec![]);
    let mut h = HeaderMap::new();
    h.insert(
        "authorization",
        HeaderValue::from_static("Bearer agenshield:secret:openai"),
    );
    h.insert(
        "x-both",
        HeaderValue::from_static("agenshield:secret:openai/agenshield:secret:github"),
    );
    apply(&s, &b, &mut h, "/", None);
    assert_eq!(h["authorization"].as_bytes(), b"Bearer sk-test-OPENAI-123");
    assert_eq!(
        h["x-both"].as_bytes(),
        b"sk-test-OPENAI-123/ghp_GITHUB_456789"
    );

    let enc =
        base64::engine::general_purpose::STANDARD.encode("x-access-token:agenshield:secret:github");
    let mut h = HeaderMap::new();
    h.insert(
        "authorization",
        HeaderValue::from_str(&format!("Basic {enc}")).expect("v"),
    );
    apply(&s, &b, &mut h, "/", None);
    let v = h["authorization"].as_bytes();
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(&v[b"Basic ".len()..])
        .expect("b64");
    assert_eq!(decoded, b"x-access-token:ghp_GITHUB_456789");
}

#[test]
fn query_injection_replaces_or_appends_one_parameter() {
    let s = set();
    let b = binds(
        &["openai"],
        vec![Injection {
            target: InjectTarget::Query("key".into()),
            template: vec![TemplatePart::Secret("openai".into())].into_boxed_slice(),
        }],
    );
    let mut h = HeaderMap::new();
    assert_eq!(
        apply(&s, &b, &mut h, "/", Some("a=1&key=old&b=2&key=again"))
            .query
            .as_deref(),
        Some("a=1&key=sk-test-OPENAI-123&b=2")
    );
    assert_eq!(
        apply(&s, &b, &mut h, "/", None).query.as_deref(),
        Some("key=sk-test-OPENAI-123")
    );
}
