#!/usr/bin/env bash
# bench/rpc_bench between two "hosts": two network namespaces joined by a
# veth pair (as tests/launcher/netns.h builds them), one worker in each, so
# the network rows cross a real link instead of loopback. Then again with
# the link limited by a tbf qdisc (this kernel has tbf, not netem).
#   bench/netns_bench.sh [--quick] [--rate 10gbit] [--rounds 3]
# Needs root and `ip netns`. Prints rpc_bench's JSON lines, each with
# "link": "veth" or "veth+tbf <rate>", "bulk" (the bulk channel on) and "tls"
# (mutual TLS, certificates made for the two addresses); the floors
# (tcp_echo_floor_*) cross the same link.
set -euo pipefail
cd "$(dirname "$0")/.."
QUICK="" RATE=10gbit ROUNDS=1
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=--quick ;;
    --rate) RATE="$2"; shift ;;
    --rounds) ROUNDS="$2"; shift ;;
    *) echo "usage: bench/netns_bench.sh [--quick] [--rate RATE] [--rounds N]" >&2; exit 2 ;;
  esac
  shift
done
[ "$(id -u)" = 0 ] || { echo "netns_bench.sh: needs root (ip netns)" >&2; exit 2; }
bazel build -c opt //bench:rpc_bench >/dev/null 2>&1 || bazel build -c opt //bench:rpc_bench
BENCH="$(bazel info -c opt bazel-bin 2>/dev/null)/bench/rpc_bench"
A="bnb$$a" B="bnb$$b" VA="bnv$$a" VB="bnv$$b"
ID=$(( $$ % 200 + 20 ))
ADDR_A="10.232.$ID.1" ADDR_B="10.232.$ID.2"
cleanup() { ip netns del "$A" 2>/dev/null || true; ip netns del "$B" 2>/dev/null || true; }
trap cleanup EXIT
ip netns add "$A"
ip netns add "$B"
ip link add "$VA" type veth peer name "$VB"
ip link set "$VA" netns "$A"
ip link set "$VB" netns "$B"
ip -n "$A" addr add "$ADDR_A/24" dev "$VA"
ip -n "$B" addr add "$ADDR_B/24" dev "$VB"
for ns in "$A" "$B"; do ip -n "$ns" link set lo up; done
ip -n "$A" link set "$VA" up
ip -n "$B" link set "$VB" up

# The job's TLS, for certificates that name both ends' addresses.
CERTS=$(mktemp -d)
trap 'cleanup; rm -rf "$CERTS"' EXIT
bash tools/make_certs.sh "$CERTS" "node:IP:$ADDR_A,IP:$ADDR_B" >/dev/null
TLS_ENV=(BATON_TLS_CA="$CERTS/ca.pem" BATON_TLS_CERT="$CERTS/node.pem" BATON_TLS_KEY="$CERTS/node.key")

run() {  # LINK-LABEL; each round: gRPC alone, with the bulk channel, and
         # with the bulk channel under mutual TLS
  for _ in $(seq "$ROUNDS"); do
    for mode in grpc bulk tls; do
      local bulk=1 tls=false extra=()
      [ "$mode" = grpc ] && bulk=0
      [ "$mode" = tls ] && tls=true && extra=("${TLS_ENV[@]}")
      ip netns exec "$A" env "${extra[@]}" MASTER_ADDR="$ADDR_A" MASTER_PORT=$((20000 + RANDOM % 20000)) \
        BATON_SHM=0 BATON_TRANSPORT=grpc BATON_NET_BULK=$bulk BATON_JOB_TOKEN="bench-$$" \
        BATON_BENCH_PEER_NETNS="$B" BATON_BENCH_PEER_ADDR="$ADDR_B" "$BENCH" $QUICK |
        grep '^{' | grep -v '"shm' | sed "s/^{/{\"link\": \"$1\", \"bulk\": $bulk, \"tls\": $tls, /"
    done
  done
}
run veth
# A link that is not loopback's speed: tbf on both ends.
for pair in "$A $VA" "$B $VB"; do
  set -- $pair
  ip netns exec "$1" tc qdisc add dev "$2" root tbf rate "$RATE" burst 4mb latency 50ms
done
run "veth+tbf $RATE"
