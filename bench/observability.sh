#!/usr/bin/env bash
# What the audit log and metrics cost on the data path: the harness's plain `agenshield` row
# (audit log on, written before each response's last byte; metrics listener on) beside
# `agenshield_quiet` (audit.enabled = false, listen.metrics = "off"; the in-memory metric
# updates still run, they cannot be turned off). Both as ratios to `direct`, same run; the
# figure for the note is agenshield / agenshield_quiet (keep-alive req/s, goal >= 0.95).
#
#   sudo bench/observability.sh
#   REPEATS=3 DUR=10 sudo bench/observability.sh
#   AGENSHIELD_BIN=/path/to/agenshield sudo bench/observability.sh   # no build
#
# Needs root, nginx-light, wrk, nghttp2-client, nftables. Traffic stays on 127.0.0.2.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=harness.sh
. "$here/harness.sh"
if [ -z "${AGENSHIELD_BIN:-}" ]; then
  (cd "$root" && cargo build --release -q -p agenshield-proxy)
  AGENSHIELD_BIN="$root/target/release/agenshield"
fi
AGENSHIELD_BIN=$(agent_bin "$AGENSHIELD_BIN")
export AGENSHIELD_BIN
ROWS="${ROWS:-direct agenshield agenshield_quiet}"
export RESULTS_MD="${RESULTS_MD:-$here/results-observability-$(date -u +%Y-%m-%d).md}"

# shellcheck source=/dev/null
source "$harness"   # defines the harness's functions without running it

row_agenshield_quiet() {
  local d=$S/agenshield_quiet
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
metrics = "off"
[paths]
policies = "$d/policies"
certs = "$d/certs"
vault = "$d/vault"
[audit]
enabled = false
[upstream]
extra_ca = ["$S/ca/ca.pem"]
allow_private = ["127.0.0.0/8"]
CONFIG
  ROW_DESC="$("$AGENSHIELD_BIN" --version), transparent, audit log off, metrics listener off"
  ROW_PORT=15001
  start_proxy "$AGENSHIELD_BIN" proxy run --config "$d/proxy.toml"
}

main
