#!/usr/bin/env bash
# Faults on the wire (issue 15, point 7; docs/reliability.md "Faults on the wire"): the
# project's fault proxy (tools/faultproxy.py) between worker 1 and server 0 of a PS job of
# separate processes (2 workers, 2 servers, loopback, --peer-timeout 3s). Worker 1 is given
# the proxy's address for server 0 (--connect), worker 0 the server's own. Every case ends
# within its stated bound, either with exact sums (masked) or with every process exiting
# and the two ends of the faulty connection naming each other; never a hang, never a wrong
# sum. Without checksums (--no-checksum) the corrupted bytes pass TCP (the proxy sends them
# under a fresh, valid TCP checksum) and only the exact-sum check of the synthetic
# gradients catches them: real gradients would be summed wrong.
set -u
qs=${QS_BIN:?set QS_BIN to the quicksilver binary}
here=$(cd "$(dirname "$0")" && pwd)
proxy_py="$here/../tools/faultproxy.py"
# The proxy needs only the standard library: the interpreter of scripts/python.sh --no-torch.
python=$(QS_BUILD_DIR=${QS_BUILD_DIR:-$(dirname "$qs")} bash "$here/../scripts/python.sh" --no-torch) || exit 1
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2> /dev/null; done; rm -rf "$tmp"; }
trap cleanup EXIT
pass=0; fail=0
ok() { pass=$((pass+1)); }
bad() { echo "FAIL: $*"; fail=$((fail+1)); }

# 6 layers, 2.6 MB of gradients (1.3 MB per server), ~20 ms of compute per iteration.
cp "$(dirname "$0")/data/small.json" "$tmp/small.json"
head -c 32 /dev/urandom > "$tmp/secret"

wait_line() {  # file, pattern: up to 10 s
  for _ in $(seq 200); do grep -q "$2" "$1" 2> /dev/null && return 0; sleep 0.05; done
  return 1
}

# start_case NAME ITERATIONS [JOB FLAGS...] -- [PROXY FLAGS...]: starts servers, the proxy and the
# workers; leaves pids in s0 s1 px w0 w1 and outputs in $tmp/NAME.{s0,s1,w0,w1,px}.
start_case() {
  local name=$1 iters=$2; shift 2
  local extra=()
  while [ "$1" != "--" ]; do extra+=("$1"); shift; done
  shift
  job=(--model "$tmp/small.json" --policy mercury --workers 2 --servers 2 --iterations "$iters" --packet-size 16KiB
       --peer-timeout 3s --connect-timeout 10s --secret-file "$tmp/secret" "${extra[@]}")
  out=$tmp/$name
  "$qs" server --server-id 0 --listen 127.0.0.1:0 "${job[@]}" > "$out.s0" 2> "$out.s0err" & s0=$!
  "$qs" server --server-id 1 --listen 127.0.0.1:0 "${job[@]}" > "$out.s1" 2> "$out.s1err" & s1=$!
  pids+=($s0 $s1)
  wait_line "$out.s0" listening && wait_line "$out.s1" listening || { bad "$name: servers did not start"; return 1; }
  a0=$(awk '/listening/{print $2}' "$out.s0"); a1=$(awk '/listening/{print $2}' "$out.s1")
  "$python" "$proxy_py" --listen 127.0.0.1:0 --target "$a0" "$@" > "$out.px" 2> "$out.pxerr" & px=$!
  pids+=($px)
  wait_line "$out.px" listening || { bad "$name: the proxy did not start: $(cat "$out.pxerr")"; return 1; }
  ap=$(awk '/listening/{print $2}' "$out.px")
  "$qs" worker --worker-id 0 --connect "$a0,$a1" "${job[@]}" --json > "$out.w0" 2> "$out.w0err" & w0=$!
  "$qs" worker --worker-id 1 --connect "$ap,$a1" "${job[@]}" --json > "$out.w1" 2> "$out.w1err" & w1=$!
  pids+=($w0 $w1)
  started=$(date +%s.%N)
}

# Waits for the four processes up to BOUND seconds after the proxy's fault (or after the
# start, for cases without one); kills what is left. Sets rc_s0.., hung, and took: from the
# fault to the last exit, give or take the 50 ms of this loop's polling.
finish_case() {
  local bound=$1 from=$started
  if [ "${2:-}" = fault ]; then  # from the proxy's own time stamp of the fault (wall clock)
    wait_line "$out.pxerr" "fault:" && from=$(sed -n 's/^faultproxy \([0-9.]*\): fault:.*/\1/p' "$out.pxerr" | head -1)
  fi
  local until_=$(echo "$from + $bound" | bc)
  hung=""
  for who in ${case_procs:-s0 s1 w0 w1}; do  # the all-reduce cases: w0 w1 co
    local p=${!who}
    while kill -0 "$p" 2> /dev/null && [ "$(echo "$(date +%s.%N) < $until_" | bc)" -eq 1 ]; do sleep 0.05; done
    if kill -0 "$p" 2> /dev/null; then hung="$hung $who"; kill -9 "$p" 2> /dev/null; fi
    wait "$p" 2> /dev/null; eval "rc_$who=$?"
  done
  took=$(echo "$(date +%s.%N) - $from" | bc | sed 's/^\./0./')
  kill "$px" 2> /dev/null; wait "$px" 2> /dev/null
}

all_err() { cat "$out.s0err" "$out.s1err" "$out.w0err" "$out.w1err"; }
no_wrong_sum() { ! all_err | grep -q "wrong sum"; }

# 1. Delay: 20 ms each way on one connection: exact sums, a slower run.
start_case delay 10 -- --delay 20 && {
  finish_case 60
  if [ -z "$hung" ] && [ $rc_w0$rc_w1$rc_s0$rc_s1 = 0000 ] && grep -q '"iterations_verified":10' "$out.w0" \
     && grep -q '"iterations_verified":10' "$out.w1"; then ok
  else bad "delay: rc $rc_w0/$rc_w1/$rc_s0/$rc_s1 hung [$hung]: $(all_err | tail -4)"; fi
}

# 2. A stall shorter than the peer timeout (1 s < 3 s) is masked: exact sums.
start_case short-stall 30 -- --fault stall --after 3000000 --stall-for 1 && {
  finish_case 60
  if [ -z "$hung" ] && [ $rc_w0$rc_w1$rc_s0$rc_s1 = 0000 ] && grep -q "fault: stall" "$out.pxerr" \
     && grep -q '"iterations_verified":30' "$out.w0" && grep -q '"iterations_verified":30' "$out.w1"; then ok
  else bad "short stall: rc $rc_w0/$rc_w1/$rc_s0/$rc_s1 hung [$hung]: $(all_err | tail -4) $(tail -2 "$out.pxerr")"; fi
}

# 3. A stall past the peer timeout: an end of the stalled connection notices within
#    1.25 x 3 s and names the other; every process ends at once after, its message carrying
#    that finding (which end's watchdog fires first, and so which node the others hear it
#    from, is a race). Bound: 6 s.
start_case long-stall 100000 -- --fault stall --after 3000000 --stall-for 60 && {
  finish_case 6 fault
  root="lost worker 1 (last iteration [0-9]*): nothing received for more than 3s"
  root="$root\|lost server 0 (127.0.0.1:[0-9]*) in iteration [0-9]*: nothing received for more than 3s"
  named=0
  for who in s0 s1 w0 w1; do grep -q "$root" "$out.${who}err" && named=$((named + 1)); done
  if [ -z "$hung" ] && [ $rc_s0 -ne 0 ] && [ $rc_s1 -ne 0 ] && [ $rc_w0 -ne 0 ] && [ $rc_w1 -ne 0 ] && [ $named -eq 4 ]; then
    ok; echo "long stall: every process ended ${took}s after the stall began: $(grep -o "$root" "$out.s0err" | head -1)"
  else bad "long stall: rc $rc_w0/$rc_w1/$rc_s0/$rc_s1 after ${took}s hung [$hung], $named of 4 name the stalled connection: $(all_err)"; fi
}

# 4. A cut connection: every process ends at once, an end of the cut connection naming
#    the other (the other end may first hear of a victim's death: server 0 has named
#    worker 0, whose connection broke as worker 0 left after server 1 lost worker 1).
#    Bound: 2 s.
start_case cut 100000 -- --fault cut --after 3000000 && {
  finish_case 2 fault
  if [ -z "$hung" ] && [ $rc_s0 -ne 0 ] && [ $rc_s1 -ne 0 ] && [ $rc_w0 -ne 0 ] && [ $rc_w1 -ne 0 ] \
     && { grep -q "lost worker 1" "$out.s0err" || grep -q "lost server 0" "$out.w1err"; }; then
    ok; echo "cut: every process ended ${took}s after the cut"
  else bad "cut: rc $rc_w0/$rc_w1/$rc_s0/$rc_s1 after ${took}s hung [$hung]: $(all_err)"; fi
}

# 5. One bit flipped in the pushes (up) and one in the pulls (down): the receiver's
#    checksum catches it, naming the sender; nothing is summed wrong. Bound: 2 s.
for dir in up down; do
  if [ $dir = up ]; then catcher=s0; named="worker 1"; else catcher=w1; named="server 0"; fi
  start_case corrupt-$dir 100000 -- --fault corrupt --direction $dir --after 3000000 && {
    finish_case 2 fault
    err=$(cat "$out.${catcher}err")
    if [ -z "$hung" ] && [ $rc_s0 -ne 0 ] && [ $rc_s1 -ne 0 ] && [ $rc_w0 -ne 0 ] && [ $rc_w1 -ne 0 ] && no_wrong_sum \
       && echo "$err" | grep -q "frame from $named" \
       && echo "$err" | grep -Eq "corrupted payload|field 'checksum'"; then
      ok; echo "corrupt $dir: caught in ${took}s: $(echo "$err" | grep -o "corrupted payload.*\|field .checksum..*" | head -1 | cut -c1-230)"
    else bad "corrupt $dir: rc $rc_w0/$rc_w1/$rc_s0/$rc_s1 after ${took}s hung [$hung]: $(all_err)"; fi
  }
done

# 6. The same flipped bit without payload checksums: it passes TCP's checksum (the proxy's
#    kernel computed a fresh one) and reaches the sums; here only the exact-sum check of
#    the synthetic gradients catches it (or the header's own checksum, if it hit a header).
start_case no-checksum 100000 --no-checksum -- --fault corrupt --direction down --after 3000000 && {
  finish_case 5 fault
  if [ -z "$hung" ] && [ $rc_w1 -ne 0 ] && grep -Eq "wrong sum|field 'checksum'" "$out.w1err"; then
    ok; echo "no checksum: $(grep -o "wrong sum.*\|field 'checksum'.*" "$out.w1err" | head -1 | cut -c1-120)"
  else bad "no checksum: rc $rc_w0/$rc_w1/$rc_s0/$rc_s1 after ${took}s hung [$hung]: $(all_err)"; fi
}

# 7. Nodes that disagree on --no-checksum are refused at the hello, naming the setting.
job=(--model "$tmp/small.json" --policy mercury --workers 1 --servers 1 --iterations 3 --peer-timeout 3s
     --connect-timeout 5s --secret-file "$tmp/secret")
"$qs" server --server-id 0 --listen 127.0.0.1:0 "${job[@]}" > "$tmp/m.s0" 2> "$tmp/m.s0err" & s0=$!
pids+=($s0)
wait_line "$tmp/m.s0" listening
"$qs" worker --worker-id 0 --connect "$(awk '/listening/{print $2}' "$tmp/m.s0")" "${job[@]}" --no-checksum \
  > /dev/null 2> "$tmp/m.w0err"; rc=$?
wait $s0 2> /dev/null
[ $rc -ne 0 ] && grep -q -- "--no-checksum" "$tmp/m.w0err" "$tmp/m.s0err" && ok \
  || bad "mixed checksums: rc $rc: $(cat "$tmp/m.w0err" "$tmp/m.s0err")"

# 8. The all-reduce path (gloo; issue 15, point 7): the proxy between worker 1 and worker
#    0's link-0 gloo pair (worker 1 is told to reach it through the proxy: --gloo-via; the
#    proxy learns the pair's address from worker 0's log line), one bit flipped in the
#    gradients worker 1 sends, 60 MB in (past the start-up calibration, in training).
#    With --no-verify nothing checks the sums' content, as with real gradients: worker 0's
#    checksum catches it, naming worker 1; every process ends. Bound: 2 s. Then the same
#    flip with --no-checksum: summed, and by both workers alike (the flipped partial sum
#    travels on in the all-gather), caught only by the synthetic gradients' exact check.
ar_case() {  # name, extra worker flags...
  local name=$1; shift
  out=$tmp/$name
  "$qs" coordinator --architecture allreduce --workers 2 --listen 127.0.0.1:0 --timeout 60s --secret-file "$tmp/secret" \
    > "$out.co" 2>&1 & co=$!
  pids+=($co)
  wait_line "$out.co" listening || { bad "$name: no coordinator: $(cat "$out.co")"; return 1; }
  "$python" "$proxy_py" --listen 127.0.0.2:0 --target-file "$out.target" --fault corrupt --direction up \
    --after 60000000 > "$out.px" 2> "$out.pxerr" & px=$!
  pids+=($px)
  wait_line "$out.px" listening || { bad "$name: the proxy did not start: $(cat "$out.pxerr")"; return 1; }
  local role=(worker --architecture allreduce --model "$tmp/small.json" --policy wfbp --workers 2 --iterations 100000
              --peer-timeout 3s --connect-timeout 10s --secret-file "$tmp/secret"
              --coordinator "$(sed -n 's/^listening //p' "$out.co")" "$@")
  # gloo lets the greater address connect: worker 1 (127.0.0.3) connects to the proxy
  # (127.0.0.2), which connects to worker 0 (127.0.0.1).
  "$qs" "${role[@]}" --worker-id 1 --link 127.0.0.3 --gloo-via "0=$(awk '/listening/{print $2}' "$out.px")" \
    > "$out.w1" 2> "$out.w1err" & w1=$!
  "$qs" "${role[@]}" --worker-id 0 --link 127.0.0.1 > "$out.w0" 2> "$out.w0err" & w0=$!
  pids+=($w0 $w1)
  wait_line "$out.w0err" "link0 pairs listen" || { bad "$name: worker 0 published no address: $(cat "$out.w0err")"; return 1; }
  sed -n 's/.*link0 pairs listen at \[\([0-9.]*\)\]:\([0-9]*\) (worker 1).*/\1:\2/p' "$out.w0err" > "$out.target.new"
  mv "$out.target.new" "$out.target"
  started=$(date +%s.%N)
}
if "$qs" worker --architecture allreduce --help 2> /dev/null | grep -q -- --link \
   && ! "$qs" run --architecture allreduce --model "$tmp/small.json" --policy wfbp --workers 1 --iterations 1 2>&1 \
        | grep -q "without gloo"; then
  ar_case ar-corrupt --no-verify && {
    case_procs="w0 w1 co" finish_case 2 fault
    err=$(cat "$out.w0err")
    if [ -z "$hung" ] && [ $rc_w0 -ne 0 ] && [ $rc_w1 -ne 0 ] && grep -q "fault: corrupt" "$out.pxerr" \
       && echo "$err" | grep -q "corrupted data from worker 1: a [a-z-]* message of [0-9]* bytes failed its CRC32C check" \
       && ! echo "$err" | grep -q "calibrating"; then
      ok; echo "all-reduce corrupt: caught in ${took}s: $(echo "$err" | grep -o "all-reduce of.*" | head -1 | cut -c1-230)"
    else bad "all-reduce corrupt: rc $rc_w0/$rc_w1 after ${took}s hung [$hung]: $(cat "$out.w0err" "$out.w1err" "$out.pxerr")"; fi
  }
  ar_case ar-no-checksum --no-checksum && {
    case_procs="w0 w1 co" finish_case 5 fault
    # Both workers check the sum; the one that finds it first exits, and the other may then
    # see its peer gone before its own check (seen under ASan): it must then name that loss.
    named() { grep -q "wrong sum" "$1" || grep -q "lost worker $2" "$1"; }
    if [ -z "$hung" ] && [ $rc_w0 -ne 0 ] && [ $rc_w1 -ne 0 ] \
       && grep -q "wrong sum" "$out.w0err" "$out.w1err" && named "$out.w0err" 1 && named "$out.w1err" 0 \
       && ! grep -q CRC32C "$out.w0err" "$out.w1err"; then
      ok; echo "all-reduce, no checksum: $(grep -ho "wrong sum.*" "$out.w0err" "$out.w1err" | head -1 | cut -c1-120)"
    else bad "all-reduce no checksum: rc $rc_w0/$rc_w1 after ${took}s hung [$hung]: $(cat "$out.w0err" "$out.w1err")"; fi
  }
else
  echo "all-reduce cases skipped: built without gloo"
fi

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
