#!/usr/bin/env bash
# Where an HTTP/2 request's CPU goes, per process: the harness's h2 column (`h2load -c 16
# -m 10`) for `direct`, `haproxy` and `agenshield`, with the CPU the client (h2load), nginx
# and the proxy each spent per request, and their system calls per request (`perf stat`).
# The peer table gives only the proxy's own CPU; this says whether a proxy also makes the
# client and the upstream work harder (more TLS records to read, more reads per response).
#
#   sudo bench/h2-split.sh
#   N=200000 REPEATS=2 AGENSHIELD_BIN=/path/to/agenshield sudo bench/h2-split.sh
#   BASE_BIN=/tmp/base ROWS="agenshield_base agenshield" sudo bench/h2-split.sh   # A/B
#
# Prints one line per row and run; the raw h2load output and `perf stat` files stay in
# $S/raw. Needs root, perf (linux-perf) and what bench/peers.sh needs. Traffic stays on
# 127.0.0.2; every run is bounded (h2load -n under timeout).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=harness.sh
. "$here/harness.sh"
command -v perf >/dev/null || { echo "bench: perf is missing (apt-get install linux-perf)" >&2; exit 2; }
if [ -z "${AGENSHIELD_BIN:-}" ]; then
  (cd "$root" && cargo build --release -q -p agenshield-proxy)
  AGENSHIELD_BIN="$root/target/release/agenshield"
fi
AGENSHIELD_BIN=$(agent_bin "$AGENSHIELD_BIN")
[ -n "${BASE_BIN:-}" ] && BASE_BIN=$(agent_bin "$BASE_BIN") && export BASE_BIN
export AGENSHIELD_BIN
SPLIT_ROWS="${ROWS:-direct haproxy agenshield}"
N="${N:-200000}"
SPLIT_REPEATS="${REPEATS:-2}"
EVENTS='task-clock,syscalls:sys_enter_read,syscalls:sys_enter_recvfrom,syscalls:sys_enter_write,syscalls:sys_enter_writev,syscalls:sys_enter_sendto,syscalls:sys_enter_epoll_wait'

# shellcheck source=/dev/null
source "$harness"   # defines the harness's functions without running it

ticks() { # pids... -> utime + stime, in clock ticks
  local t=0 p
  for p in "$@"; do
    [[ -r /proc/$p/stat ]] && t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat")))
  done
  echo "$t"
}

# per_req FILE: "name value/request" for each counter of a `perf stat -o` file.
per_req() {
  awk -v n="$N" '/task-clock/ { gsub(",", "", $1); printf " cpu %.1fus", $1 * 1000 / n }
    /syscalls:sys_enter_/ { gsub(",", "", $1); sub("syscalls:sys_enter_", "", $2); if ($1 > 0) printf " %s %.2f", $2, $1 / n }' "$1"
}

split_row() { # $1 row  $2 run
  ROW=$1 REP=$2
  reset_row
  "row_$ROW"
  if [[ -n $ROW_SKIP ]]; then log "$ROW: skipped: $ROW_SKIP"; return 0; fi
  [[ -n $ROW_PORT ]] && nft_up "$ROW_PORT" "${ROW_HTTP_PORT:-$ROW_PORT}"
  assert_target "" "$UP"
  as_agent wrk -t1 -c4 -d2s --timeout 5s "$ROW_URL/small" >/dev/null 2>&1 || true
  local raw=$S/raw/split-$ROW-$REP nginx proxy="" stat_pid=""
  nginx=$(pgrep -x nginx | tr '\n' ' ')
  if [[ -n $ROW_PID ]]; then
    proxy=$(pid_tree "$ROW_PID" | tr '\n' ' ')
    perf stat -e "$EVENTS" -p "${proxy// /,}" -o "$raw-proxy.stat" 2>/dev/null &
    stat_pid=$!
    sleep 0.5
  fi
  local n0 p0
  # shellcheck disable=SC2086
  n0=$(ticks $nginx); p0=$(ticks $proxy)
  perf stat -e "$EVENTS" -o "$raw-client.stat" -- \
    setpriv --reuid="$AGENT_UID" --regid="$AGENT_UID" --clear-groups -- \
    timeout 120 h2load -n "$N" -c 16 -m 10 "$ROW_URL/small" >"$raw-h2.txt" 2>&1 || true
  local n1 p1
  # shellcheck disable=SC2086
  n1=$(ticks $nginx); p1=$(ticks $proxy)
  if [[ -n $stat_pid ]]; then kill -INT "$stat_pid"; wait "$stat_pid" 2>/dev/null || true; fi
  local rps ok
  rps=$(sed -n 's/.*finished in [^,]*, \([0-9.]*\) req\/s.*/\1/p' "$raw-h2.txt")
  ok=$(sed -n 's/.* \([0-9]*\) succeeded.*/\1/p' "$raw-h2.txt")
  printf '%-16s run %s: %8.0f req/s (%s/%s ok); us/req nginx %.1f, proxy %.1f (ticks)\n' \
    "$ROW" "$REP" "${rps:-0}" "${ok:-0}" "$N" \
    "$(awk -v t=$((n1 - n0)) -v hz="$CLK_TCK" -v n="$N" 'BEGIN { print t / hz * 1e6 / n }')" \
    "$(awk -v t=$((p1 - p0)) -v hz="$CLK_TCK" -v n="$N" 'BEGIN { print t / hz * 1e6 / n }')"
  printf '    client per request:%s\n' "$(per_req "$raw-client.stat")"
  [[ -n $stat_pid ]] && printf '    proxy per request: %s\n' "$(per_req "$raw-proxy.stat")"
  row_cleanup
}

main_split() {
  harness_start
  log "h2load -n $N -c 16 -m 10; rows: $SPLIT_ROWS; $SPLIT_REPEATS runs each, interleaved"
  local rep row
  for ((rep = 1; rep <= SPLIT_REPEATS; rep++)); do
    for row in $SPLIT_ROWS; do split_row "$row" "$rep"; done
  done
  local g; g=$(guard_count)
  [[ ${g:-0} == 0 ]] || log "WARNING: benchguard rejected $g non-loopback packets"
}
main_split "$@"
