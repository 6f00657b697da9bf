#!/usr/bin/env bash
# Runs agenshield with the shared harness's config plus the one line the harness does not
# write: its client's uid is the agent (`[redirect] agent_users`). Since issue 32 the
# transparent listener serves agent users only (a connection of any other uid is refused,
# `user_not_admitted`), and the harness's client (`benchagent`, uid 5299) reaches it through
# the harness's own nft redirect, not ours. Also clears earlier runs' rotated audit files
# (below).
#
#   AGENSHIELD_BIN=bench/as-agent.sh REAL_BIN=target/release/agenshield …
# bench/ab.sh sets this up for both rows (BASE_BIN too) when AGENT_UID is known.
set -euo pipefail
real="${REAL_BIN:?set REAL_BIN to the agenshield binary}"
uid="${BENCH_AGENT_UID:-5299}"
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  if [ "${args[$i]}" = "--config" ] && [ $((i + 1)) -lt ${#args[@]} ]; then
    cfg="${args[$((i + 1))]}"
    if ! grep -q '^\[redirect\]' "$cfg"; then
      printf '\n[redirect]\nagent_users = [%s]\n' "$uid" >>"$cfg"
    fi
    # The harness keeps its state directory from run to run, audit log included: rotated
    # files of earlier runs would fill the rotation set with records younger than
    # audit.retention (24 h), and the daemon would then refuse requests rather than delete
    # them (as it must). Each run starts with the live file only.
    audit=$(sed -n 's/^audit = "\(.*\)"$/\1/p' "$cfg" | head -n1)
    if [ -n "$audit" ]; then
      rm -f "$audit".[0-9]*
    fi
  fi
done
exec "$real" "${args[@]}"
