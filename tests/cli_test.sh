#!/usr/bin/env bash
# The command line from outside: exit codes and messages (bad input never crashes).
set -u
qs=${QS_BIN:?set QS_BIN to the quicksilver binary}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
pass=0; fail=0
ok() { pass=$((pass+1)); }
bad() { echo "FAIL: $*"; fail=$((fail+1)); }

# expect_error "needle" args...: exits non-zero (not a crash: rc < 128) and stderr has needle.
expect_error() {
  local needle=$1; shift
  "$qs" "$@" > "$tmp/out" 2> "$tmp/err"; local rc=$?
  if [ $rc -eq 0 ] || [ $rc -ge 128 ]; then bad "quicksilver $* exited $rc"; return; fi
  if [ "$(wc -l < "$tmp/err")" -gt 3 ]; then bad "quicksilver $*: error is not one clear message: $(cat "$tmp/err")"; return; fi
  grep -qF -- "$needle" "$tmp/err" && ok || bad "quicksilver $*: stderr lacks '$needle': $(cat "$tmp/err")"
}
expect_ok() {
  "$qs" "$@" > "$tmp/out" 2> "$tmp/err" && ok || bad "quicksilver $* failed: $(cat "$tmp/err")"
}

expect_ok models
grep -q "vgg16_cifar10" "$tmp/out" && ok || bad "models lacks vgg16_cifar10"
grep -q "138357544" "$tmp/out" && ok || bad "models lacks VGG-16's parameter count"
expect_ok models --device a100 --json
expect_ok simulate --model vgg16 --policy oracle,wfbp,mercury --iterations 3
grep -q "mercury" "$tmp/out" && ok || bad "table lacks mercury"
expect_ok simulate --model resnet50 --policy mercury,tictac --workers 2 --servers 1 --json
python3 -c "import json,sys; d=json.load(open('$tmp/out')); assert len(d['results'])==2" && ok || bad "json"

expect_error "unknown policy 'nope'" simulate --policy nope
expect_error "--bandwidth" simulate --policy wfbp --bandwidth 10
expect_error "--latency" simulate --policy wfbp --latency fast
expect_error "--packet-size" simulate --policy mercury --packet-size 0KiB
expect_error "--workers" simulate --policy wfbp --workers 0
expect_error "unknown architecture" simulate --policy wfbp --architecture mesh
expect_error "neither a built-in model" simulate --model /no/such/file.json
expect_error "--compute-factor" simulate --policy wfbp --workers 2 --compute-factor 1,2,3
expect_error "--bandwidth-trace" simulate --policy wfbp --bandwidth-trace random:1Gbps
expect_error "congestion control 'nosuchcc' is not available" run --model vgg16 --policy mercury --congestion nosuchcc
# Issue 15 (points 6-7): the peer timeout, the checksum switch and cleanup's flags.
expect_exit2() {
  local needle=$1; shift
  "$qs" "$@" > "$tmp/out" 2> "$tmp/err"; local rc=$?
  [ $rc -eq 2 ] && [ "$(wc -l < "$tmp/err")" -eq 1 ] && grep -qF -- "$needle" "$tmp/err" && ok \
    || bad "quicksilver $*: exit $rc, not 2 with one line naming '$needle': $(cat "$tmp/err")"
}
expect_exit2 "--peer-timeout must be > 0" run --model vgg16 --policy mercury --peer-timeout 0s
expect_exit2 "--peer-timeout" run --model vgg16 --policy mercury --peer-timeout soon
expect_exit2 "--peer-timeout must be > 0" server --server-id 0 --policy mercury --insecure --peer-timeout 0ms
expect_exit2 "--peer-timeout" worker --worker-id 0 --policy mercury --insecure --connect 127.0.0.1:1 --peer-timeout -3s
expect_exit2 "--bogus" cleanup --bogus
# Issue 28 (item 5): a role's --job FILE (the launcher's job message) carries the whole job:
# refused beside a job flag, as is another version's message or one of another role.
expect_exit2 "--job carries the whole job; drop --policy" worker --job "$tmp/none.json" --policy mercury
expect_exit2 "--job carries the whole job; drop --workers, --listen" server --job "$tmp/none.json" --workers 2 --listen 127.0.0.1:0
expect_exit2 "--job carries the whole job; drop --timeout" coordinator --job "$tmp/none.json" --timeout 1s
expect_exit2 "--job: cannot read '$tmp/none.json'" worker --job "$tmp/none.json"
echo '{"version": 99, "role": "worker"}' > "$tmp/v99.json"
expect_exit2 "version 99, this quicksilver reads version 1: the launcher and its children must be the same quicksilver build" worker --job "$tmp/v99.json"
echo '{"version": 1, "role": "worker", "peer_timeout_ns": "20s"}' > "$tmp/bad-field.json"
expect_exit2 "field 'peer_timeout_ns'" worker --job "$tmp/bad-field.json"
echo '{"version": 1, "role": "worker"}' > "$tmp/worker.json"
expect_exit2 "the job of a worker" server --job "$tmp/worker.json"
expect_exit2 "--worker-id is required" worker --policy mercury --insecure --connect 127.0.0.1:1
"$qs" cleanup --dry-run > "$tmp/out" 2> "$tmp/err"; rc=$?
[ $rc -eq 0 ] && [ -s "$tmp/out" ] && ok || bad "cleanup --dry-run: exit $rc: $(cat "$tmp/err")"
expect_error "congestion control 'nosuchcc' is not available" worker --worker-id 0 --servers 1 --connect 127.0.0.1:1 --policy mercury --congestion nosuchcc
expect_error "a server records no timeline" server --server-id 0 --listen 127.0.0.1:0 --policy mercury --trace "$tmp/s.json"
expect_error "--commit-window" run --model vgg16 --policy mercury --commit-window fast
expect_error "--commit-window: '-1us': a time cannot be negative" worker --worker-id 0 --connect 127.0.0.1:1 --policy mercury --commit-window -1us
expect_error "no delay emulation" run --model vgg16 --policy mercury --latency 1ms
expect_error "--rto-min needs --netns" run --model vgg16 --policy mercury --rto-min 5ms
expect_error "--quickack needs --netns" run --model vgg16 --policy mercury --quickack
expect_error "--rto-min" run --netns --model vgg16 --policy mercury --rto-min soon
expect_error "--switch-buffer, --host-queue and --host-gso need --netns" run --model vgg16 --policy mercury --switch-buffer 10ms
expect_error "--switch-buffer, --host-queue and --host-gso need --netns" run --model vgg16 --policy mercury --host-queue 2ms
expect_error "--switch-buffer, --host-queue and --host-gso need --netns" run --model vgg16 --policy mercury --host-gso 64KiB
expect_error "--switch-buffer must be in 100us..1s" run --netns --model vgg16 --policy mercury --switch-buffer 5s
expect_error "--switch-buffer" run --netns --model vgg16 --policy mercury --switch-buffer deep
expect_error "--host-queue must be in 100us..1s" run --netns --model vgg16 --policy mercury --host-queue 10us
expect_error "--host-queue" run --netns --model vgg16 --policy mercury --host-queue deep
expect_error "--host-gso must be in 1500B..64KiB" run --netns --model vgg16 --policy mercury --host-gso 1MiB
expect_error "--host-gso" run --netns --model vgg16 --policy mercury --host-gso big
printf '0s 10Gbps\n5ms 2Gbps\n' > "$tmp/fast.txt"
expect_error "rate changes less than 10 ms apart" run --netns --model vgg16 --policy mercury --bandwidth-trace "$tmp/fast.txt"

echo '{"layers": []}' > "$tmp/empty.json"
expect_error "at least one layer" simulate --model "$tmp/empty.json" --policy wfbp
echo '{"layers": [' > "$tmp/broken.json"
expect_error "not valid JSON" simulate --model "$tmp/broken.json" --policy wfbp
echo '{"layers": [{"name": "fc", "forward_ms": 1, "backward_ms": -2, "tensors": [{"name": "w", "elements": 3}]}]}' > "$tmp/neg.json"
expect_error "layer 1 'fc': backward_ms must be >= 0" simulate --model "$tmp/neg.json" --policy wfbp
printf '0s 10Gbps\n1s 2Gbps\n' > "$tmp/trace.txt"
expect_ok simulate --model vgg16_cifar10 --policy mercury --bandwidth-trace "$tmp/trace.txt" --iterations 3
expect_ok simulate --model vgg16_cifar10 --policy mercury --trace "$tmp/t.json" --iterations 2
# --statistic mean: the iteration time is the mean of the iterations after the warm-up.
expect_ok simulate --model resnet50 --policy mercury --bandwidth-trace random:1Gbps:10Gbps:500ms:7 --iterations 8 --statistic mean --json
python3 -c "
import json; d = json.load(open('$tmp/out')); r = d['results'][0]; it = r['iterations_ms'][1:]
assert d['config']['statistic'] == 'mean', d['config']
assert abs(r['iteration_ms'] - sum(it) / len(it)) < 1e-3, (r['iteration_ms'], it)
assert abs(r['iteration_ms'] - sorted(it)[len(it) // 2]) > 1e-3, 'mean equals the median here: the test cannot tell them apart'
" && ok || bad "--statistic mean is not the mean of the steady iterations"
expect_ok simulate --model resnet50 --policy mercury --iterations 4 --statistic mean
grep -q "mean of 3 iterations after 1 warm-up" "$tmp/out" && ok || bad "table title does not say mean: $(head -1 "$tmp/out")"
# Several jobs sharing the cluster (Mercury Fig. 20): one row per job.
expect_ok simulate --job vgg16_cifar10:mercury --job alexnet:wfbp:64 --iterations 2 --job-sharing deadline --json
python3 -c "
import json; d = json.load(open('$tmp/out')); r = d['results']
assert [x['model'] for x in r] == ['vgg16_cifar10', 'alexnet'] and r[1]['batch_size'] == 64, r
assert d['config']['job_sharing'] == 'deadline' and d['config']['share_gpus'] is True, d['config']
" && ok || bad "simulate --job: not one result per job"
expect_error "--statistic: 'average' is neither median nor mean" simulate --policy wfbp --statistic average
python3 -c "import json; d=json.load(open('$tmp/t.json')); assert d['traceEvents']" && ok || bad "trace"
# --trace says what it wrote; a trace that would pass 10 MB is written coarse unless asked
# (VGG-16 under Mercury: 42 MB per packet, 0.4 MB per tensor run), a flag away from fine.
"$qs" simulate --model vgg16 --policy mercury --trace "$tmp/big.trace" > /dev/null 2> "$tmp/trace.err" \
  && grep -q "spans, 0.4 MB -> $tmp/big.trace (coarse: .*about 42.0 MB: --trace-detail fine)" "$tmp/trace.err" \
  && [ "$(stat -c %s "$tmp/big.trace")" -lt 10000000 ] && ok || bad "coarse trace: $(cat "$tmp/trace.err")"
"$qs" simulate --model vgg16_cifar10 --policy mercury --iterations 2 --trace "$tmp/fine.trace" --trace-detail fine \
  > /dev/null 2> "$tmp/trace.err" && grep -q "spans, .* MB -> $tmp/fine.trace" "$tmp/trace.err" \
  && ! grep -q "(coarse:" "$tmp/trace.err" && ok || bad "fine trace: $(cat "$tmp/trace.err")"
expect_exit2 "--trace-detail: 'medium': give auto, fine or coarse" simulate --policy wfbp --trace "$tmp/x.json" --trace-detail medium
expect_exit2 "--trace-detail needs --trace FILE" simulate --policy wfbp --trace-detail coarse

# Bad input is exit 2 with one line, never 3, never unbounded (issue 15, point 3).
# expect_bad "needle" args...: exit status exactly 2, one line on stderr holding needle,
# within 20 seconds.
expect_bad() {
  local needle=$1; shift
  timeout 20 "$qs" "$@" > "$tmp/out" 2> "$tmp/err" < /dev/null; local rc=$?
  if [ $rc -ne 2 ]; then bad "quicksilver $* exited $rc (want 2): $(head -c 300 "$tmp/err")"; return; fi
  if [ "$(wc -l < "$tmp/err")" -ne 1 ]; then bad "quicksilver $*: not one line: $(cat "$tmp/err")"; return; fi
  grep -qF -- "$needle" "$tmp/err" && ok || bad "quicksilver $*: stderr lacks '$needle': $(cat "$tmp/err")"
}
echo '{"layers": [{"name": "fc", "forward_ms": 1e400, "backward_ms": 1, "tensors": [{"name": "w", "elements": 3}]}]}' > "$tmp/huge.json"
expect_bad "not valid JSON" simulate --model "$tmp/huge.json" --policy wfbp
echo '{"layers": [{"name": "fc", "forward_ms": 1, "backward_ms": 1, "tensors": [{"name": "w", "elements": 1e400}]}]}' > "$tmp/huge2.json"
expect_bad "not valid JSON" simulate --model "$tmp/huge2.json" --policy wfbp
latin1=$(printf '%s/caf\351.json' "$tmp")
echo '{"layers": [{"name": "fc", "forward_ms": 1, "backward_ms": 1, "tensors": [{"name": "w", "elements": 1024}]}]}' > "$latin1"
expect_ok simulate --model "$latin1" --policy wfbp --json --iterations 2
python3 -c "import json; d=json.load(open('$tmp/out')); assert d['config']['model'] == 'caf?', d['config']" && ok || bad "non-UTF-8 profile name in --json"
before=$(ls -d /tmp/qs-run-* 2>/dev/null | wc -l)
expect_ok run --model "$latin1" --policy wfbp --workers 1 --servers 1 --iterations 2 --json
after=$(ls -d /tmp/qs-run-* 2>/dev/null | wc -l)
[ "$after" -le "$before" ] && ok || bad "run left a qs-run-* directory behind"
expect_bad "--bandwidth-trace with --script needs --netns" run --workers 2 --bandwidth-trace 1Gbps --script "$tmp/out"
# --policy auto (issue 30): simulate refuses it, pointing to advise; run decides between
# phases (docs/cli.md "run --policy auto"), its flags refused where they do not apply.
expect_bad "use quicksilver advise" simulate --model vgg16 --policy auto
expect_bad "--policy auto tunes the knobs itself: drop --packet-size" run --model vgg16 --policy auto --packet-size 4KiB
expect_bad "--replan-every applies to --policy auto only" run --model vgg16 --policy mercury --replan-every 5
expect_bad "--allow-stale applies to --policy auto only" run --model vgg16 --policy ddp --architecture allreduce --allow-stale
expect_bad "--replan-every must be >= 1" run --model resnet18 --workers 2 --servers 2 --policy auto --replan-every 0
expect_bad "--policy auto runs alone" run --model resnet18 --workers 2 --servers 2 --policy auto,mercury
expect_bad "--keep-going does not apply to --policy auto" run --model resnet18 --policy auto --keep-going
expect_bad "--trace does not apply to --policy auto" run --model resnet18 --policy auto --trace "$tmp/t.json"
# A run of 14 iterations on loopback: the start policy for 6 (2 warm-up, 4 measured), a
# decision logged with its reason, the rest; one row, "auto", of all 14.
"$qs" run --model resnet18 --workers 2 --servers 2 --policy auto --iterations 14 --replan-every 4 --json > "$tmp/auto.json" 2> "$tmp/auto.err" \
  && grep -qF "quicksilver run: auto, after iterations 1..6: mercury: " "$tmp/auto.err" \
  && python3 -c 'import json, sys; r = json.load(open(sys.argv[1]))["results"]; assert [x["policy"] for x in r] == ["auto"] and len(r[0]["iterations_ms"]) == 14, r' "$tmp/auto.json" \
  && ok || bad "run --policy auto: $(tail -3 "$tmp/auto.err")"
expect_bad "--policy auto tunes the knobs itself: drop packet_size" run --workers 2 --policy auto --packet-size 4KiB --script "$tmp/out"
expect_bad "--scale must be in (0, 1]" run --model vgg16 --policy mercury --scale nan
expect_bad "--scale must be in (0, 1]" run --model vgg16 --policy mercury --scale -0.5
expect_bad "a scaled link needs at least 1Mbps" run --model vgg16 --policy mercury --scale 1e-9
expect_bad "a link needs at least 1Mbps" run --model vgg16 --policy mercury --bandwidth 500Kbps
expect_bad "--workers must be in 1..64" coordinator --listen 127.0.0.1:0 --workers 2000000000
expect_bad "--servers must be in 1..1024" coordinator --listen 127.0.0.1:0 --servers 2000000000
expect_bad "--servers must be in 1..1024" run --model vgg16 --policy mercury --servers 1025
expect_bad "at most 128 processes" run --model vgg16 --policy mercury --servers 100 --workers 64
expect_bad "--workers must be in 1..64" worker --worker-id 0 --connect 127.0.0.1:1 --policy mercury --workers 65
expect_bad "not a regular file" simulate --model /dev/zero --policy wfbp
expect_bad "not a regular file" simulate --policy wfbp --bandwidth-trace /dev/zero
expect_bad "not a regular file" simulate --policy wfbp --allreduce-fit /dev/zero --architecture allreduce
mkfifo "$tmp/fifo"
expect_bad "not a regular file" simulate --model "$tmp/fifo" --policy wfbp
expect_bad "not a regular file" simulate --policy wfbp --bandwidth-trace "$tmp/fifo"
head -c $((65 * 1024 * 1024)) /dev/zero > "$tmp/big.json"
expect_bad "larger than the limit of 64 MiB" simulate --model "$tmp/big.json" --policy wfbp
rm -f "$tmp/big.json"
expect_bad "--packet-size 1B cuts vgg16" simulate --policy mercury --packet-size 1B
expect_bad "the limit is 1048576 per worker" simulate --policy bytescheduler --partition-size 1B
expect_bad "--slice-size 1B" simulate --policy p3 --slice-size 1B
expect_bad "--prophet-partition-size 1B" simulate --policy prophet --prophet-partition-size 1B
expect_bad "--deft-partition-size 1B" simulate --architecture allreduce --policy deft --deft-partition-size 1B
expect_bad "over all workers" simulate --policy mercury --workers 4096
expect_bad "--server-shares lists 2 values for 4 servers" simulate --policy mercury --server-shares 1,2
expect_bad "--server-bandwidths: server 9 does not exist" simulate --policy mercury --server-bandwidths 9=1Gbps
expect_bad "--worker-bandwidths: cannot read '1=fast'" simulate --policy mercury --worker-bandwidths 1=fast
expect_bad "--server-shares values must be in (0, 1000000]" simulate --policy mercury --server-shares 0=0
expect_bad "--server-shares needs --architecture ps" simulate --architecture allreduce --policy ddp --server-shares 1,1,1,1
expect_bad "--server-shares is the simulator's" run --model vgg16 --policy mercury --server-shares 2,1,1,1
expect_bad "--job needs --netns" run --job vgg16:mercury --job resnet50:wfbp
expect_bad "--job-sharing strict: the runtime's jobs share the links" run --netns --job vgg16:mercury --job-sharing strict
expect_bad "--job-sharing and --separate-gpus need --job" run --model vgg16 --policy mercury --separate-gpus
expect_bad "--worker-bandwidths and --server-bandwidths need --netns" run --model vgg16 --policy mercury --server-bandwidths 0=5Gbps
expect_bad "--server-bandwidths: 500Kbps: a link needs at least 1Mbps" run --netns --model vgg16 --policy mercury --server-bandwidths 0=500Kbps
expect_bad "are the simulator's" worker --model vgg16 --policy mercury --worker-id 0 --connect 127.0.0.1:1 --server-bandwidths 0=5Gbps
expect_bad "--job-sharing and --separate-gpus need --job" simulate --policy mercury --job-sharing strict
expect_bad "--job 'vgg16': name its policy" simulate --job vgg16
expect_bad "--job 'vgg16:mercury:0': the batch must be an integer in 1..1000000" simulate --job vgg16:mercury:0
expect_bad "--job 'a:b:c:d': expected MODEL[:POLICY[:BATCH]]" simulate --job a:b:c:d
expect_bad "unknown job sharing 'lottery'" simulate --job vgg16:mercury --job-sharing lottery
expect_bad "job 0: 'ddp' is not a parameter-server policy" simulate --job vgg16:ddp
expect_bad "the parameter-server architecture only" simulate --architecture allreduce --job vgg16:ddp
expect_bad "--job: at most 16 jobs" simulate $(for i in $(seq 17); do printf -- '--job vgg16:wfbp '; done)
expect_bad "cannot be combined with --bandwidth-trace" simulate --policy mercury --bandwidth-trace random:1Gbps:2Gbps:1s --server-bandwidths 0=1Gbps
expect_bad "the limit is 33554432 over all workers" simulate --policy mercury --workers 1207 --servers 1207
expect_bad "--packet-size 1B" run --model vgg16 --policy mercury --packet-size 1B
expect_bad "--deft-exact-items must be in 0..20" simulate --architecture allreduce --policy deft --deft-exact-items 25
"$qs" bogus-command > /dev/null 2>&1; [ $? -ne 0 ] && ok || bad "unknown subcommand accepted"

# The cluster secret (docs/reliability.md): required by every role unless --insecure; its
# file is bounded; the environment variable is the flag's default.
printf '15 bytes secret' > "$tmp/short"
head -c 32 /dev/urandom > "$tmp/secret"
expect_bad "no cluster secret: give --secret-file FILE or set QUICKSILVER_SECRET_FILE" server --server-id 0 --policy mercury
expect_bad "no cluster secret" worker --worker-id 0 --connect 127.0.0.1:1 --policy mercury
expect_bad "no cluster secret" coordinator --listen 127.0.0.1:0
expect_bad "--secret-file: secret file '$tmp/short' holds 15 bytes" server --server-id 0 --policy mercury --secret-file "$tmp/short"
expect_bad "not a regular file" coordinator --listen 127.0.0.1:0 --secret-file /dev/zero
expect_bad "--secret-file: secret file '$tmp/none'" worker --worker-id 0 --connect 127.0.0.1:1 --policy mercury --secret-file "$tmp/none"
QUICKSILVER_SECRET_FILE="$tmp/short" expect_bad "QUICKSILVER_SECRET_FILE: secret file" coordinator --listen 127.0.0.1:0
QUICKSILVER_SECRET_FILE="$tmp/secret" expect_bad "--insecure: QUICKSILVER_SECRET_FILE is set" coordinator --listen 127.0.0.1:0 --insecure
expect_bad "excludes" server --server-id 0 --policy mercury --insecure --secret-file "$tmp/secret"
"$qs" coordinator --help | grep -q "127.0.0.1:7000" && ok || bad "the coordinator's default address is not loopback"

# The interpreter (docs/cli.md "The Python interpreter"): `run --script` and `profile` start
# the one --python names (a stub that records how it was started); run --script's
# --timeout bounds the script only when given, the default's value (300s) included.
cat > "$tmp/py" <<SH
#!/bin/sh
echo "\$* RANK=\$RANK" >> "$tmp/py.log"
SH
chmod +x "$tmp/py"
echo "raise SystemExit('not this interpreter')" > "$tmp/train.py"
expect_ok run --workers 2 --python "$tmp/py" --script "$tmp/train.py" --lr 1
[ "$(sort "$tmp/py.log" | tr '\n' '|')" = "$tmp/train.py --lr 1 RANK=0|$tmp/train.py --lr 1 RANK=1|" ] && ok \
  || bad "run --script --python: the stub was started as: $(cat "$tmp/py.log")"
grep -q "timeout" "$tmp/err" && bad "run --script without --timeout is bounded: $(cat "$tmp/err")" || ok
expect_ok run --workers 1 --timeout 300s --python "$tmp/py" --script "$tmp/train.py"
grep -q "timeout 300s)" "$tmp/err" && ok || bad "run --script --timeout 300s (the default's value) dropped: $(cat "$tmp/err")"
expect_ok run --workers 1 --timeout 120000ms --python "$tmp/py" --script "$tmp/train.py"
grep -q "timeout 120s)" "$tmp/err" && ok || bad "run --script --timeout 120000ms dropped: $(cat "$tmp/err")"
if [ -d "$(dirname "$qs")/python/quicksilver" ]; then  # built with QS_WITH_TORCH
  rm -f "$tmp/py.log"
  expect_ok profile --python "$tmp/py" --model m --out -
  expect_ok profile --model m --python="$tmp/py" --out x
  [ "$(tr '\n' '|' < "$tmp/py.log")" = "-m quicksilver.profile --model m --out - RANK=|-m quicksilver.profile --model m --out x RANK=|" ] \
    && ok || bad "profile --python: the stub was started as: $(cat "$tmp/py.log")"
fi
expect_bad "--python needs a PATH" profile --model m --python

# Progress lines (issue 31 item 2): on a terminal (script(1) gives the command a pty) a
# command still working after 1.5 s says what it does, at least every 10 s; off a
# terminal, and on one with --json, nothing but its output. A run paced at 1 Gbit/s lasts
# about 3 s of wire time on any machine (a CPU-bound command long enough for a fast
# machine, `tune --model vgg16`, took 37 s under ASan, three times over).
progress_run=(run --model resnet18 --workers 2 --servers 1 --bandwidth 1Gbps --iterations 5 --policy mercury)
progress_line='^quicksilver run: (starting|mercury \(policy 1 of 1\)), [0-9]+ s'
any_progress_line='^quicksilver run: .*, [0-9]+ s[[:space:]]*$'  # whatever it says (Progress's form)
if command -v script > /dev/null; then
  script -qec "$qs ${progress_run[*]}" /dev/null > "$tmp/tty.out" 2>&1
  grep -qE "$progress_line" "$tmp/tty.out" && ok \
    || bad "run on a terminal printed no progress line: $(head -c 300 "$tmp/tty.out")"
  script -qec "$qs ${progress_run[*]} --json" /dev/null > "$tmp/tty.out" 2>&1
  grep -qE "$any_progress_line" "$tmp/tty.out" && bad "run --json on a terminal printed progress lines" || ok
else
  bad "script(1) is missing (bsdutils): the progress lines go untested"
fi
"$qs" "${progress_run[@]}" > "$tmp/out" 2> "$tmp/err"
grep -qE "$any_progress_line" "$tmp/err" && bad "run off a terminal printed progress lines: $(head -c 200 "$tmp/err")" || ok
grep -q "^mercury " "$tmp/out" && ok || bad "the paced run printed no table: $(head -c 300 "$tmp/out") $(head -c 300 "$tmp/err")"

# run --script and the rest of run's flags (issue 31 item 3), generated from run's option
# table (`run --help`): each flag given alone to a --script run is refused with exit 2
# naming it, unless it is a launch flag or a scheduler choice, which reach the script's
# processes (QS_POLICY, QS_ARCHITECTURE, QS_COMPRESSION, QS_KNOBS).
cat > "$tmp/py" <<SH
#!/bin/sh
echo "policy=\$QS_POLICY arch=\$QS_ARCHITECTURE compression=\$QS_COMPRESSION knobs=\$QS_KNOBS" >> "$tmp/env.log"
SH
launch=" --help --script --python --workers --netns --congestion --rto-min --switch-buffer --host-queue --host-gso --quickack --timeout --bandwidth --bandwidth-trace --policy --architecture --compression "
knobs=" $({ "$qs" policies --markdown; "$qs" policies --architecture allreduce --markdown; } 2>/dev/null \
  | grep -o '`--[a-z0-9-]*`' | tr -d '`' | sort -u | tr '\n' ' ') "
checked=0
while read -r flag kind; do
  case "$launch$knobs" in *" $flag "*) continue ;; esac
  value=()
  case "$kind" in TEXT*|INT*|UINT*|FLOAT*) value=(1) ;; esac
  timeout 20 "$qs" run --workers 1 --python "$tmp/py" "$flag" "${value[@]}" --script "$tmp/train.py" \
    > "$tmp/out" 2> "$tmp/err" < /dev/null; rc=$?
  if [ $rc -eq 2 ] && grep -qF -- "$flag does not apply to run --script" "$tmp/err"; then
    ok
  else
    bad "run --script with $flag: exit $rc, not refused: $(head -c 300 "$tmp/err")"
  fi
  checked=$((checked + 1))
done < <("$qs" run --help | grep -E '^  +--' | awk '{print $1, $2}')
[ $checked -ge 35 ] && ok || bad "the generated run --script check saw only $checked refused flags"
rm -f "$tmp/env.log"
expect_ok run --workers 1 --python "$tmp/py" --policy bytescheduler --credit-size 8MiB --compression bf16 --script "$tmp/train.py"
grep -qx "policy=bytescheduler arch= compression=bf16 knobs=credit_size=8MiB" "$tmp/env.log" && ok \
  || bad "run --script --policy/knobs/--compression did not reach the script: $(cat "$tmp/env.log")"
expect_bad "--policy 'all': a script trains with one policy" run --workers 1 --python "$tmp/py" --policy all --script "$tmp/train.py"
expect_bad "--credit-size" run --workers 1 --python "$tmp/py" --credit-size lots --script "$tmp/train.py"
expect_bad "--bandwidth with --script needs --netns" run --workers 1 --python "$tmp/py" --bandwidth 1Gbps --script "$tmp/train.py"

# advise: the ranking as JSON, best first, oracle never ranked; --policy does not apply.
expect_ok advise --model resnet18 --workers 2 --servers 2 --iterations 3 --json
python3 - "$tmp/out" <<'PY' && ok || bad "advise --json: $(head -c 400 "$tmp/out")"
import json, sys
a = json.load(open(sys.argv[1]))
r = a["ranking"]
assert r and all(set(e) >= {"policy", "iteration_ms", "knobs"} for e in r), r
assert [e["iteration_ms"] for e in r] == sorted(e["iteration_ms"] for e in r), r
assert "oracle" not in [e["policy"] for e in r], r
assert a["sensitivity"], a
PY
expect_error "--policy: advise ranks every policy" advise --model resnet18 --policy mercury
# tune --json: its one JSON object, nothing before it.
expect_ok tune --model resnet18 --workers 2 --servers 2 --iterations 2 --grid-points 2 --refine-rounds 0 --json
python3 -c 'import json, sys; json.load(open(sys.argv[1]))' "$tmp/out" && ok || bad "tune --json is not one JSON object: $(head -c 200 "$tmp/out")"
expect_error "--bandwidth" advise --model resnet18 --bandwidth fast

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
