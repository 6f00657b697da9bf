# Sourced by the bench scripts that drive the shared harness (after setting `here` to their
# own directory): sets `root` and `harness`, and stops unless the harness is there and we
# are root (the harness makes nftables rules and a second uid).
root="$(dirname "$here")"
harness="${HARNESS:-$root/../shared/bench/peers.sh}"
[ -f "$harness" ] || { echo "bench: harness not found at $harness" >&2; exit 2; }
[ "$(id -u)" -eq 0 ] || { echo "bench: needs root (nftables, a second uid)" >&2; exit 2; }
