#!/usr/bin/env bash
# The product's own transparent path under load: the daemon installs its nftables redirect
# (`[redirect] enabled = true`) for the bench agent uid, exactly as in production, and the
# shared harness measures it beside a direct connection in the same run.
#
#   sudo bench/transparent.sh                     # rows: direct agenshield_fw
#   ROWS="direct agenshield agenshield_fw" sudo bench/transparent.sh   # also the harness's own redirect
#   REPEATS=3 DUR=10 sudo bench/transparent.sh
#
# Reports keep-alive req/s and p50/p99, new-connection rate, 64 MiB MB/s, h2 req/s, the
# proxy's CPU per request and peak RSS, each beside (and as a ratio to) `direct`.
# Needs root, nginx-light, wrk, nghttp2-client, nftables. Traffic stays on 127.0.0.2.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=harness.sh
. "$here/harness.sh"
(cd "$root" && cargo build --release -q -p agenshield-proxy)
AGENSHIELD_BIN="$root/target/release/agenshield"
ROWS="${ROWS:-direct agenshield_fw}"
export RESULTS_MD="${RESULTS_MD:-$here/results-transparent-$(date -u +%Y-%m-%d).md}"

# shellcheck source=/dev/null
source "$harness"   # defines the harness's functions without running it

row_agenshield_fw() {
  local d=$S/agenshield_fw
  mkdir -p "$d/policies"
  cat >"$d/policies/bench.toml" <<POLICY
version = 1
default = "deny"
[[rule]]
id = "bench-upstream"
hosts = ["$UP"]
ports = [$UP_TLS, $UP_HTTP]
action = "allow"
POLICY
  cat >"$d/proxy.toml" <<CONFIG
[listen]
transparent = ["127.0.0.1:15001"]
explicit = "127.0.0.1:15081"
[paths]
policies = "$d/policies"
certs = "$d/certs"
[upstream]
extra_ca = ["$S/ca/ca.pem"]
allow_private = ["127.0.0.0/8"]
[redirect]
enabled = true
agent_users = [$AGENT_UID]
CONFIG
  ROW_DESC="$("$AGENSHIELD_BIN" --version), transparent, its own nftables redirect (table inet agenshield)"
  ROW_PORT=15001
  start_proxy "$AGENSHIELD_BIN" proxy run --config "$d/proxy.toml"
  # The daemon redirected the agent uid itself: the harness must not add its own table.
  ROW_PORT=""
}

# The daemon's rules deliberately outlive it (fail closed); take them down with the row.
eval "harness_$(declare -f row_cleanup)"
row_cleanup() {
  harness_row_cleanup
  [[ -f $S/agenshield_fw/proxy.toml ]] && "$AGENSHIELD_BIN" proxy firewall down \
    --config "$S/agenshield_fw/proxy.toml" >/dev/null 2>&1 || true
}

main
