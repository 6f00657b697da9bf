//! `Policy::decide` at 10, 1k and 10k host rules (90% exact hosts, 10% `*.suffix`, a third
//! with method + path constraints, plus `*` rules), over a rotating mix of exact hits,
//! wildcard hits and misses. The host index should keep the cost flat as rules grow.
//!
//! Run: `cargo bench --bench decide` (add `-- --quick` for a fast pass).

use std::hint::black_box;

use agenshield_proxy::policy::{Policy, PolicySource, RequestFacts, Scheme};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};

/// A policy with `n` host rules.
fn policy(n: usize) -> Policy {
    let mut text = String::from("version = 1\ndefault = \"deny\"\n");
    for i in 0..n {
        let host = if i % 10 == 0 {
            format!("*.w{i}.example.com")
        } else {
            format!("h{i}.example.com")
        };
        let (action, extra) = match i % 3 {
            0 => (
                "allow",
                "methods = [\"GET\", \"POST\"]\npaths = [\"/api/**\", \"/v1/*\"]\n",
            ),
            1 => ("allow", "ports = [443]\n"),
            _ => ("deny", "paths = [\"/admin/**\"]\n"),
        };
        text.push_str(&format!(
            "[[rule]]\nid = \"r{i}\"\nhosts = [\"{host}\"]\n{extra}action = \"{action}\"\npriority = {}\n",
            i % 7
        ));
    }
    text.push_str("[[rule]]\nid = \"no-delete\"\nhosts = [\"*\"]\nmethods = [\"DELETE\"]\naction = \"deny\"\npriority = 100\n");
    text.push_str(
        "[[rule]]\nid = \"ask-post\"\nhosts = [\"*\"]\nmethods = [\"PUT\"]\naction = \"ask\"\n",
    );
    let src = PolicySource {
        name: "bench.toml".into(),
        text,
    };
    Policy::from_sources(&[src]).unwrap_or_else(|e| panic!("{e}"))
}

/// Hosts for `n` rules: a third exact hits, a third wildcard hits, a third misses.
fn hosts(n: usize) -> Vec<String> {
    (0..300)
        .map(|i| {
            let r = (i * 37) % n;
            match i % 3 {
                0 => format!(
                    "h{}.example.com",
                    if r.is_multiple_of(10) { r + 1 } else { r }
                ),
                1 => format!("a.b.w{}.example.com", r / 10 * 10),
                _ => format!("miss{i}.other.org"),
            }
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("decide");
    for n in [10usize, 1_000, 10_000] {
        let p = policy(n);
        let hosts = hosts(n);
        group.bench_with_input(BenchmarkId::from_parameter(n), &hosts, |b, hosts| {
            let mut i = 0;
            b.iter(|| {
                i = (i + 1) % hosts.len();
                let d = p.decide(&RequestFacts {
                    host: &hosts[i],
                    port: 443,
                    scheme: Scheme::Https,
                    method: Some("GET"),
                    path: Some("/api/v1/items"),
                    agent: None,
                });
                black_box(d)
            });
        });
    }
    // Unicode hosts take the IDNA (UTS 46) path; ASCII hosts never do.
    let p = policy(10_000);
    group.bench_function("10000-idn-host", |b| {
        b.iter(|| {
            black_box(p.decide(&RequestFacts {
                host: black_box("bücher.w10.example.com"),
                port: 443,
                scheme: Scheme::Https,
                method: Some("GET"),
                path: Some("/api/x"),
                agent: None,
            }))
        });
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
