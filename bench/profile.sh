#!/usr/bin/env bash
# Where the daemon's CPU goes, per workload, as flame graphs: the shared harness's upstream
# (nginx on 127.0.0.2) and redirect, the release daemon as in bench/peers.sh's agenshield row,
# and `perf record` on the daemon while one workload runs.
#
#   sudo bench/profile.sh                       # all workloads: ka h2 close large
#   WORKLOADS="ka h2" SECS=8 sudo bench/profile.sh
#
# Writes bench/profiles/<workload>.svg (inferno flame graph), <workload>.txt (the top
# functions, self time) and this run's command lines to bench/profiles/last-run.txt
# (commands.txt, written by hand, says what each committed profile is). Needs root, perf
# (linux-perf), inferno (`cargo install inferno`), and what bench/peers.sh needs. Traffic
# stays on 127.0.0.2; every run is bounded.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=harness.sh
. "$here/harness.sh"
for t in perf inferno-collapse-perf inferno-flamegraph; do
  command -v "$t" >/dev/null || { echo "bench: $t is missing (linux-perf; cargo install inferno)" >&2; exit 2; }
done
(cd "$root" && cargo build --release -q -p agenshield-proxy)
export AGENSHIELD_BIN
AGENSHIELD_BIN=$(agent_bin "${AGENSHIELD_BIN:-$root/target/release/agenshield}")
WORKLOADS="${WORKLOADS:-ka h2 close large}"
SECS="${SECS:-6}"
FREQ="${FREQ:-997}"
out="$here/profiles"
mkdir -p "$out"

# shellcheck source=/dev/null
source "$harness"   # defines the harness's functions without running it

workload() { # $1 name: the load, bounded, as the agent uid
  case $1 in
    ka) as_agent wrk -t2 -c32 -d"${SECS}s" --timeout 5s "$ROW_URL/small" ;;
    h2) as_agent timeout 120 h2load -D "$SECS" -c 16 -m 10 "$ROW_URL/small" ;;
    close) as_agent wrk -t2 -c16 -d"${SECS}s" --timeout 5s -H 'Connection: close' "$ROW_URL/small" ;;
    large) for _ in 1 2 3; do as_agent curl -sk --max-time 60 -o /dev/null -w '%{speed_download}\n' "$ROW_URL/large"; done ;;
    *) die "no such workload: $1" ;;
  esac
}

main_profile() {
  harness_start
  # commands.txt is written by hand (how, and what each profile is); this run's exact lines
  # go beside it.
  : >"$out/last-run.txt"
  local w
  for w in $WORKLOADS; do
    ROW=agenshield REP=1
    reset_row
    row_agenshield
    nft_up "$ROW_PORT" "$ROW_PORT"
    assert_target "" "${UP}"
    as_agent wrk -t1 -c4 -d2s --timeout 5s "$ROW_URL/small" >/dev/null 2>&1 || true
    local pids; pids=$(pid_tree "$ROW_PID" | paste -sd, -)
    log "profile $w: perf on pids $pids for the workload"
    perf record -F "$FREQ" -g --call-graph dwarf,32768 -o "$S/$w.perf" -p "$pids" -- sleep "$((SECS + 1))" \
      >"$S/logs/perf-$w.log" 2>&1 &
    local perf_pid=$!
    sleep 0.3
    workload "$w" >"$out/$w.load.txt" 2>&1 || true
    wait "$perf_pid" || true
    perf script -i "$S/$w.perf" 2>/dev/null | inferno-collapse-perf >"$S/$w.folded"
    inferno-flamegraph --minwidth 0.2 --title "agenshield: $w" <"$S/$w.folded" >"$out/$w.svg"
    perf report -i "$S/$w.perf" --no-children --sort symbol --stdio 2>/dev/null |
      awk '/^ +[0-9.]+%/ && n < 40 { sub(/[ -]+$/, ""); print; n++ }' >"$out/$w.txt"
    printf '%s: perf record -F %s -g --call-graph dwarf,32768 -p <daemon pids> -- sleep %s, while: %s\n' \
      "$w" "$FREQ" "$((SECS + 1))" "$(declare -f workload | grep -A1 "^ *$w)" | tail -n1 | sed 's/^ *//; s/;* *$//')" >>"$out/last-run.txt"
    row_cleanup
  done
  log "wrote $out/{$(echo "$WORKLOADS" | tr ' ' ,)}.{svg,txt}"
}
main_profile "$@"
