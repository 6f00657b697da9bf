#!/usr/bin/env bash
# What MCP filtering (issue 37, docs/architecture.md "MCP") costs on a large answer: an MCP
# server's `tools/list` result of about 1 MiB (TOOLS tools, half named `read_*`), answered
# over keep-alive HTTP by nginx on 127.0.0.2, fetched by wrk as the agent uid (POST of the
# JSON-RPC request, as an MCP client sends it) through the transparent listener, in rows:
#
#   direct       no proxy (for scale)
#   mcp_off      the daemon, the rule without `mcp`: the answer streams through untouched
#   mcp          the rule with `mcp = { tools = ["read_*"] }`: the request body is read and
#                decided, the answer read whole, parsed, filtered to the read_* half and
#                written again
#   mcp_pin      the same with `pin = true`: every listed tool's definition hashed and
#                compared with its pin
#
# Each row is probed first (the tool count the client sees is checked: all of them off, the
# read_* half under a rule); ratios are against `mcp_off` in the same run (req/s, and the
# proxy's CPU per request). REPEATS runs, interleaved.
#
#   flock /tmp/lead-bench.lock sudo bench/mcp.sh
#   REPEATS=3 DUR=10 AGENSHIELD_BIN=/path/to/agenshield flock /tmp/lead-bench.lock sudo bench/mcp.sh
#
# Needs root, nginx-light, wrk, nftables, python3. Traffic stays on loopback (127.0.0.2);
# every load run is bounded in time (wrk -d, curl --max-time).
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
export RESULTS_MD="${RESULTS_MD:-$here/results-mcp-$(date -u +%Y-%m-%d).md}"
TOOLS=${TOOLS:-1000}
MCP_ROWS="${MCP_ROWS:-direct mcp_off mcp mcp_pin}"

# shellcheck source=/dev/null
source "$harness"   # defines the harness's functions without running it

MCP_PORT=${MCP_PORT:-$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.2", 0)); print(s.getsockname()[1])')}
MCP_DIR=$(mktemp -d /tmp/agenshield-bench-mcp.XXXXXX)
chmod 755 "$MCP_DIR"
mkdir -p "$MCP_DIR/www" "$MCP_DIR/tmp"

# The answer: one JSON-RPC result listing TOOLS tools of about 1 KiB each (a description and
# an input schema, as real servers list them).
python3 - "$MCP_DIR/www/mcp" "$TOOLS" <<'PY'
import json, sys
path, n = sys.argv[1], int(sys.argv[2])
tools = []
for i in range(n):
    name = f"read_{i:05d}" if i % 2 == 0 else f"write_{i:05d}"
    tools.append({
        "name": name,
        "description": f"Tool {i}: " + "reads or writes one record of the inventory, with paging and filters; " * 9,
        "inputSchema": {
            "type": "object",
            "properties": {
                "id": {"type": "string", "description": "The record's id, as listed."},
                "page": {"type": "integer", "minimum": 0, "description": "Which page."},
                "filter": {"type": "string", "description": "A filter expression over the fields."},
            },
            "required": ["id"],
        },
    })
json.dump({"jsonrpc": "2.0", "id": 1, "result": {"tools": tools}}, open(path, "w"))
PY
chmod -R a+rX "$MCP_DIR"
ANSWER_BYTES=$(stat -c %s "$MCP_DIR/www/mcp")

# nginx answers the POST with the file (error_page turns the static module's 405 into an
# internal GET of the same file, answered 200).
cat >"$MCP_DIR/nginx.conf" <<NGINX
worker_processes 1;
pid $MCP_DIR/nginx.pid;
events { worker_connections 1024; }
http {
  access_log off;
  error_log $MCP_DIR/error.log warn;
  client_body_temp_path $MCP_DIR/tmp/body;
  proxy_temp_path $MCP_DIR/tmp/proxy;
  fastcgi_temp_path $MCP_DIR/tmp/fcgi;
  uwsgi_temp_path $MCP_DIR/tmp/uwsgi;
  scgi_temp_path $MCP_DIR/tmp/scgi;
  sendfile on;
  keepalive_requests 1000000;
  server {
    listen 127.0.0.2:$MCP_PORT;
    root $MCP_DIR/www;
    location = /mcp {
      types { }
      default_type application/json;
      error_page 405 =200 \$uri;
    }
  }
}
NGINX
nginx -p "$MCP_DIR/" -e "$MCP_DIR/error.log" -c "$MCP_DIR/nginx.conf"
trap 'kill "$(cat "$MCP_DIR/nginx.pid" 2>/dev/null)" 2>/dev/null; rm -rf "$MCP_DIR"' EXIT

cat >"$MCP_DIR/post.lua" <<'LUA'
wrk.method = "POST"
wrk.body = '{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Accept"] = "application/json, text/event-stream"
LUA
chmod 644 "$MCP_DIR/post.lua"

eval "$(declare -f teardown | sed '1s/^teardown/harness_teardown/')"
teardown() {
  harness_teardown
  [[ -s $MCP_DIR/nginx.pid ]] && kill "$(cat "$MCP_DIR/nginx.pid")" 2>/dev/null
  rm -rf "$MCP_DIR"
  return 0
}

# One daemon per row; $1: the rule's mcp line (empty: none).
mcp_daemon() {
  start_row_daemon "version = 1
default = \"deny\"
mode = \"enforce\"

[[rule]]
id = \"bench-mcp\"
hosts = [\"$UP\"]
ports = [$MCP_PORT]
action = \"allow\"
$1"
}

# What each row is, and how many tools its client must see.
mcp_row() {
  case $1 in
    direct) ROW_PORT="" EXPECT=$TOOLS ;;
    mcp_off) mcp_daemon "" ; EXPECT=$TOOLS ;;
    mcp) mcp_daemon 'mcp = { tools = ["read_*"] }'; EXPECT=$((TOOLS / 2 + TOOLS % 2)) ;;
    mcp_pin) mcp_daemon 'mcp = { tools = ["read_*"], pin = true }'; EXPECT=$((TOOLS / 2 + TOOLS % 2)) ;;
    *) die "no such row: $1" ;;
  esac
}

harness_start
: >"$S/mcp.tsv"
URL="http://$UP:$MCP_PORT/mcp"
assert_target "" "$UP"
log "MCP answer: $TOOLS tools, $ANSWER_BYTES bytes, from nginx on $UP:$MCP_PORT"
for ((rep = 1; rep <= REPEATS; rep++)); do
  for row in $MCP_ROWS; do
    ROW=$row REP=$rep
    reset_row
    mcp_row "$row"
    if [[ -n $ROW_PORT ]]; then
      nft_up "$ROW_PORT" "$ROW_PORT"
      nft add rule $NFT_TABLE output meta skuid "$AGENT_UID" ip daddr "$UP" tcp dport "$MCP_PORT" redirect to :"$ROW_PORT"
    fi
    # The probe: the answer the client sees, and its tool count.
    got=$(as_agent curl -s --max-time 20 -X POST -H 'Content-Type: application/json' \
      -H 'Accept: application/json, text/event-stream' \
      --data '{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}' "$URL" |
      python3 -c 'import json,sys; print(len(json.load(sys.stdin)["result"]["tools"]))' 2>/dev/null || echo none)
    if [[ $got != "$EXPECT" ]]; then
      log "$row (run $rep): the client saw $got tools, not $EXPECT"
      row_cleanup
      exit 1
    fi
    as_agent wrk -t1 -c4 -d2s --timeout 5s -s "$MCP_DIR/post.lua" "$URL" >/dev/null 2>&1 || true
    raw=$S/raw/mcp-$row-$rep.txt
    measured "$raw" wrk -t1 -c4 -d"${DUR}s" --timeout 10s --latency -s "$MCP_DIR/post.lua" "$URL"
    read -r rps p50 p99 n err < <(wrk_parse "$raw")
    cpu=nan
    [[ -n $ROW_PID ]] && cpu=$(cpu_us_per_req "$M_TICKS" "$n")
    log "$row (run $rep): $got tools seen; $rps req/s p50 ${p50}ms p99 ${p99}ms errors $err/$n; proxy CPU ${cpu} us/req"
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$row" "$rep" "$rps" "$p50" "$cpu" "$err/$n" >>"$S/mcp.tsv"
    row_cleanup
  done
done

python3 - "$S/mcp.tsv" "$TOOLS" "$ANSWER_BYTES" "$DUR" "$REPEATS" "$(nproc)" <<'PY' | tee -a "$RESULTS_MD"
import sys, collections, statistics
tsv, tools, size, dur, repeats, cpus = sys.argv[1:]
runs = collections.defaultdict(dict)
for line in open(tsv):
    row, rep, rps, p50, cpu, err = line.split("\t")
    runs[row][int(rep)] = (float(rps), float(p50), cpu, err.strip())
print(f"\n## MCP: filtering a {int(size) / 1048576:.2f} MiB `tools/list` answer ({tools} tools)\n")
print(f"wrk -t1 -c4 -d{dur}s, POST tools/list over keep-alive HTTP; {repeats} run(s); {cpus} cores.")
print("Ratios against `mcp_off` (the same daemon, the rule without `mcp`) in the same run.\n")
print("| row | run | req/s | p50 ms | proxy CPU µs/req | errors | req/s vs mcp_off |")
print("|---|---:|---:|---:|---:|---:|---:|")
order = [r for r in ["direct", "mcp_off", "mcp", "mcp_pin"] if r in runs]
for row in order:
    for rep in sorted(runs[row]):
        rps, p50, cpu, err = runs[row][rep]
        base = runs.get("mcp_off", {}).get(rep)
        ratio = f"{rps / base[0]:.2f}" if base and base[0] else "–"
        print(f"| {row} | {rep} | {rps:,.0f} | {p50:.2f} | {cpu} | {err} | {ratio} |")
print()
for row in order:
    if row == "mcp_off" or "mcp_off" not in runs:
        continue
    ratios = [runs[row][r][0] / runs["mcp_off"][r][0] for r in runs[row] if r in runs["mcp_off"]]
    if ratios:
        print(f"- {row}: median ratio {statistics.median(ratios):.2f} over {len(ratios)} run(s)")
PY
