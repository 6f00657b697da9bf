# Sourced by the bench scripts that drive the shared harness (after setting `here` to their
# own directory): sets `root` and `harness`, and stops unless the harness is there and we
# are root (the harness makes nftables rules and a second uid). Defines the pieces our
# scripts share on top of the harness (below).
root="$(dirname "$here")"
harness="${HARNESS:-$root/../shared/bench/peers.sh}"
[ -f "$harness" ] || { echo "bench: harness not found at $harness" >&2; exit 2; }
[ "$(id -u)" -eq 0 ] || { echo "bench: needs root (nftables, a second uid)" >&2; exit 2; }

# The functions below run after the script has sourced "$harness" (they call its functions).

# The harness's agenshield row again, running BASE_BIN: "before and after" of a change in
# one sitting (bench/ab.sh, bench/h2-split.sh).
row_agenshield_base() {
  [ -x "${BASE_BIN:-}" ] || { ROW_SKIP="BASE_BIN not set"; return; }
  local bin=$AGENSHIELD_BIN
  AGENSHIELD_BIN=$BASE_BIN
  row_agenshield
  AGENSHIELD_BIN=$bin
  ROW_DESC="baseline: $ROW_DESC ($BASE_BIN)"
}

# What the harness's own main does before its rows, for scripts that run their own rows
# (bench/profile.sh, bench/h2-split.sh): leftovers of an interrupted run removed, the
# upstream, agent uid and guard set up, and everything torn down on exit.
harness_start() {
  POLLER_PID="" ROW_PID=""
  trap teardown EXIT
  trap 'exit 130' INT TERM
  nft_down; guard_down; stop_nginx
  ip netns del "$NS" 2>/dev/null || true
  rm -rf "$S/raw" "$S/logs"; mkdir -p "$S/raw" "$S/logs"
  : >"$S/results.tsv"
  setup
}

# agent_bin BIN: `BIN` wrapped so the harness's client uid is our agent user (bench/as-agent.sh): since the
# transparent listener serves agent users only, every row of ours runs through this.
agent_bin() {
  local w
  w=$(mktemp /tmp/agenshield-as-agent.XXXXXX)
  printf '#!/bin/sh\nREAL_BIN=%s BENCH_AGENT_UID=%s exec %s "$@"\n' \
    "$1" "${AGENT_UID:-5299}" "$here/as-agent.sh" >"$w"
  chmod +x "$w"
  echo "$w"
}

# start_row_daemon POLICY: the row's own daemon (state under $S/$ROW), transparent on :15001,
# trusting the harness's upstream CA, with POLICY (TOML text) as its one policy file
# (bench/dlp.sh, bench/mcp.sh).
start_row_daemon() {
  local d=$S/$ROW
  mkdir -p "$d/policies" "$d/state"
  printf '%s\n' "$1" >"$d/policies/bench.toml"
  cat >"$d/proxy.toml" <<CONFIG
[listen]
transparent = ["127.0.0.1:15001"]

[paths]
policies = "$d/policies"
certs = "$d/state/certs"
vault = "$d/state/vault"
audit = "$d/state/audit.jsonl"

[upstream]
extra_ca = ["$S/ca/ca.pem"]
allow_private = ["127.0.0.0/8"]
CONFIG
  ROW_PORT=15001
  start_proxy "$AGENSHIELD_BIN" proxy run --config "$d/proxy.toml"
}
