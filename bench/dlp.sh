#!/usr/bin/env bash
# What the credential check (docs/dlp.md) costs on the data path: two rows of the same daemon
# and policy, `agenshield_dlp` (the rule as written: `dlp` unset, so "block", every URL,
# header and body scanned) and `agenshield_dlp_off` (the same rule with `dlp = "off"`), through
# the shared harness (keep-alive and h2 req/s, connection-close, the 64 MiB download); the
# `agenshield_dlp` row's ratios are against `agenshield_dlp_off` (its baseline): goal >= 0.9.
# Then a 64 MiB upload (POST, base64 text in 76-character lines, the body scanned as it
# streams) through each row to a small sink on 127.0.0.2, median of 3, as MB/s and the
# ratio on/off: goal >= 0.8.
#
#   flock /tmp/lead-bench.lock sudo bench/dlp.sh
#   REPEATS=3 DUR=10 flock /tmp/lead-bench.lock sudo bench/dlp.sh
#   AGENSHIELD_BIN=/path/to/agenshield flock /tmp/lead-bench.lock sudo bench/dlp.sh   # no build
#
# Needs root, nginx-light, wrk, nghttp2-client, nftables, python3. Traffic stays on loopback
# (the harness's 127.0.0.2); every transfer is bounded (curl --max-time).
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
ROWS="${ROWS:-direct agenshield_dlp_off agenshield_dlp}"
export RESULTS_MD="${RESULTS_MD:-$here/results-dlp-$(date -u +%Y-%m-%d).md}"
UPLOAD_MB=${UPLOAD_MB:-64}

# shellcheck source=/dev/null
source "$harness"   # defines the harness's functions without running it

# The upload sink: plain HTTP on 127.0.0.2, reads each request body whole (1 MiB reads) and
# answers 200 with the byte count. Started here, stopped with the harness's teardown.
SINK_PORT=${SINK_PORT:-$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.2", 0)); print(s.getsockname()[1])')}
SINK_DIR=$(mktemp -d /tmp/agenshield-bench-dlp.XXXXXX)
chmod 755 "$SINK_DIR"
cat >"$SINK_DIR/sink.py" <<'PY'
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class Sink(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        left = int(self.headers.get("Content-Length") or 0)
        got = 0
        while left > 0:
            chunk = self.rfile.read(min(left, 1 << 20))
            if not chunk:
                break
            got += len(chunk)
            left -= len(chunk)
        body = f"{got}\n".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass

ThreadingHTTPServer(("127.0.0.2", int(sys.argv[1])), Sink).serve_forever()
PY
python3 "$SINK_DIR/sink.py" "$SINK_PORT" >"$SINK_DIR/sink.log" 2>&1 &
SINK_PID=$!
# Until the harness's main sets its own trap (the teardown below, which also stops the sink).
trap 'kill "$SINK_PID" 2>/dev/null; rm -rf "$SINK_DIR"' EXIT
for _ in $(seq 1 100); do
  ss -ltnH "sport = :$SINK_PORT" | grep -q . && break
  sleep 0.1
done
ss -ltnH "sport = :$SINK_PORT" | grep -q . || { echo "bench: the upload sink did not start" >&2; exit 2; }
# The upload: base64 text (what an agent uploads most: encoded files, JSON), 76 a line.
# (base64 is cut short by the second head: its SIGPIPE is expected, the size is checked.)
{ head -c $((UPLOAD_MB << 20)) /dev/urandom | base64 -w 76 | head -c $((UPLOAD_MB << 20)); } >"$SINK_DIR/upload.txt" || true
[ "$(stat -c %s "$SINK_DIR/upload.txt")" -eq $((UPLOAD_MB << 20)) ] || { echo "bench: could not write the upload" >&2; exit 2; }
chmod 644 "$SINK_DIR/upload.txt"

eval "$(declare -f teardown | sed '1s/^teardown/harness_teardown/')"
teardown() {
  harness_teardown
  kill "$SINK_PID" 2>/dev/null
  wait "$SINK_PID" 2>/dev/null
  rm -rf "$SINK_DIR"
  return 0
}

# One daemon config for both rows; $1: extra rule lines (`dlp = "off"` or nothing).
dlp_row() {
  start_row_daemon "version = 1
default = \"deny\"
mode = \"enforce\"

[[rule]]
id = \"bench-upstream\"
hosts = [\"$UP\"]
ports = [$UP_TLS, $UP_HTTP, $SINK_PORT]
action = \"allow\"
$1"
}

row_agenshield_dlp() {
  ROW_DESC="$("$AGENSHIELD_BIN" --version 2>/dev/null | head -n1), transparent, credential check on (the default)"
  ROW_BASELINE=agenshield_dlp_off
  dlp_row ""
}

row_agenshield_dlp_off() {
  ROW_DESC="$("$AGENSHIELD_BIN" --version 2>/dev/null | head -n1), transparent, dlp = \"off\" in the rule"
  dlp_row 'dlp = "off"'
}

# The 64 MiB upload through each row, REPEATS times interleaved; median of 3 per run.
upload() {
  : >"$S/dlp-upload.tsv"
  local rep row i out speeds sp
  for ((rep = 1; rep <= REPEATS; rep++)); do
    for row in agenshield_dlp_off agenshield_dlp; do
      ROW=$row REP=$rep
      reset_row
      "row_$row"
      nft_up "$ROW_PORT" "$ROW_PORT"
      nft add rule $NFT_TABLE output meta skuid "$AGENT_UID" ip daddr "$UP" tcp dport "$SINK_PORT" redirect to :"$ROW_PORT"
      assert_target "" "$UP"
      speeds=()
      for i in 1 2 3; do
        out=$(as_agent curl -s --max-time 120 -o /dev/null -X POST -H 'Content-Type: text/plain' \
          --data-binary @"$SINK_DIR/upload.txt" -w '%{speed_upload} %{size_upload} %{http_code}' \
          "http://$UP:$SINK_PORT/upload" 2>>"$S/logs/dlp-upload.err" || true)
        read -r sp size code <<<"$out"
        if [[ $code == 200 && $size == $((UPLOAD_MB << 20)) ]]; then
          speeds+=("$sp")
        else
          log "upload: $row (run $rep) failed: $out"
        fi
      done
      if ((${#speeds[@]})); then
        sp=$(printf '%s\n' "${speeds[@]}" | sort -g | awk '{a[NR]=$1} END{printf "%.1f", a[int((NR+1)/2)]/1e6}')
      else
        sp=0
      fi
      log "upload: $row (run $rep): median $sp MB/s (${speeds[*]:-none} B/s)"
      printf '%s\t%s\t%s\n' "$row" "$rep" "$sp" >>"$S/dlp-upload.tsv"
      row_cleanup
    done
  done
  python3 - "$S/dlp-upload.tsv" "$UPLOAD_MB" <<'PY' | tee -a "$RESULTS_MD"
import sys, collections
runs = collections.defaultdict(dict)
for line in open(sys.argv[1]):
    row, rep, mbps = line.split()
    runs[int(rep)][row] = float(mbps)
print(f"\n## Upload: {sys.argv[2]} MiB POST (base64 text), median of 3 per run\n")
print("| run | dlp off MB/s | dlp on MB/s | ratio (goal >= 0.8) |")
print("|---:|---:|---:|---:|")
best = {}
for rep in sorted(runs):
    off, on = runs[rep].get("agenshield_dlp_off", 0), runs[rep].get("agenshield_dlp", 0)
    best = {"off": max(best.get("off", 0), off), "on": max(best.get("on", 0), on)}
    print(f"| {rep} | {off:,.1f} | {on:,.1f} | {on / off:.2f} |" if off else f"| {rep} | – | – | – |")
if best.get("off"):
    print(f"| best | {best['off']:,.1f} | {best['on']:,.1f} | {best['on'] / best['off']:.2f} |")
PY
}

main
upload
