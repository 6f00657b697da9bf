//! Host normalization, IDN and pattern tests.

use super::*;

#[test]
fn normalizes() {
    let cases = [
        ("API.GitHub.com", "api.github.com"),
        ("api.github.com.", "api.github.com"),
        ("[::1]", "::1"),
        ("::1", "::1"),
        ("[0:0:0:0:0:0:0:1]", "::1"),
        ("[::FFFF:127.0.0.1]", "127.0.0.1"),
        ("127.0.0.2", "127.0.0.2"),
        ("127.0.0.2.", "127.0.0.2"),
        ("my_host.internal", "my_host.internal"),
        ("123.example.com", "123.example.com"),
        ("x.0xfoo", "x.0xfoo"),
    ];
    for (raw, want) in cases {
        assert_eq!(normalize_host(raw).as_deref(), Ok(want), "{raw}");
    }
    assert!(matches!(
        normalize_host_cow("a.b"),
        Ok(Cow::Borrowed("a.b"))
    ));
}

#[test]
fn rejects() {
    let cases = [
        ("", HostError::Empty),
        (".", HostError::Empty),
        ("a..b", HostError::EmptyLabel),
        (".a", HostError::EmptyLabel),
        ("a.b..", HostError::EmptyLabel),
        ("example.com:443", HostError::Colon),
        ("[::1]:443", HostError::BadIpv6),
        ("[::1", HostError::BadIpv6),
        ("[fe80::1%25eth0]", HostError::BadIpv6),
        ("a b", HostError::InvalidChar(' ')),
        ("a/b", HostError::InvalidChar('/')),
        ("127.1", HostError::AmbiguousNumeric),
        ("0x7f.0.0.1", HostError::AmbiguousNumeric),
        ("2130706433", HostError::AmbiguousNumeric),
        ("127.000.0.1", HostError::AmbiguousNumeric),
        ("1.2.3.4.5", HostError::AmbiguousNumeric),
    ];
    for (raw, want) in cases {
        assert_eq!(normalize_host(raw), Err(want), "{raw:?}");
    }
    assert_eq!(
        normalize_host(&"a".repeat(64)),
        Err(HostError::LabelTooLong)
    );
    let long = vec!["abc"; 70].join(".");
    assert_eq!(normalize_host(&long), Err(HostError::TooLong));
}

#[test]
fn patterns() {
    assert_eq!(parse_host_pattern("*"), Ok(HostPattern::Any));
    assert_eq!(
        parse_host_pattern("*.GitHubUserContent.com."),
        Ok(HostPattern::Suffix("githubusercontent.com".into()))
    );
    assert_eq!(
        parse_host_pattern("[::1]"),
        Ok(HostPattern::Exact("::1".into()))
    );
    for bad in [
        "a*.b",
        "a.*.c",
        "*a.b",
        "*.*.b",
        "**",
        "*.",
        "*.127.0.0.1",
        "a.b*",
    ] {
        assert!(parse_host_pattern(bad).is_err(), "{bad}");
    }
    let e = parse_host_pattern("a.*.c").expect_err("bad").to_string();
    assert!(e.contains("leading \"*.\""), "{e}");
    // Issue 34: a URL or host:port says where each part goes, with an example.
    let e = parse_host_pattern("https://api.github.com/")
        .expect_err("url")
        .to_string();
    assert!(
        e.contains("write the host name alone, e.g. \"api.github.com\""),
        "{e}"
    );
    let e = parse_host_pattern("localhost:27080")
        .expect_err("port")
        .to_string();
    assert!(
        e.contains("hosts = [\"localhost\"], ports = [27080]"),
        "{e}"
    );
    assert_eq!(
        parse_host_pattern("[::1]"),
        Ok(HostPattern::Exact("::1".into())),
        "an IPv6 literal is no port"
    );
}

#[test]
fn suffixes() {
    let got: Vec<_> = parent_suffixes("a.b.example.com").collect();
    assert_eq!(got, ["b.example.com", "example.com", "com"]);
    assert_eq!(parent_suffixes("localhost").count(), 0);
}

#[test]
fn idn_to_punycode() {
    let cases = [
        ("bücher.example", "xn--bcher-kva.example"),
        ("BÜCHER.Example.", "xn--bcher-kva.example"),
        ("xn--bcher-kva.example", "xn--bcher-kva.example"),
        ("XN--BCHER-KVA.EXAMPLE", "xn--bcher-kva.example"),
        ("caf\u{e9}.com", "xn--caf-dma.com"),
        ("faß.de", "xn--fa-hia.de"),
        ("my_host.bücher.example", "my_host.xn--bcher-kva.example"),
        // Full-width letters, dots and digits map to ASCII: no way around an ASCII rule.
        ("\u{ff45}\u{ff56}\u{ff49}\u{ff4c}.com", "evil.com"),
        ("evil\u{3002}com", "evil.com"),
        ("evil.com\u{3002}", "evil.com"),
        ("\u{ff11}\u{ff12}\u{ff17}.0.0.1", "127.0.0.1"),
        ("ev\u{200b}il.com", "evil.com"),
    ];
    for (raw, want) in cases {
        assert_eq!(normalize_host(raw).as_deref(), Ok(want), "{raw}");
    }
    let bad = [
        ("xn--zz.example", HostError::InvalidIdn),
        ("xn--.com", HostError::InvalidIdn),
        ("a b.bücher", HostError::InvalidIdn),
        ("bücher.com:443", HostError::InvalidIdn),
        ("a*ü.com", HostError::InvalidChar('*')),
        ("ü..com", HostError::EmptyLabel),
        ("\u{ff11}\u{ff12}\u{ff17}.1", HostError::AmbiguousNumeric),
    ];
    for (raw, want) in bad {
        assert_eq!(normalize_host(raw), Err(want), "{raw:?}");
    }
    assert_eq!(
        parse_host_pattern("*.Bücher.example"),
        Ok(HostPattern::Suffix("xn--bcher-kva.example".into()))
    );
    let e = parse_host_pattern("xn--zz.example")
        .expect_err("invalid punycode")
        .to_string();
    assert!(e.contains("invalid internationalized domain name"), "{e}");
}

#[test]
fn pattern_matches() {
    let suffix = HostPattern::Suffix("example.com".into());
    assert!(suffix.matches("a.example.com"));
    assert!(suffix.matches("a.b.example.com"));
    assert!(!suffix.matches("example.com"));
    assert!(!suffix.matches("badexample.com"));
    assert!(HostPattern::Exact("a.b".into()).matches("a.b"));
    assert!(!HostPattern::Exact("a.b".into()).matches("x.a.b"));
    assert!(HostPattern::Any.matches("::1"));
}
