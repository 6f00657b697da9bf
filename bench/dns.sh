#!/usr/bin/env bash
# Queries per second through the agent's DNS stub, against asking the resolver directly, in
# one run. The resolver is dnsmasq inside a network namespace this script creates (answers
# from its own records, forwards nothing); dnsperf asks it directly (`direct`), then asks the
# stub, whose policy allows the names and whose resolver is that dnsmasq (`stub`), then asks
# the stub for names no rule allows (`stub_nxdomain`: refused locally, every one recorded).
# Audit and metrics on, as shipped. Rows interleave REPEATS times; the best of each is kept.
#
#   sudo bench/dns.sh
#   REPEATS=3 DUR=10 sudo bench/dns.sh
#
# Needs root, dnsperf, dnsmasq-base, iproute2. Traffic stays on loopback and in the namespace.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
[ "$(id -u)" -eq 0 ] || { echo "bench: needs root (a network namespace)" >&2; exit 2; }
for t in dnsperf dnsmasq ip; do
  command -v "$t" >/dev/null || { echo "bench: $t is missing (apt-get install dnsperf dnsmasq-base iproute2)" >&2; exit 2; }
done
REPEATS="${REPEATS:-3}"
DUR="${DUR:-10}"
CLIENTS="${CLIENTS:-4}"
NAMES="${NAMES:-1000}"
RESULTS_MD="${RESULTS_MD:-$here/results-dns-$(date -u +%Y-%m-%d).md}"
if [ -z "${AGENSHIELD_BIN:-}" ]; then
  (cd "$root" && cargo build --release -q -p agenshield-proxy)
  AGENSHIELD_BIN="$root/target/release/agenshield"
fi

NS=ashbenchdns
HOST_IF=ashbdh
NS_IF=ashbdn
RESOLVER=10.215.0.2
STUB_PORT=25053
S="$(mktemp -d /tmp/agenshield-bench-dns.XXXXXX)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  ip netns del "$NS" 2>/dev/null || true
  ip link del "$HOST_IF" 2>/dev/null || true
  rm -rf "$S"
}
trap cleanup EXIT

ip netns del "$NS" 2>/dev/null || true
ip link del "$HOST_IF" 2>/dev/null || true
ip netns add "$NS"
ip link add "$HOST_IF" type veth peer name "$NS_IF"
ip link set "$NS_IF" netns "$NS"
ip addr add 10.215.0.1/24 dev "$HOST_IF"
ip link set "$HOST_IF" up
ip -n "$NS" addr add "$RESOLVER/24" dev "$NS_IF"
ip -n "$NS" link set "$NS_IF" up
ip -n "$NS" link set lo up
# Network safety: the resolver's address must route into the namespace, nowhere else.
ip route get "$RESOLVER" | grep -q "dev $HOST_IF " || { echo "bench: $RESOLVER does not route to $HOST_IF" >&2; exit 1; }

records=()
: >"$S/allowed.txt"
: >"$S/unlisted.txt"
for i in $(seq 0 $((NAMES - 1))); do
  records+=("--host-record=name$i.bench.test,10.215.1.$((i % 250 + 1))")
  echo "name$i.bench.test A" >>"$S/allowed.txt"
  echo "name$i.unlisted.test A" >>"$S/unlisted.txt"
done
ip netns exec "$NS" dnsmasq --keep-in-foreground --no-resolv --no-hosts --no-poll \
  --bind-interfaces --listen-address="$RESOLVER" --port=53 --user=root --pid-file= \
  --cache-size=10000 --local-ttl=300 "${records[@]}" &
pids+=($!)

mkdir -p "$S/proxy/policies"
cat >"$S/proxy/policies/bench.toml" <<'POLICY'
version = 1
default = "deny"
[[rule]]
id = "bench-names"
hosts = ["*.bench.test"]
action = "allow"
POLICY
cat >"$S/proxy/proxy.toml" <<CONFIG
[listen]
transparent = ["127.0.0.1:0"]
explicit = "127.0.0.1:0"
dns = "127.0.0.1:$STUB_PORT"
metrics = "127.0.0.1:0"
admin = "$S/proxy/proxy.sock"
[paths]
policies = "$S/proxy/policies"
certs = "$S/proxy/certs"
vault = "$S/proxy/vault"
audit = "$S/proxy/audit.jsonl"
[upstream]
allow_private = ["10.215.0.0/16"]
[resolver]
nameservers = ["$RESOLVER"]
CONFIG
AGENSHIELD_LOG=warn "$AGENSHIELD_BIN" proxy run --config "$S/proxy/proxy.toml" >"$S/proxy/out.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do
  grep -q "agenshield: ready" "$S/proxy/out.log" && break
  sleep 0.1
done
grep -q "agenshield: ready" "$S/proxy/out.log" || { cat "$S/proxy/out.log" >&2; exit 1; }

# One dnsperf run: queries per second, and the share answered.
run() {
  local server=$1 port=$2 file=$3
  dnsperf -s "$server" -p "$port" -d "$file" -l "$DUR" -c "$CLIENTS" -q 200 -t 2 2>/dev/null |
    awk '/Queries per second/ {qps=$4} /Queries completed/ {done=$3} /Queries sent/ {sent=$3}
         END {printf "%.0f %s %s\n", qps, done, sent}'
}

declare -A best
for rep in $(seq 1 "$REPEATS"); do
  for row in direct stub stub_nxdomain; do
    case $row in
      direct) out=$(run "$RESOLVER" 53 "$S/allowed.txt") ;;
      stub) out=$(run 127.0.0.1 "$STUB_PORT" "$S/allowed.txt") ;;
      stub_nxdomain) out=$(run 127.0.0.1 "$STUB_PORT" "$S/unlisted.txt") ;;
    esac
    qps=${out%% *}
    echo "run $rep $row: $qps q/s (completed/sent: ${out#* })"
    if [ -z "${best[$row]:-}" ] || [ "$qps" -gt "${best[$row]}" ]; then best[$row]=$qps; fi
  done
done

rss=$(ps -o rss= -p "${pids[1]}" | tr -d ' ')
records_written=$(wc -l <"$S/proxy/audit.jsonl")
{
  echo "# DNS stub vs. the resolver directly ($(date -u +%Y-%m-%dT%H:%MZ))"
  echo
  echo "\`REPEATS=$REPEATS DUR=$DUR CLIENTS=$CLIENTS NAMES=$NAMES bench/dns.sh\`, $(nproc) cores,"
  echo "$("$AGENSHIELD_BIN" --version), dnsperf $(dpkg-query -W -f='${Version}' dnsperf 2>/dev/null || echo '?'),"
  echo "dnsmasq $(dnsmasq --version | awk 'NR==1 {print $3}') in a network namespace. Best of $REPEATS runs; audit and metrics on."
  echo
  echo "| row | queries/s | ratio to direct |"
  echo "|---|---:|---:|"
  for row in direct stub stub_nxdomain; do
    ratio=$(awk -v a="${best[$row]}" -v b="${best[direct]}" 'BEGIN {printf "%.2f", a / b}')
    echo "| $row | ${best[$row]} | ${ratio}× |"
  done
  echo
  echo "- direct: dnsperf asks dnsmasq in the namespace for $NAMES names it holds."
  echo "- stub: the same names through the stub (policy \`*.bench.test\` allowed), which asks"
  echo "  that dnsmasq through the proxy's resolver (hickory, caching) and records each name once per TTL."
  echo "- stub_nxdomain: $NAMES names no rule allows: answered by the stub (a synthetic address, or"
  echo "  NXDOMAIN with dns.denied = \"nxdomain\"), no resolver asked,"
  echo "  every refusal recorded (waits for the audit write)."
  echo "- daemon RSS at the end: $((rss / 1024)) MiB; audit lines written: $records_written."
} | tee "$RESULTS_MD"
