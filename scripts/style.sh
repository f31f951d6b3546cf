#!/usr/bin/env bash
# The style gates (CI runs them in scripts/test.sh's "style" stage):
#   1. clang-format: every tracked C++ file as .clang-format writes it
#      (fix: clang-format -i FILE ...);
#   2. clang-tidy: the checks below clean on every file of src/ (the build's
#      compile_commands.json, one entry per file: tools/compile_db.py; needs build/ from
#      scripts/build.sh). Each file is parsed on its own, so this also checks that every
#      file of src/ compiles alone, which the unity builds do not;
#   3. tools/thread_safety.py: the files that use core/mutex.h's lock annotations compiled
#      with clang's -Wthread-safety as errors (guarded state touched without its lock);
#   4. tools/spans.py: no type over 400 lines, no function over 120, except those listed
#      with their reason in tools/spans_allowed.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
status=0
mapfile -t files < <(git ls-files '*.cc' '*.h' '*.cu')
echo "style: clang-format on ${#files[@]} files"
if ! clang-format --dry-run --Werror "${files[@]}" 2> build/clang-format.log; then
  grep -E '^[^ ].*(warning|error):' build/clang-format.log | cut -d: -f1 | sort -u | head -20
  echo "style: the files above are not formatted: clang-format -i FILE"
  status=1
fi
# The chosen clang-tidy checks: bugs we have had or would not see in review, and the
# modernisations the code already follows everywhere.
checks='-*,bugprone-use-after-move,bugprone-dangling-handle,bugprone-unused-return-value'
checks+=',bugprone-undefined-memory-manipulation,misc-unused-using-decls'
checks+=',modernize-use-override,modernize-use-nullptr,performance-unnecessary-copy-initialization'
mapfile -t sources < <(git ls-files 'src/*.cc' | grep -v '^src/torch/python_module.cc$')
python3 tools/compile_db.py build build/per-file > /dev/null
echo "style: clang-tidy ($checks) on ${#sources[@]} files"
printf '%s\n' "${sources[@]}" |
  xargs -P "$(nproc)" -n 4 clang-tidy -p build/per-file --quiet --checks="$checks" --warnings-as-errors='*' \
    > build/clang-tidy.log 2>&1 || true
if grep -qE '(warning|error): ' build/clang-tidy.log; then
  grep -E -A3 '(warning|error): ' build/clang-tidy.log | head -40
  echo "style: clang-tidy found the above"
  status=1
fi
python3 tools/thread_safety.py build/per-file || status=1
python3 tools/spans.py || status=1
if [ "$status" = 0 ]; then echo "style: clean"; fi
exit "$status"
