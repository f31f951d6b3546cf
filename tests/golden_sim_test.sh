#!/usr/bin/env bash
# Golden outputs of `quicksilver simulate --json` (tests/golden/simulate/cases.txt): the
# simulator's figures must not move unless a change means them to.
# Usage: QS_BIN=build/quicksilver golden_sim_test.sh [--update]
set -u
qs=${QS_BIN:?set QS_BIN to the quicksilver binary}
dir=$(cd "$(dirname "$0")/golden/simulate" && pwd)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
pass=0; fail=0
while read -r name args; do
  case "$name" in ''|'#'*) continue ;; esac
  # shellcheck disable=SC2086  # the case's arguments are words
  if ! "$qs" simulate $args --json > "$tmp/$name.json" 2> "$tmp/err"; then
    echo "FAIL: $name: quicksilver simulate $args: $(cat "$tmp/err")"; fail=$((fail+1)); continue
  fi
  if [ "${1:-}" = "--update" ]; then cp "$tmp/$name.json" "$dir/$name.json"; pass=$((pass+1)); continue; fi
  if cmp -s "$tmp/$name.json" "$dir/$name.json"; then
    pass=$((pass+1))
  else
    echo "FAIL: $name: output differs from golden/simulate/$name.json:"
    diff "$dir/$name.json" "$tmp/$name.json" | head -20
    fail=$((fail+1))
  fi
done < "$dir/cases.txt"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
