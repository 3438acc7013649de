#!/usr/bin/env bash
# Formats Leash's C++ and CUDA sources with clang-format and the repository's .clang-format.
#   bash scripts/format.sh           formats every source in place
#   bash scripts/format.sh --check   changes nothing; lists the files that differ, exits 1 if any
# Covers the *.h, *.cc, *.cu and *.cuh files git tracks or would track (new files not yet
# added included; what .gitignore leaves out excluded), so generated code (the FlatBuffers
# headers are written into build/) and build folders are never touched.
# CLANG_FORMAT picks the binary (default: clang-format; scripts/install-deps.sh format).
set -euo pipefail
cd "$(dirname "$0")/.."
CLANG_FORMAT=${CLANG_FORMAT:-clang-format}
check=0
case "${1:-}" in
  --check) check=1 ;;
  "") ;;
  *) echo "usage: scripts/format.sh [--check]" >&2; exit 2 ;;
esac
command -v "$CLANG_FORMAT" >/dev/null || {
  echo "leash: $CLANG_FORMAT not found; install it with: bash scripts/install-deps.sh format" >&2
  exit 2
}

mapfile -t files < <(git ls-files --cached --others --exclude-standard -- '*.h' '*.cc' '*.cu' '*.cuh' |
  grep -v '_generated\.h$')
if ((${#files[@]} == 0)); then
  echo "leash: no C++ or CUDA sources found" >&2
  exit 2
fi

if ((check == 0)); then
  "$CLANG_FORMAT" -i --style=file "${files[@]}"
  echo "leash: formatted ${#files[@]} files with $("$CLANG_FORMAT" --version)"
  exit 0
fi

differ=()
for f in "${files[@]}"; do
  if ! "$CLANG_FORMAT" --style=file --dry-run -Werror "$f" >/dev/null 2>&1; then differ+=("$f"); fi
done
if ((${#differ[@]} > 0)); then
  printf '%s\n' "${differ[@]}"
  echo "leash: ${#differ[@]} of ${#files[@]} files are not formatted; run: bash scripts/format.sh" >&2
  exit 1
fi
echo "leash: all ${#files[@]} C++ and CUDA sources are formatted"
