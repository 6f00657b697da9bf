#!/usr/bin/env bash
# Two builds of agenshield side by side, with `direct`, in one run of the shared harness: the
# `agenshield_base` row runs BASE_BIN, the `agenshield` row the build under test. For "before
# and after" figures of a change, measured in the same sitting on the same machine, runs
# interleaved (all rows, then all rows again).
#
#   git stash; cargo build --release -p agenshield-proxy; cp target/release/agenshield /tmp/base
#   git stash pop
#   BASE_BIN=/tmp/base sudo bench/ab.sh
#   BASE_BIN=/tmp/base REPEATS=3 DUR=10 sudo bench/ab.sh
#
# Needs root, nginx-light, wrk, nghttp2-client, nftables. Traffic stays on 127.0.0.2.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=harness.sh
. "$here/harness.sh"
[ -x "${BASE_BIN:-}" ] || { echo "bench: set BASE_BIN to the baseline agenshield binary" >&2; exit 2; }
if [ -z "${AGENSHIELD_BIN:-}" ]; then
  (cd "$root" && cargo build --release -q -p agenshield-proxy)
  AGENSHIELD_BIN="$root/target/release/agenshield"
fi
AGENSHIELD_BIN=$(agent_bin "$AGENSHIELD_BIN")
BASE_BIN=$(agent_bin "$BASE_BIN")
export AGENSHIELD_BIN BASE_BIN
ROWS="${ROWS:-direct agenshield_base agenshield}"
export RESULTS_MD="${RESULTS_MD:-$here/results-ab-$(date -u +%Y-%m-%d).md}"

# shellcheck source=/dev/null
source "$harness"   # defines the harness's functions without running it

# row_agenshield_base: bench/harness.sh
main
