#!/usr/bin/env bash
# AgenShield beside a direct connection (and, with ROWS, beside peer proxies), in one run.
#
# Builds the release binary and runs the shared harness (../shared/bench/peers.sh), whose
# `agenshield` row sends a second uid's wrk/h2load/curl traffic to nginx on 127.0.0.2 through
# an nftables redirect into our transparent listener (original destination via
# SO_ORIGINAL_DST), and whose `direct` row is the same client without the redirect. Every
# figure is reported as a ratio to direct, measured in the same run.
#
#   sudo bench/run.sh                            # direct + agenshield, 2 interleaved runs
#   ROWS="direct agenshield squid" sudo bench/run.sh
#   REPEATS=3 DUR=10 sudo bench/run.sh
#
# Needs root (nft, a second uid) and: apt-get install nginx-light wrk nghttp2-client nftables
# Traffic stays on loopback (127.0.0.2); the harness checks the route before each row.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
# shellcheck source=harness.sh
. "$here/harness.sh"
[ "$(id -u)" -eq 0 ] || { echo "bench: needs root (nftables redirect, a second uid)" >&2; exit 2; }
for tool in nginx wrk h2load nft curl; do
  command -v "$tool" >/dev/null || { echo "bench: $tool missing (apt-get install nginx-light wrk nghttp2-client nftables curl)" >&2; exit 2; }
done

(cd "$root" && cargo build --release -q -p agenshield-proxy)
export AGENSHIELD_BIN
AGENSHIELD_BIN=$(agent_bin "$root/target/release/agenshield")
export ROWS="${ROWS:-direct agenshield}"
export REPEATS="${REPEATS:-2}"
export DUR="${DUR:-10}"
out="$here/results-$(date -u +%Y-%m-%d).md"
# The harness also writes its report beside itself unless told otherwise; keep it here.
export RESULTS_MD="$out"
bash "$harness"
echo "bench: report written to $out"
