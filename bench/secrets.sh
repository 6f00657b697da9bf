#!/usr/bin/env bash
# What the secrets machinery costs on the data path: the harness's plain `agenshield` row
# (empty vault: the guard is skipped entirely) beside `agenshield_secrets`, whose vault holds
# 20 secrets and whose rule binds one and injects it into every request, so each request is
# scanned (head and body), injected, sent with accept-encoding: identity, and its response
# (headers and streamed body, the 64 MiB download included) searched and redacted. Both are
# reported as ratios to `direct`, measured in the same run.
#
#   sudo bench/secrets.sh
#   REPEATS=3 DUR=10 sudo bench/secrets.sh
#
# Needs root, nginx-light, wrk, nghttp2-client, nftables. Traffic stays on 127.0.0.2.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
harness="${HARNESS:-$root/../shared/bench/peers.sh}"
[ -f "$harness" ] || { echo "bench: harness not found at $harness" >&2; exit 2; }
[ "$(id -u)" -eq 0 ] || { echo "bench: needs root (nftables, a second uid)" >&2; exit 2; }
(cd "$root" && cargo build --release -q -p agenshield-proxy)
export AGENSHIELD_BIN="$root/target/release/agenshield"
ROWS="${ROWS:-direct agenshield agenshield_secrets}"
export RESULTS_MD="${RESULTS_MD:-$here/results-secrets-$(date -u +%Y-%m-%d).md}"

# shellcheck source=/dev/null
source "$harness"   # defines the harness's functions without running it

row_agenshield_secrets() {
  local d=$S/agenshield_secrets
  mkdir -p "$d/policies"
  install -d -m 0700 "$d/vault"
  for i in $(seq 1 20); do
    printf 'bench-secret-value-%02d-%s' "$i" "$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')" >"$d/vault/s$i.secret"
  done
  printf 'bench-injected-token-0123456789' >"$d/vault/bench.secret"
  chmod 0600 "$d/vault/"*.secret
  cat >"$d/policies/bench.toml" <<POLICY
version = 1
default = "deny"
[[rule]]
id = "bench-upstream"
hosts = ["$UP"]
ports = [$UP_TLS, $UP_HTTP]
action = "allow"
inject = [{ header = "Authorization", value = "Bearer \${secret:bench}" }]
POLICY
  cat >"$d/proxy.toml" <<CONFIG
[listen]
transparent = ["127.0.0.1:15001"]
[paths]
policies = "$d/policies"
certs = "$d/certs"
vault = "$d/vault"
[upstream]
extra_ca = ["$S/ca/ca.pem"]
allow_private = ["127.0.0.0/8"]
CONFIG
  ROW_DESC="$("$AGENSHIELD_BIN" --version), transparent, 21 secrets, one injected into every request, responses redacted"
  ROW_PORT=15001
  start_proxy "$AGENSHIELD_BIN" proxy run --config "$d/proxy.toml"
}

main
