#!/usr/bin/env bash
# Builds baton's libFuzzer targets (fuzz/*_fuzzer.cc, see fuzz/README.md) with
# Debian's clang, AddressSanitizer and UndefinedBehaviorSanitizer, and runs
# each for FUZZ_SECONDS on a copy of its seed corpus (fuzz/corpus/<target>/;
# the repository's corpus is never written). Fails naming every target that
# crashed, with the crashing input's path and the sanitizer's report. Part of
# .ci/run.
#   tools/fuzz.sh [TARGET ...]               build and run (default: every target)
#   tools/fuzz.sh --build-only [TARGET ...]  build only
#   tools/fuzz.sh --seeds                    rewrite the seed files (fuzz/make_seeds.cc)
# Environment: FUZZ_SECONDS (30), FUZZ_JOBS (parallel compiles and runs;
# default: the number of cores), FUZZ_BUILD (build and run folder, .fuzz-build).
#
# Sources are compiled directly, not through Bazel: each target gets only the
# library sources it needs (SOURCES below), compiled once into
# $FUZZ_BUILD/obj and recompiled when they or a header they include change.
set -euo pipefail
cd "$(dirname "$0")/.."

ALL_TARGETS=(wire codec shm bulk store rref dist_autograd)
FUZZ_SECONDS=${FUZZ_SECONDS:-30}
FUZZ_JOBS=${FUZZ_JOBS:-$(nproc)}
FUZZ_BUILD=${FUZZ_BUILD:-.fuzz-build}

# The library sources each target needs besides fuzz/<target>_fuzzer.cc:
# "proto:F" is the generated bazel-bin/proto/F; "@base", "@store" and "@rpc"
# are the libraries //base, //store (etcd's included) and //rpc (with obs/)
# with what they depend on
# (RRefs and distributed autograd call into the agent). A target links its
# sources as an archive, so only what it uses ends up in the binary.
declare -A SOURCES=(
  [wire]="@base rpc/internal/wire.cc proto:rpc.pb.cc"
  [codec]="@base rpc/codec.cc rpc/function.cc rpc/runtime.cc"
  [shm]="@base rpc/channel/shm/shm_channel.cc rpc/internal/wire.cc proto:rpc.pb.cc"
  [bulk]="@base rpc/channel/tcp/bulk_channel.cc rpc/channel/tcp/bulk_channel_send.cc rpc/channel/tcp/bulk_channel_receive.cc rpc/channel/tcp/socket_io.cc rpc/channel/tcp/connection.cc proto:rpc.pb.cc"
  [store]="@store"
  [rref]="@rpc rref/rref_context.cc rref/rref_service.cc proto:rref.pb.cc"
  [dist_autograd]="@rpc dist_autograd/container.cc dist_autograd/engine.cc
                   proto:dist_autograd.pb.cc"
)
# Longest input each target is given (-max_len).
declare -A MAX_LEN=([wire]=4096 [codec]=4096 [shm]=512 [bulk]=4096 [store]=2048 [rref]=1024
                    [dist_autograd]=2048)

die() { echo "fuzz.sh: $*" >&2; exit 1; }

mode=run
case "${1:-}" in
  --build-only) mode=build; shift ;;
  --seeds) mode=seeds; shift ;;
esac
if [ $# -gt 0 ]; then
  TARGETS=("$@")
  for t in "${TARGETS[@]}"; do
    [ -n "${SOURCES[$t]+x}" ] || die "unknown target '$t' (targets: ${ALL_TARGETS[*]})"
  done
else
  TARGETS=("${ALL_TARGETS[@]}")
fi
[ "$mode" = seeds ] && TARGETS=("${ALL_TARGETS[@]}")

command -v clang++ >/dev/null || die "clang++ not found (bash tools/install_deps.sh)"
start=$(date +%s)

# Generated protobuf headers and sources: those of the last Bazel build when
# they are newer than every .proto, else built now. Named through the
# workspace's bazel-bin link, so that every path in a compile command is
# relative to the checkout (ccache, below).
fresh_protos() {
  local p g
  for p in proto/*.proto; do
    g="bazel-bin/proto/$(basename "$p" .proto).pb.h"
    [ -f "$g" ] && [ "$g" -nt "$p" ] || return 1
  done
}
if ! fresh_protos; then
  bazel build //proto:all >/dev/null 2>&1 || bazel build //proto:all
fi
GEN=bazel-bin

# ccache keeps the objects between checkouts (CI builds in a fresh clone,
# where $FUZZ_BUILD starts empty): the cache tools/cmake_ci.sh uses, found
# by content, paths relative to the checkout.
FUZZ_CXX=clang++
if command -v ccache >/dev/null; then
  export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/baton/ccache}" CCACHE_BASEDIR="$PWD"
  export CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-6G}" CCACHE_NOHASHDIR=1
  FUZZ_CXX="ccache clang++"
fi

SANITIZE="-fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined"
CXXFLAGS="-std=c++17 -g -O1 $SANITIZE -I. -I$GEN -isystem /usr/include/torch/csrc/api/include
          -DBATON_HAVE_GLOO -Wno-unused-command-line-argument"
# The Abseil libraries Bazel links (third_party/system.BUILD), and the rest.
ABSL_LIBS=$(grep -o '"-labsl_[a-z0-9_]*"' third_party/system.BUILD | tr -d '"' | tr '\n' ' ')
LIBS="-Wl,--as-needed -ltorch -ltorch_cpu -lc10 -lgrpc++ -lgrpc -lgpr -laddress_sorting -lssl -lcrypto
      -lprotobuf $ABSL_LIBS -lrt -lpthread"

OBJ="$FUZZ_BUILD/obj"
BIN="$FUZZ_BUILD/bin"
mkdir -p "$OBJ" "$BIN"
# Objects built with other flags are rebuilt.
if [ "$(cat "$FUZZ_BUILD/flags" 2>/dev/null)" != "$CXXFLAGS" ]; then
  rm -f "$OBJ"/*.o "$OBJ"/*.d
  echo "$CXXFLAGS" >"$FUZZ_BUILD/flags"
fi

# Expands a source list: the groups, then a target's whole SOURCES.
expand() {
  local s f
  for s in "$@"; do
    case "$s" in
      @base) ls base/*.cc ;;
      @store)
        expand @base
        for f in store/*.cc; do [ "$f" = store/store_main.cc ] || echo "$f"; done
        printf '%s\n' proto:store.pb.cc proto:store.grpc.pb.cc proto:etcd.pb.cc \
          proto:etcd.grpc.pb.cc ;;
      @rpc)
        expand @store
        for f in rpc/*.cc rpc/internal/*.cc rpc/transport/*/*.cc rpc/channel/*/*.cc env/*.cc \
          obs/*.cc; do
          case "$f" in rpc/default_agent.cc | obs/trace_main.cc) ;; *) echo "$f" ;; esac
        done
        printf '%s\n' proto:rpc.pb.cc proto:state.pb.cc proto:trace.pb.cc ;;
      *) echo "$s" ;;
    esac
  done
}
# shellcheck disable=SC2086
sources_of() { expand ${SOURCES[$1]} | sort -u; }
path_of() { case "$1" in proto:*) echo "$GEN/proto/${1#proto:}" ;; *) echo "$1" ;; esac; }
obj_of() { echo "$OBJ/$(echo "$1" | tr '/:' '__').o"; }

# Compiles $1 into $2 unless $2 is newer than the source and every header
# it included last time.
compile() {
  local src=$1 obj=$2 dep
  if [ -f "$obj" ] && [ -f "$obj.d" ]; then
    local stale=0
    for dep in $(sed -e 's/\\$//' -e 's/^[^:]*://' "$obj.d"); do
      if [ ! -e "$dep" ] || [ "$dep" -nt "$obj" ]; then stale=1; break; fi
    done
    [ $stale = 0 ] && return 0
  fi
  echo "  compile $src" >&2
  # shellcheck disable=SC2086
  $FUZZ_CXX $CXXFLAGS -MMD -MF "$obj.d" -c "$src" -o "$obj.tmp" && mv "$obj.tmp" "$obj"
}
export -f compile
export CXXFLAGS FUZZ_CXX

# Every object the requested targets need, compiled FUZZ_JOBS at a time.
declare -A NEEDED=()
for t in "${TARGETS[@]}"; do
  for s in $(sources_of "$t") "fuzz/${t}_fuzzer.cc"; do NEEDED[$s]=1; done
done
[ "$mode" = seeds ] && NEEDED[fuzz/make_seeds.cc]=1
echo "fuzz.sh: building ${TARGETS[*]} (${#NEEDED[@]} sources, $FUZZ_JOBS at a time)" >&2
for s in "${!NEEDED[@]}"; do
  printf '%s %s\n' "$(path_of "$s")" "$(obj_of "$s")"
done | xargs -P "$FUZZ_JOBS" -n 2 bash -c 'compile "$0" "$1"' ||
  die "compilation failed (above)"

# Links MAIN's object with the archive of the other sources.
link() {  # OUTPUT SANITIZERS MAIN SOURCES...
  local out=$1 flags=$2 main=$3 objs=() s
  shift 3
  for s in "$@"; do objs+=("$(obj_of "$s")"); done
  if [ -f "$out" ] && [ -z "$(find "$(obj_of "$main")" "${objs[@]}" -newer "$out" | head -n 1)" ] &&
      [ "$(cat "$out.sources" 2>/dev/null)" = "$*" ]; then
    return 0  # up to date, built from the same sources
  fi
  echo "  link $out" >&2
  rm -f "$out.a"
  ar rcs "$out.a" "${objs[@]}"
  # shellcheck disable=SC2086
  clang++ $flags "$(obj_of "$main")" "$out.a" -o "$out" $LIBS || die "linking $out failed (above)"
  echo "$*" >"$out.sources"
}
for t in "${TARGETS[@]}"; do
  mapfile -t srcs < <(sources_of "$t")
  link "$BIN/${t}_fuzzer" "$SANITIZE" "fuzz/${t}_fuzzer.cc" "${srcs[@]}"
done
build_done=$(date +%s)
echo "fuzz.sh: built in $((build_done - start)) s" >&2

if [ "$mode" = build ]; then exit 0; fi

if [ "$mode" = seeds ]; then
  # The generator needs what every target needs.
  mapfile -t srcs < <(for t in "${ALL_TARGETS[@]}"; do sources_of "$t"; done | sort -u)
  link "$BIN/make_seeds" "-fsanitize=fuzzer-no-link,address,undefined" fuzz/make_seeds.cc \
    "${srcs[@]}"
  "$BIN/make_seeds" fuzz/corpus
  exit 0
fi

# Runs one target on a copy of its corpus; the verdict goes to $dir/result.
run_one() {
  local t=$1 dir="$FUZZ_BUILD/run/$1"
  rm -rf "$dir"
  mkdir -p "$dir/corpus" "$dir/artifacts"
  if [ -d "fuzz/corpus/$t" ]; then cp "fuzz/corpus/$t"/* "$dir/corpus/" 2>/dev/null || true; fi
  if timeout $((FUZZ_SECONDS + 300)) "$BIN/${t}_fuzzer" -max_total_time="$FUZZ_SECONDS" \
      -max_len="${MAX_LEN[$t]}" -rss_limit_mb=4096 -timeout=25 -print_final_stats=1 \
      -artifact_prefix="$dir/artifacts/" "$dir/corpus" >"$dir/log" 2>&1; then
    echo ok >"$dir/result"
  else
    echo fail >"$dir/result"
  fi
}
export ASAN_OPTIONS="${ASAN_OPTIONS:-allocator_may_return_null=0}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1}"
for t in "${TARGETS[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$FUZZ_JOBS" ]; do wait -n || true; done
  echo "fuzz.sh: running $t for ${FUZZ_SECONDS} s" >&2
  run_one "$t" &
done
wait

ERROR_LINE='==[0-9]+== ?ERROR|runtime error:|fuzz invariant violated|terminate called'
failed=()
for t in "${TARGETS[@]}"; do
  dir="$FUZZ_BUILD/run/$t"
  runs=$(grep -o 'number_of_executed_units: [0-9]*' "$dir/log" | grep -o '[0-9]*$' || echo "?")
  if [ "$(cat "$dir/result")" = ok ]; then
    echo "fuzz.sh: $t: ok, $runs inputs" >&2
    continue
  fi
  failed+=("$t")
  echo "fuzz.sh: $t: FAILED; its log is $dir/log" >&2
  for a in "$dir"/artifacts/*; do
    [ -e "$a" ] && echo "fuzz.sh: $t: crashing input $a" >&2
  done
  # The sanitizer's (or the invariant's) report: the log from the first
  # error on, or its end if there is none.
  if grep -qE "$ERROR_LINE" "$dir/log"; then
    awk -v re="$ERROR_LINE" '$0 ~ re {p = 1} p' "$dir/log" | head -n 80 >&2
  else
    tail -n 40 "$dir/log" >&2
  fi
done
echo "fuzz.sh: $(( $(date +%s) - start )) s in all (build $((build_done - start)) s)" >&2
if [ ${#failed[@]} -gt 0 ]; then
  die "crashes in: ${failed[*]} (fix each; add its input to fuzz/corpus/<target>/, see fuzz/README.md)"
fi
echo "fuzz.sh: ${#TARGETS[@]} targets, no crashes" >&2
