#!/usr/bin/env bash
# Instructions per request, two builds side by side: each daemon runs under valgrind's
# callgrind while a fixed number of requests (h2load, keep-alive HTTP/1.1 and h2) goes through
# it, with the counters zeroed after a warm-up. Instruction counts do not depend on what else
# the machine is doing, so this answers "did the change make a request cost more?" on a busy
# 2-core machine where req/s differences under ~15% are noise (bench/ab.sh says how noisy).
# The figure is not speed: valgrind runs the daemon's threads one at a time, so it misses lock
# contention and cache effects; read it beside bench/ab.sh, not instead of it.
#
#   BASE_BIN=/tmp/base sudo bench/instructions.sh             # base against this tree's release build
#   BASE_BIN=/tmp/base AGENSHIELD_BIN=/tmp/new N=2000 WORKLOADS=h2 sudo bench/instructions.sh
#
# Writes bench/results-instructions-<date>.md. Needs root, valgrind, and what bench/peers.sh
# needs. Traffic stays on 127.0.0.2; every load is bounded in count and time.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=harness.sh
. "$here/harness.sh"
for t in valgrind callgrind_control h2load; do
  command -v "$t" >/dev/null || { echo "bench: $t is missing (valgrind, nghttp2-client)" >&2; exit 2; }
done
[ -x "${BASE_BIN:-}" ] || { echo "bench: set BASE_BIN to the baseline agenshield binary" >&2; exit 2; }
if [ -z "${AGENSHIELD_BIN:-}" ]; then
  (cd "$root" && cargo build --release -q -p agenshield-proxy)
  AGENSHIELD_BIN="$root/target/release/agenshield"
fi
BASE_REAL=$BASE_BIN NEW_REAL=$AGENSHIELD_BIN
N="${N:-3000}"
WORKLOADS="${WORKLOADS:-ka h2}"
OUT_MD="${OUT_MD:-$here/results-instructions-$(date -u +%Y-%m-%d).md}"

# shellcheck source=/dev/null
source "$harness"   # defines the harness's functions without running it

workload() { # $1 name, $2 requests: the load, bounded, as the agent uid
  case $1 in
    ka) as_agent timeout 900 h2load --h1 -n "$2" -c 8 "$ROW_URL/small" ;;
    h2) as_agent timeout 900 h2load -n "$2" -c 8 -m 10 "$ROW_URL/small" ;;
    *) die "no such workload: $1" ;;
  esac
}

# vg_wrap BIN PREFIX: a wrapper that runs BIN under callgrind, dumping to PREFIX.<pid>[.n].
vg_wrap() {
  local w
  w=$(mktemp /tmp/agenshield-vg.XXXXXX)
  # --trace-children: the daemon serves from a child process it starts (daemon/privsep).
  printf '#!/bin/sh\nexec valgrind -q --tool=callgrind --trace-children=yes --callgrind-out-file=%s.%%p "%s" "$@"\n' "$2" "$1" >"$w"
  chmod +x "$w"
  echo "$w"
}

# The sum of the Ir totals of the dumps a callgrind_control -d wrote.
dumped_ir() { # $1 prefix
  local f s=0 v
  for f in "$1".*.[0-9]*; do
    [ -e "$f" ] || continue
    v=$(awk '/^(summary|totals):/ {print $2; exit}' "$f")
    s=$((s + ${v:-0}))
  done
  echo "$s"
}

succeeded() { sed -n 's/^requests: .* \([0-9]*\) succeeded.*/\1/p' "$1" | head -n1; }

declare -A IR DONE
measure() { # $1 label, $2 binary
  local label=$1 prefix w
  ROW=agenshield REP=1
  reset_row
  prefix="$S/cg-$label"
  rm -f "$prefix".*
  AGENSHIELD_BIN=$(agent_bin "$(vg_wrap "$2" "$prefix")")
  row_agenshield
  nft_up "$ROW_PORT" "$ROW_PORT"
  assert_target "" "$UP"
  # Warm-up: the CA, the leaf cache, the upstream pool, the first allocations.
  as_agent timeout 300 h2load -n 200 -c 4 -m 10 "$ROW_URL/small" >"$S/logs/vg-warm-$label.txt" 2>&1 || true
  for w in $WORKLOADS; do
    rm -f "$prefix".*.[0-9]*
    # Every callgrind run on the machine is one of the daemon's processes (ours alone).
    callgrind_control -z >/dev/null
    workload "$w" "$N" >"$S/logs/vg-$label-$w.txt" 2>&1 || true
    callgrind_control --dump >/dev/null
    sleep 1
    IR[$label.$w]=$(dumped_ir "$prefix")
    DONE[$label.$w]=$(succeeded "$S/logs/vg-$label-$w.txt")
    log "$label $w: ${IR[$label.$w]} instructions, ${DONE[$label.$w]:-0} requests"
  done
  row_cleanup
}

main_instructions() {
  harness_start
  if pgrep -f 'valgrind.*callgrind' >/dev/null; then die "another callgrind run is active"; fi
  measure base "$BASE_REAL"
  measure new "$NEW_REAL"
  {
    echo "# Instructions per request under callgrind: base against new"
    echo
    echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC'); $(valgrind --version); N=$N requests per workload after a 200-request warm-up"
    echo "- base: $BASE_REAL"
    echo "- new: $NEW_REAL"
    echo "- ka: \`h2load --h1 -n $N -c 8\`; h2: \`h2load -n $N -c 8 -m 10\`; 1 KiB \`/small\` through the transparent listener (bench/peers.sh's agenshield row)"
    echo
    echo "| workload | base instr/req | new instr/req | new / base |"
    echo "|---|---:|---:|---:|"
    local w b n
    for w in $WORKLOADS; do
      b=$(( ${IR[base.$w]} / ${DONE[base.$w]:-1} ))
      n=$(( ${IR[new.$w]} / ${DONE[new.$w]:-1} ))
      printf '| %s | %s | %s | %s |\n' "$w" "$b" "$n" "$(awk -v a="$n" -v b="$b" 'BEGIN { printf "%.3f", a / b }')"
    done
  } >"$OUT_MD"
  cat "$OUT_MD"
}
main_instructions "$@"
