# Sourced by tools/thread_safety.sh and tools/tidy.sh: remembers the files a
# clang check found clean, so that a run in a fresh clone (CI) checks again
# only what changed. A file's key is the hash of the check's name and
# version and flags, the compiler flags and the file's preprocessed text
# (everything it includes, comments kept, line markers with the paths
# relative to the checkout): preprocessing costs about a tenth of a check.
# Only clean results are kept (the check exited 0 and reported no error); a
# finding is reported every run.
#   CLANG_CACHE        where the keys are kept (BATON_CLANG_CACHE, else
#                      ~/.cache/baton/clang-checks)
#   clang_cache_key CHECK FILE FLAGS...   prints the key (CHECK: the check's
#                                         name, version and own flags)
#   clang_cache_hit KEY                   true if that key was found clean
#   clang_cache_keep KEY                  records it clean
CLANG_CACHE="${BATON_CLANG_CACHE:-$HOME/.cache/baton/clang-checks}"
mkdir -p "$CLANG_CACHE"
export CLANG_CACHE
clang_cache_key() {
  local check=$1 file=$2
  shift 2
  { echo "$check $*"; clang++ "$@" -E -CC "$file" 2>&1; } | sha256sum | cut -c1-40
}
clang_cache_hit() { [ -f "$CLANG_CACHE/$1" ]; }
clang_cache_keep() { touch "$CLANG_CACHE/$1"; }
export -f clang_cache_key clang_cache_hit clang_cache_keep
