//! `dlp` and `dlp_allow` on a rule: parsed, defaulted, carried into decisions, and refused
//! when wrong (without quoting an allowed value).

use super::{DlpMode, Policy, PolicySource, RequestFacts, Scheme};

fn load(rules: &str) -> Result<Policy, String> {
    let text = format!("version = 1\ndefault = \"deny\"\n{rules}");
    Policy::from_sources(&[PolicySource {
        name: "dlp.toml".into(),
        text,
    }])
    .map_err(|e| e.to_string())
}

fn dlp_of(p: &Policy, host: &str) -> Option<(DlpMode, usize)> {
    let d = p.decide(&RequestFacts {
        host,
        port: 443,
        scheme: Scheme::Https,
        method: Some("GET"),
        path: Some("/"),
        agent: None,
    });
    d.dlp.as_ref().map(|r| (r.mode, r.allow.len()))
}

#[test]
fn modes_and_allow_lists_reach_the_decision() {
    let p = load(
        r#"
[[rule]]
id = "plain"
hosts = ["a.test"]
action = "allow"

[[rule]]
id = "report"
hosts = ["b.test"]
action = "allow"
dlp = "report"
dlp_allow = ["ghp_not_a_real_token_value_000000000000"]

[[rule]]
id = "off"
hosts = ["c.test"]
action = "ask"
dlp = "off"

[[rule]]
id = "allow-only"
hosts = ["d.test"]
action = "allow"
dlp_allow = ["x", "y"]
"#,
    )
    .expect("valid");
    assert_eq!(dlp_of(&p, "a.test"), None, "unset: the defaults");
    assert_eq!(dlp_of(&p, "b.test"), Some((DlpMode::Report, 1)));
    assert_eq!(dlp_of(&p, "c.test"), Some((DlpMode::Off, 0)));
    assert_eq!(dlp_of(&p, "d.test"), Some((DlpMode::Block, 2)));
}

#[test]
fn bad_settings_are_refused_without_quoting_values() {
    let cases = [
        ("dlp = \"warn\"", "allow", "unknown dlp \"warn\""),
        (
            "dlp = \"report\"",
            "deny",
            "apply only to \"allow\" and \"ask\"",
        ),
        (
            "dlp = \"off\"\ndlp_allow = [\"SECRETVALUE123\"]",
            "allow",
            "no effect under dlp = \"off\"",
        ),
        ("dlp_allow = [\"\"]", "allow", "value 1 is empty"),
        (
            "dlp_allow = [\"ok\", \" SECRETVALUE123\"]",
            "allow",
            "value 2 starts or ends with white space",
        ),
        ("dlp = 3", "allow", "dlp"),
        ("dlp_allowed = []", "allow", "dlp_allowed"),
    ];
    for (keys, action, want) in cases {
        let rule =
            format!("[[rule]]\nid = \"r\"\nhosts = [\"a.test\"]\naction = \"{action}\"\n{keys}\n");
        let e = load(&rule).expect_err(keys);
        assert!(e.contains(want), "{keys}: {e}");
        assert!(
            !e.contains("SECRETVALUE123"),
            "{keys}: the value is quoted: {e}"
        );
    }
}
