#!/usr/bin/env bash
# What the secrets machinery costs on the data path: the harness's plain `agenshield` row
# (empty vault: the guard is skipped entirely) beside `agenshield_secrets`, whose vault holds
# 20 secrets and whose rule binds one and injects it into every request, so each request is
# scanned (head and body), injected, sent with accept-encoding: identity, and its response
# (headers and streamed body, the 64 MiB download included) searched and redacted. Both are
# reported as ratios to `direct`, measured in the same run.
#
# Then the body swap: keep-alive POSTs of a 1 KiB JSON body holding a placeholder, through
# `agenshield` (empty vault: the body goes on untouched) and `agenshield_swap` (its rule binds
# the secret with swap = ["headers", "url", "body"]: every body is read, searched for 21
# secrets' forms, the placeholder swapped JSON-escaped and Content-Length restated). Printed
# as a ratio of swap to off, each run, and appended to the results file.
#
#   sudo bench/secrets.sh
#   REPEATS=3 DUR=10 sudo bench/secrets.sh
#
# Needs root, nginx-light, wrk, nghttp2-client, nftables. Traffic stays on 127.0.0.2.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=harness.sh
. "$here/harness.sh"
(cd "$root" && cargo build --release -q -p agenshield-proxy)
export AGENSHIELD_BIN
AGENSHIELD_BIN=$(agent_bin "$root/target/release/agenshield")
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
audit = "$d/state/audit.jsonl"
[upstream]
extra_ca = ["$S/ca/ca.pem"]
allow_private = ["127.0.0.0/8"]
CONFIG
  ROW_DESC="$("$AGENSHIELD_BIN" --version), transparent, 21 secrets, one injected into every request, responses redacted"
  ROW_PORT=15001
  start_proxy "$AGENSHIELD_BIN" proxy run --config "$d/proxy.toml"
}

row_agenshield_swap() {
  row_agenshield_secrets
  stop_pgroup "$ROW_PID"
  local d=$S/agenshield_secrets
  sed -i 's/^inject = .*$/secrets = ["bench"]\nswap = ["headers", "url", "body"]/' "$d/policies/bench.toml"
  ROW_DESC="$("$AGENSHIELD_BIN" --version), transparent, 21 secrets, the placeholder in each JSON body swapped"
  start_proxy "$AGENSHIELD_BIN" proxy run --config "$d/proxy.toml"
}

body_swap() { # keep-alive POSTs of a JSON body with a placeholder; req/s per row and run
  local lua=$S/post-placeholder.lua pad
  pad=$(head -c 900 /dev/zero | tr '\0' x)
  cat >"$lua" <<LUA
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"model":"bench","client_secret":"agenshield:secret:bench","pad":"$pad"}'
LUA
  chmod 0644 "$lua"
  local rep row rps out
  for ((rep = 1; rep <= REPEATS; rep++)); do
    for row in agenshield agenshield_swap; do
      ROW=$row REP=$rep
      reset_row
      "row_$row"
      nft_up "$ROW_PORT" "$ROW_PORT"
      as_agent wrk -t1 -c4 -d2s --timeout 5s -s "$lua" "$ROW_URL/small" >/dev/null 2>&1 || true
      out=$(as_agent wrk -t2 -c32 -d"${DUR}s" --timeout 5s -s "$lua" "$ROW_URL/small" 2>&1 || true)
      rps=$(awk '/Requests\/sec/{print $2}' <<<"$out")
      log "body swap: $row (run $rep): ${rps:-?} req/s"
      printf '%s\t%s\t%s\n' "$row" "$rep" "${rps:-0}" >>"$S/body-swap.tsv"
      row_cleanup
    done
  done
  python3 - "$S/body-swap.tsv" <<'PY' | tee -a "$RESULTS_MD"
import sys, collections
runs = collections.defaultdict(dict)
for line in open(sys.argv[1]):
    row, rep, rps = line.split()
    runs[int(rep)][row] = float(rps)
print("\n## Body swap: keep-alive POST, 1 KiB JSON body with a placeholder\n")
print("| run | secrets off req/s | body swapped req/s | ratio |")
print("|---:|---:|---:|---:|")
best = {}
for rep in sorted(runs):
    off, on = runs[rep].get("agenshield", 0), runs[rep].get("agenshield_swap", 0)
    best = {"off": max(best.get("off", 0), off), "on": max(best.get("on", 0), on)}
    print(f"| {rep} | {off:,.0f} | {on:,.0f} | {on / off:.2f} |" if off else f"| {rep} | – | – | – |")
if best.get("off"):
    print(f"| best | {best['off']:,.0f} | {best['on']:,.0f} | {best['on'] / best['off']:.2f} |")
PY
}

main
: >"$S/body-swap.tsv"
body_swap
