#!/usr/bin/env bash
# What a killed `quicksilver run --netns` launcher leaves, and who removes it (issue 15,
# point 6; docs/cli.md `quicksilver cleanup`). Root and iproute2 only (skipped otherwise).
#  - A launcher killed outright (SIGKILL) leaves its namespaces qs<pid>h*, its bridge
#    qs<pid>br, its directory qs-run-<pid>-* and a changed tcp_allowed_congestion_control;
#    `quicksilver cleanup` removes them, and never touches a live run's (run A, which goes
#    on to finish with exact sums).
#  - The next --netns run removes a killed launcher's leftovers by itself.
#  - A launcher stopped by SIGTERM or SIGHUP cleans up after itself; SIGINT too (loopback);
#    and `run --script --netns` on SIGTERM.
# Other engineers may run clusters on this machine at the same time: only names carrying a
# pid of this test's launchers are looked at, and the allowed list is checked only when no
# other cluster is alive.
set -u
qs=${QS_BIN:?set QS_BIN to the quicksilver binary}
if [ "$(id -u)" -ne 0 ] || ! command -v ip > /dev/null || ! command -v tc > /dev/null; then
  echo "skipped: needs root and iproute2"; exit 0
fi
tmp=$(mktemp -d)
pids=()
trap 'for p in "${pids[@]}"; do kill -9 "$p" 2> /dev/null; done; "$qs" cleanup > /dev/null 2>&1; rm -rf "$tmp"' EXIT
pass=0; fail=0
ok() { pass=$((pass+1)); }
bad() { echo "FAIL: $*"; fail=$((fail+1)); }

cat > "$tmp/small.json" <<'JSON'
{"name": "small", "batch_size": 8, "layers": [
 {"name": "c1", "forward_ms": 1.0, "backward_ms": 2.0, "tensors": [{"name": "c1.w", "elements": 20000}]},
 {"name": "c2", "forward_ms": 1.5, "backward_ms": 3.0, "tensors": [{"name": "c2.w", "elements": 90000}]},
 {"name": "f1", "forward_ms": 0.5, "backward_ms": 1.0, "tensors": [{"name": "f1.w", "elements": 200000}]}
]}
JSON
job=(--netns --model "$tmp/small.json" --policy mercury --workers 2 --servers 1 --bandwidth 1Gbps --scale 1
     --timeout 120s)
allowed=/proc/sys/net/ipv4/tcp_allowed_congestion_control
original=$(cat /run/quicksilver-allowed-cc 2> /dev/null || cat $allowed)

namespaces_of() { ip netns list | sed -n "s/^\(qs$1h[0-9]*\).*/\1/p"; }
leftovers_of() {  # what launcher $1 has: namespaces, links, directories (one word each)
  namespaces_of "$1"
  ip -o link show | sed -n "s/^[0-9]*: \(qs$1\(br\|bs\|[vpwq][0-9]*\)\)[@:].*/\1/p"
  ls -d "${TMPDIR:-/tmp}"/qs-run-"$1"-* 2> /dev/null
}
running() {  # launcher $1 has its workers running (each `quicksilver worker --job FILE`)
  [ "$(pgrep -P "$1" -f " worker --job " | wc -l)" -ge 2 ]
}
wait_running() {
  for _ in $(seq 300); do running "$1" && return 0; kill -0 "$1" 2> /dev/null || return 1; sleep 0.1; done
  return 1
}

# A: a live run that must come through untouched.
"$qs" run "${job[@]}" --iterations 400 > "$tmp/a.out" 2> "$tmp/a.err" & a=$!
pids+=($a)
wait_running $a || bad "run A did not start: $(cat "$tmp/a.err")"

# B: killed outright while it runs.
"$qs" run "${job[@]}" --iterations 100000 > /dev/null 2> "$tmp/b.err" & b=$!
pids+=($b)
wait_running $b || bad "run B did not start: $(cat "$tmp/b.err")"
kill -9 $b; wait $b 2> /dev/null
left=$(leftovers_of $b)
if echo "$left" | grep -q "^qs${b}h0$" && echo "$left" | grep -q "^qs${b}br$" && echo "$left" | grep -q "qs-run-$b-" \
   && grep -qw cubic $allowed; then ok
else echo "note: run B's leftovers were partly gone before the check (another launcher cleaned them?): $left"; fi
"$qs" cleanup > "$tmp/cleanup.out" 2> "$tmp/cleanup.err"; rc=$?
if [ $rc -eq 0 ] && [ -z "$(leftovers_of $b)" ] && grep -q "kept cluster qs$a " "$tmp/cleanup.out" \
   && ! grep -q "qs$a" <(grep "^removed" "$tmp/cleanup.out"); then ok
else bad "cleanup: rc $rc, left [$(leftovers_of $b)]: $(cat "$tmp/cleanup.out" "$tmp/cleanup.err")"; fi
grep "^removed" "$tmp/cleanup.out" | sed 's/^/  /'
# A's cluster is whole and still running; the allowed list still has what A needs.
[ "$(namespaces_of $a | wc -l)" -eq 3 ] && kill -0 $a 2> /dev/null && running $a && grep -qw cubic $allowed && ok \
  || bad "run A was touched: namespaces [$(namespaces_of $a)], list '$(cat $allowed)'"
"$qs" cleanup --dry-run > "$tmp/dry.out"; rc=$?
[ $rc -eq 0 ] && grep -q "nothing to clean up" "$tmp/dry.out" && ok || bad "second cleanup: $(cat "$tmp/dry.out")"

# E, killed outright; F, the next --netns run, removes E's leftovers by itself.
"$qs" run "${job[@]}" --iterations 100000 > /dev/null 2> "$tmp/e.err" & e=$!
pids+=($e)
wait_running $e || bad "run E did not start: $(cat "$tmp/e.err")"
kill -9 $e; wait $e 2> /dev/null
"$qs" run "${job[@]}" --iterations 2 > /dev/null 2> "$tmp/f.err"; rc=$?
[ $rc -eq 0 ] && [ -z "$(leftovers_of $e)" ] && ok || bad "the next run left E's [$(leftovers_of $e)]: rc $rc $(cat "$tmp/f.err")"

# C and D: stopped by SIGTERM and SIGHUP while they run; each removes its own.
for sig in TERM HUP; do
  "$qs" run "${job[@]}" --iterations 100000 > /dev/null 2> "$tmp/$sig.err" & c=$!
  pids+=($c)
  wait_running $c || bad "run ($sig) did not start: $(cat "$tmp/$sig.err")"
  start=$(date +%s.%N)
  kill -$sig $c; wait $c; rc=$?
  took=$(echo "$(date +%s.%N) - $start" | bc | sed 's/^\./0./')
  [ $rc -eq 1 ] && [ -z "$(leftovers_of $c)" ] && grep -q "interrupted" "$tmp/$sig.err" && ok \
    || bad "SIG$sig: rc $rc after ${took}s, left [$(leftovers_of $c)]: $(tail -2 "$tmp/$sig.err")"
  echo "SIG$sig: the launcher removed its cluster and ended in ${took}s"
done
# SIGINT, on loopback: the directory goes with it.
"$qs" run --model "$tmp/small.json" --policy mercury --workers 2 --servers 1 --iterations 100000 > /dev/null \
  2> "$tmp/int.err" & c=$!
pids+=($c)
wait_running $c
kill -INT $c; wait $c; rc=$?
[ $rc -eq 1 ] && [ -z "$(leftovers_of $c)" ] && ok || bad "SIGINT: rc $rc, left [$(leftovers_of $c)]"

# `run --script --netns` (a program, not a Python script here): SIGTERM ends its workers
# and removes its namespaces too.
"$qs" run --netns --workers 2 --bandwidth 1Gbps --script /bin/sleep 100 > /dev/null 2> "$tmp/script.err" & c=$!
pids+=($c)
for _ in $(seq 100); do [ "$(pgrep -P $c -x sleep | wc -l)" -ge 2 ] && break; sleep 0.1; done
[ "$(namespaces_of $c | wc -l)" -eq 2 ] || bad "run --script --netns did not start: $(cat "$tmp/script.err")"
kill -TERM $c; wait $c; rc=$?
[ $rc -ne 0 ] && [ -z "$(leftovers_of $c)" ] && grep -q interrupted "$tmp/script.err" && ok \
  || bad "run --script SIGTERM: rc $rc, left [$(leftovers_of $c)]: $(cat "$tmp/script.err")"

# A finishes as if nothing happened.
wait $a; rc=$?
verified=$(grep -c "400 iterations verified exact" "$tmp/a.out")
[ $rc -eq 0 ] && [ "$verified" -eq 2 ] && [ -z "$(leftovers_of $a)" ] && ok \
  || bad "run A: rc $rc, $verified workers verified, left [$(leftovers_of $a)]: $(tail -3 "$tmp/a.err")"
# With no cluster left anywhere, the allowed list is as it was.
if [ -z "$(ip netns list | grep '^qs[0-9]*h[0-9]')" ]; then
  [ "$(cat $allowed)" = "$original" ] && [ ! -e /run/quicksilver-allowed-cc ] && ok \
    || bad "allowed congestion controls '$(cat $allowed)', was '$original'"
else
  echo "other clusters are running: the allowed list is not checked"
fi

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
