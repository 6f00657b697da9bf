#!/usr/bin/env bash
# Policy decision time at 10, 1k and 10k host rules (criterion; exact, wildcard and missing
# hosts in rotation). Goal: at most 1 µs per decision at 10k rules.
#   bench/policy.sh            # full run
#   bench/policy.sh --quick    # fewer samples
set -euo pipefail
cd "$(dirname "$0")/.."
extra=()
[ "${1:-}" = "--quick" ] && extra=(-- --warm-up-time 1 --measurement-time 3)
cargo bench -p agenshield-daemon --bench decide "${extra[@]}"
