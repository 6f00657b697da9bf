//! The detector's cost: `scan` over 64 MiB of mixed ordinary text (the false-positive
//! corpus repeated), in MB/s. Ignored by default (a measurement, not a check); run it
//! optimized, e.g. `cargo test -p agenshield-daemon --lib --release dlp::throughput --
//! --ignored --nocapture` (docs/dlp.md's figure: the dev profile with `--config
//! 'profile.dev.package.<crate>.opt-level=3'` for the daemon, aho-corasick, memchr, base64).

use std::time::Instant;

use super::corpus_tests::mixed_text;
use super::detector::{Detector, Findings};

#[test]
#[ignore = "a measurement: run with --ignored --nocapture, optimized"]
fn scan_throughput_over_64_mib_of_mixed_text() {
    let unit = mixed_text();
    let target = 64 << 20;
    let mut text = Vec::with_capacity(target + unit.len());
    while text.len() < target {
        text.extend_from_slice(&unit);
    }
    text.truncate(target);
    let d = Detector::new();
    let mut out = Findings::default();
    // Scanned as 1 MiB bodies (the way a proxy sees them) and as one buffer.
    for (label, piece) in [("1 MiB bodies", 1 << 20), ("one 64 MiB buffer", target)] {
        let mut best = f64::MAX;
        for _ in 0..3 {
            let t = Instant::now();
            let mut n = 0;
            for chunk in text.chunks(piece) {
                d.scan(chunk, &mut out);
                n += out.len();
            }
            best = best.min(t.elapsed().as_secs_f64());
            assert_eq!(n, 0);
        }
        let mbs = target as f64 / (1 << 20) as f64 / best;
        println!("dlp scan, {label}: {mbs:.0} MiB/s ({best:.3} s for 64 MiB)");
    }
}
