#!/usr/bin/env bash
# Makes a job's TLS files with openssl: a CA, and one certificate + key per
# name, signed by that CA, usable as server and client (mutual TLS).
#   tools/make_certs.sh DIR NAME[:SAN,...] ...
# e.g. tools/make_certs.sh certs node0:IP:10.0.0.1 node1:IP:10.0.0.2
# writes DIR/ca.pem (give it to every node; keep DIR/ca.key offline) and
# DIR/NAME.pem + DIR/NAME.key (mode 600) per node. Without SANs a
# certificate carries IP:127.0.0.1 and DNS:localhost (tests). Tests use it
# with a temporary DIR; a real job would use its own PKI.
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 DIR NAME[:SAN,...] ..." >&2; exit 2; }
dir="$1"; shift
mkdir -p "$dir"
umask 077
if [ ! -f "$dir/ca.pem" ]; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout "$dir/ca.key" -out "$dir/ca.pem" -days 30 -subj "/CN=baton job CA" 2>/dev/null
fi
for spec in "$@"; do
  name="${spec%%:*}"
  san="DNS:localhost,IP:127.0.0.1"
  [ "$spec" != "$name" ] && san="${spec#*:}"
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout "$dir/$name.key" -out "$dir/$name.csr" -subj "/CN=$name" 2>/dev/null
  printf 'subjectAltName=%s\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth,clientAuth\n' \
    "$san" > "$dir/$name.ext"
  openssl x509 -req -in "$dir/$name.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" \
    -CAcreateserial -out "$dir/$name.pem" -days 30 -extfile "$dir/$name.ext" 2>/dev/null
  rm -f "$dir/$name.csr" "$dir/$name.ext"
done
chmod 644 "$dir/ca.pem" "$dir"/*.pem
