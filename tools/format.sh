#!/usr/bin/env bash
# Formats the project's C++ sources with clang-format and the repository's
# .clang-format (Google style, 100 columns).
#   bash tools/format.sh           rewrite every unformatted file in place
#   bash tools/format.sh --check   list them and exit 1 if there is any (CI)
# Files: every tracked *.cc and *.h outside third_party/.
set -euo pipefail
cd "$(dirname "$0")/.."
CLANG_FORMAT=${CLANG_FORMAT:-clang-format}
command -v "$CLANG_FORMAT" >/dev/null ||
  { echo "format.sh: $CLANG_FORMAT not found (bash tools/install_deps.sh)" >&2; exit 2; }
mode=${1:-fix}
mapfile -t files < <(git ls-files '*.cc' '*.h' | grep -v '^third_party/')
# One clang-format per core over batches of files (--dry-run names each
# unformatted file in its "code should be clang-formatted" diagnostics); a
# process per file cost 15 s of the test command.
mapfile -t bad < <(printf '%s\0' "${files[@]}" |
  xargs -0 -n 64 -P "$(nproc)" "$CLANG_FORMAT" --style=file --dry-run 2>&1 |
  sed -n 's/^\(.*\):[0-9]*:[0-9]*: \(warning\|error\): code should be clang-formatted.*/\1/p' |
  sort -u)
if [ "$mode" = --check ]; then
  if [ ${#bad[@]} -gt 0 ]; then
    echo "format.sh: ${#bad[@]} file(s) are not formatted (run bash tools/format.sh):" >&2
    printf '  %s\n' "${bad[@]}" >&2
    "$CLANG_FORMAT" --style=file "${bad[0]}" | diff -u "${bad[0]}" - | head -40 >&2 || true
    exit 1
  fi
  echo "format.sh: ${#files[@]} files formatted"
  exit 0
fi
for f in "${bad[@]}"; do "$CLANG_FORMAT" --style=file -i "$f"; done
echo "format.sh: reformatted ${#bad[@]} of ${#files[@]} files"
