#!/usr/bin/env bash
# Real multi-process runs of the all-reduce runtime (gloo): `quicksilver run --architecture
# allreduce` on loopback and in network namespaces (root only), the separate-process
# set-up of real hosts (coordinator + workers), a dead worker, and bad input. Every worker
# checks every reduced element exactly.
set -u
qs=${QS_BIN:?set QS_BIN to the quicksilver binary}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
pass=0; fail=0
ok() { pass=$((pass+1)); }
bad() { echo "FAIL: $*"; fail=$((fail+1)); }

cat > "$tmp/small.json" <<'JSON'
{"name": "small", "batch_size": 8, "layers": [
 {"name": "c1", "forward_ms": 1.0, "backward_ms": 2.0, "tensors": [{"name": "c1.w", "elements": 20000}, {"name": "c1.b", "elements": 64}]},
 {"name": "c2", "forward_ms": 1.5, "backward_ms": 3.0, "tensors": [{"name": "c2.w", "elements": 90000}]},
 {"name": "f1", "forward_ms": 0.5, "backward_ms": 1.0, "tensors": [{"name": "f1.w", "elements": 300000}, {"name": "f1.b", "elements": 500}]},
 {"name": "f2", "forward_ms": 0.2, "backward_ms": 0.4, "tensors": [{"name": "f2.w", "elements": 5000}]}
]}
JSON
head -c 32 /dev/urandom > "$tmp/secret"; chmod 600 "$tmp/secret"
common=(--architecture allreduce --model "$tmp/small.json" --iterations 4 --bandwidth 1Gbps --scale 1
        --partition-size 256KB --timeout 60s)

if ! "$qs" run "${common[@]}" --workers 1 --policy wfbp > /dev/null 2> "$tmp/err" && grep -q "without gloo" "$tmp/err"; then
  echo "skipped: built without gloo"; exit 0
fi

# Every policy but DeFT on 3 workers: one row each, every iteration verified on every worker.
policies=wfbp,synceasgd,mgwfbp,mgwfbp-opt,ddp,bytescheduler,usbyte
if "$qs" run "${common[@]}" --workers 3 --policy $policies > "$tmp/out" 2> "$tmp/err"; then
  for p in ${policies//,/ }; do
    grep -q "^$p " "$tmp/out" || bad "loopback: no row for $p"
  done
  verified=$(grep -c "4 iterations verified exact" "$tmp/out")
  [ "$verified" -eq 21 ] && ok || bad "loopback: $verified of 21 worker reports verified every iteration"
  grep -q "all-reduce fit: a = " "$tmp/out" && ok || bad "loopback: no all-reduce fit printed"
else
  bad "loopback run failed: $(tail -3 "$tmp/err")"
fi

# --policy auto (issue 30): phases from ddp, each decision logged; whatever it decides on
# this machine, the phases cover iterations 1..30 one after another, in one "auto" row, and
# the last phase's workers verified every reduced element.
if "$qs" run --architecture allreduce --model "$tmp/small.json" --bandwidth 1Gbps --scale 1 --timeout 60s \
    --workers 2 --policy auto --iterations 30 --replan-every 4 > "$tmp/out" 2> "$tmp/err"; then
  python3 - "$tmp/out" "$tmp/err" <<'PY' && ok || bad "auto: phases: $(grep 'auto, after' "$tmp/err")"
import re, sys
out, err = open(sys.argv[1]).read(), open(sys.argv[2]).read()
ends = [(int(a), int(b)) for a, b in re.findall(r"auto, after iterations (\d+)\.\.(\d+): ", err)]
phases = re.findall(r"auto: iterations (\d+)\.\.(\d+): ", out)
assert ends and ends[0][0] == 1 and ends[0][1] == 6, ends  # 2 warm-up + min(8, 4)
spans = [(int(a), int(b)) for a, b in phases]
assert spans[0][0] == 1 and spans[-1][1] == 30, spans
assert all(b + 1 == c for (_, b), (c, _) in zip(spans, spans[1:])), spans
assert re.search(r"^auto ", out, re.M) and not re.search(r"^(ddp|wfbp|mgwfbp) ", out, re.M)
assert "iterations verified exact" in out
PY
else
  bad "auto run failed: $(tail -3 "$tmp/err")"
fi

# gloo's other algorithms: exact too.
for algo in ring-chunked halving-doubling bcube; do
  if "$qs" run "${common[@]}" --workers 3 --policy mgwfbp-opt --gloo-algorithm $algo > "$tmp/out" 2> "$tmp/err"; then
    [ "$(grep -c "4 iterations verified exact" "$tmp/out")" -eq 3 ] && ok || bad "$algo: not every iteration verified"
  else
    bad "$algo run failed: $(tail -2 "$tmp/err")"
  fi
done

# DeFT with its second link on 3 workers (workers 1 and 2 replay worker 0's decisions).
if "$qs" run "${common[@]}" --workers 3 --policy deft --second-link 2 > "$tmp/out" 2> "$tmp/err"; then
  grep -q 'link 1 all-reduce fit' "$tmp/out" && ok || bad "deft: no second link fit"
  [ "$(grep -c "4 iterations verified exact" "$tmp/out")" -eq 3 ] && ok || bad "deft: not every iteration verified"
else
  bad "deft run failed: $(tail -3 "$tmp/err")"
fi

# Real hosts: a coordinator and two separate workers.
"$qs" coordinator --architecture allreduce --workers 2 --listen 127.0.0.1:0 --timeout 60s --secret-file "$tmp/secret" > "$tmp/coord" 2>&1 &
cpid=$!
for _ in $(seq 50); do grep -q listening "$tmp/coord" && break; sleep 0.1; done
addr=$(sed -n 's/^listening //p' "$tmp/coord")
role=(worker --architecture allreduce --model "$tmp/small.json" --workers 2 --iterations 3 --policy mgwfbp
      --coordinator "$addr" --json --secret-file "$tmp/secret")
"$qs" "${role[@]}" --worker-id 0 > "$tmp/w0" 2>&1 & w0=$!
"$qs" "${role[@]}" --worker-id 1 > "$tmp/w1" 2>&1 & w1=$!
wait $w0 && wait $w1 && wait $cpid && grep -q '"iterations_verified":3' "$tmp/w0" && grep -q '"iterations_verified":3' "$tmp/w1" \
  && ok || bad "separate processes: $(tail -2 "$tmp/w0" "$tmp/w1" "$tmp/coord")"

# A worker that stalls (SIGSTOP): the other exits within its peer timeout, saying so.
# Worker 1 (worker 0 waits for its reports) and worker 0 (worker 1 waits for its decisions).
for stalled in 1 0; do
  other=$((1 - stalled))
  "$qs" coordinator --architecture allreduce --workers 2 --listen 127.0.0.1:0 --timeout 60s --secret-file "$tmp/secret" > "$tmp/coord" 2>&1 &
  cpid=$!
  for _ in $(seq 200); do grep -q listening "$tmp/coord" && break; sleep 0.05; done
  addr=$(sed -n 's/^listening //p' "$tmp/coord")
  [ -n "$addr" ] || bad "stalled worker $stalled: the coordinator did not start: $(cat "$tmp/coord")"
  role=(worker --architecture allreduce --model "$tmp/small.json" --workers 2 --iterations 100000 --policy wfbp
        --coordinator "$addr" --peer-timeout 2s --secret-file "$tmp/secret")
  "$qs" "${role[@]}" --worker-id $stalled > "$tmp/ws" 2>&1 & ws=$!
  "$qs" "${role[@]}" --worker-id $other > "$tmp/wo" 2>&1 & wo=$!
  sleep 2; kill -STOP $ws
  start=$(date +%s); wait $wo; rc=$?; took=$(( $(date +%s) - start ))
  kill -KILL $ws 2> /dev/null; wait $ws 2> /dev/null; wait $cpid 2> /dev/null
  [ $rc -eq 1 ] && [ $took -lt 15 ] && grep -Eq "nothing from the other workers|lost worker $stalled|timed out|Timed out" "$tmp/wo" && ok \
    || bad "stalled worker $stalled: worker $other rc $rc after ${took}s: $(tail -1 "$tmp/wo")"
done

# A worker that dies: the run fails within the peer timeout and names it.
start=$(date +%s)
"$qs" run "${common[@]/#4/6}" --workers 3 --policy wfbp --kill-worker 1 --kill-at-iteration 2 \
  > "$tmp/out" 2> "$tmp/err"; rc=$?
took=$(( $(date +%s) - start ))
[ $rc -eq 1 ] && grep -q "worker 1" "$tmp/err" && [ $took -lt 40 ] && ok \
  || bad "dead worker: rc $rc after ${took}s: $(tail -2 "$tmp/err")"
pgrep -f "$tmp/" > /dev/null && bad "processes left behind" || ok

# Bad input: exit 2 with one line.
expect2() {
  local what=$1; shift
  "$qs" "$@" > /dev/null 2> "$tmp/err"; local rc=$?
  [ $rc -eq 2 ] && ok || bad "$what: exit $rc ($(head -1 "$tmp/err"))"
}
expect2 "no coordinator" worker --architecture allreduce --model "$tmp/small.json" --worker-id 0 --policy wfbp --insecure
expect2 "bad algorithm" run "${common[@]}" --workers 2 --policy wfbp --gloo-algorithm nope
expect2 "ps policy" run "${common[@]}" --workers 2 --policy mercury
expect2 "no gloo tree" run "${common[@]}" --workers 2 --policy wfbp --allreduce tree
expect2 "bad link" worker --architecture allreduce --model "$tmp/small.json" --worker-id 0 --policy wfbp --insecure \
  --coordinator 127.0.0.1:1 --link not-an-address
expect2 "server in allreduce" server --architecture allreduce --server-id 0 --model "$tmp/small.json" --policy wfbp --insecure
# A stranger without the secret gets nothing from the store: the workers still meet.
"$qs" coordinator --architecture allreduce --workers 1 --listen 127.0.0.1:0 --timeout 20s --secret-file "$tmp/secret" > "$tmp/coord" 2> "$tmp/coord.err" &
cpid=$!
for _ in $(seq 50); do grep -q listening "$tmp/coord" && break; sleep 0.1; done
addr=$(sed -n 's/^listening //p' "$tmp/coord")
reply=$(printf 'get link0/0\n' | timeout 3 bash -c "exec 3<>/dev/tcp/${addr%:*}/${addr#*:}; cat >&3; timeout 1 cat <&3" 2>/dev/null | tr -d '\0' | head -c 4)
"$qs" worker --architecture allreduce --model "$tmp/small.json" --workers 1 --worker-id 0 --iterations 2 --policy wfbp \
  --coordinator "$addr" --secret-file "$tmp/secret" > /dev/null 2>&1; rc=$?
wait $cpid
[ "$reply" = "QSA1" ] && [ $rc -eq 0 ] && grep -q "refused" "$tmp/coord.err" && ok \
  || bad "store: a stranger got '$reply', worker rc $rc, log: $(cat "$tmp/coord.err")"

# Network namespaces with tc-shaped links (root only).
if [ "$(id -u)" -eq 0 ] && command -v tc > /dev/null; then
  if "$qs" run "${common[@]}" --netns --workers 2 --policy wfbp,mgwfbp > "$tmp/out" 2> "$tmp/err"; then
    [ "$(grep -c "4 iterations verified exact" "$tmp/out")" -eq 4 ] && ok || bad "netns: not every iteration verified"
  else
    bad "netns run failed: $(tail -3 "$tmp/err")"
  fi
  # DeFT's second link: a veth of its own per host; both links' byte counters move.
  if "$qs" run "${common[@]}" --netns --workers 2 --policy deft --second-link 2 > "$tmp/out" 2> "$tmp/err"; then
    [ "$(grep -c "4 iterations verified exact" "$tmp/out")" -eq 2 ] && ok || bad "netns deft: not every iteration verified"
    for l in 0 1; do
      grep -Eq "link $l carried [1-9]" "$tmp/out" && ok || bad "netns deft: link $l carried nothing"
    done
  else
    bad "netns deft run failed: $(tail -3 "$tmp/err")"
  fi
  # A cluster's namespaces are named qs<launcher pid>h<host>: any whose launcher is gone
  # was left behind (other jobs on this machine may have live ones).
  left=""
  for ns in $(ip netns list | sed -n 's/^\(qs[0-9]*h[0-9]*\).*/\1/p'); do
    pid=${ns#qs}; pid=${pid%%h*}
    kill -0 "$pid" 2> /dev/null || left="$left $ns"
  done
  [ -z "$left" ] && ok || bad "netns: namespaces left behind:$left"
fi

echo "allreduce_cluster_test: $pass passed, $fail failed"
[ $fail -eq 0 ]
