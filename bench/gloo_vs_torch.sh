#!/usr/bin/env bash
# One large all-reduce: Quicksilver's all-reduce runtime (its gloo Exchange: the
# agreement message, gloo's ring in place in the sum buffer; --no-verify) against torch.distributed.all_reduce
# with PyTorch's own gloo backend, the same size on the same two tc-shaped hosts, one after
# the other, RUNS times. Prints each side's median time per all-reduce and the ratio
# torch / quicksilver (1.0: as fast as PyTorch; the issue's target is at least 0.95, since
# both use the same libgloo).
# Needs root, iproute2 and torch (the interpreter of scripts/python.sh). Usage:
#   bash bench/gloo_vs_torch.sh [build/quicksilver] [SIZE_MIB=16] [RATE=1gbit] [RUNS=5]
set -euo pipefail
qs=$(realpath "${1:-build/quicksilver}")
mib=${2:-16}
rate=${3:-1gbit}
runs=${4:-5}
python=$(QS_BUILD_DIR=${QS_BUILD_DIR:-$(dirname "$qs")} bash "$(dirname "$0")/../scripts/python.sh")
tag=qsgt$$
tmp=$(mktemp -d)
cleanup() { ip netns del ${tag}a 2> /dev/null || true; ip netns del ${tag}b 2> /dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT

# Two hosts joined by one veth pair, each side shaped at RATE (a 1 ms burst, 2 ms queue as
# the emulated cluster's shapers).
ip netns add ${tag}a; ip netns add ${tag}b
ip link add ${tag}x type veth peer name ${tag}y
ip link set ${tag}x netns ${tag}a; ip link set ${tag}y netns ${tag}b
ip -n ${tag}a addr add 10.215.0.1/24 dev ${tag}x; ip -n ${tag}b addr add 10.215.0.2/24 dev ${tag}y
for ns in a b; do
  dev=${tag}x; [ $ns = b ] && dev=${tag}y
  ip -n ${tag}$ns link set $dev up; ip -n ${tag}$ns link set lo up
  ip netns exec ${tag}$ns tc qdisc replace dev $dev root tbf rate $rate burst 128kb latency 2ms
done

elements=$(( mib * 1024 * 1024 / 4 ))
cat > "$tmp/one.json" <<JSON
{"name": "one-bucket", "batch_size": 1, "layers": [
 {"name": "big", "forward_ms": 0.01, "backward_ms": 0.01, "tensors": [{"name": "w", "elements": $elements}]}]}
JSON
cat > "$tmp/torch_ar.py" <<'PY'
import os, sys, time, statistics, torch, torch.distributed as dist
rank, n = int(sys.argv[1]), int(sys.argv[2])
dist.init_process_group("gloo", init_method="tcp://10.215.0.1:29511", rank=rank, world_size=2)
x = torch.ones(n)
for _ in range(3): dist.all_reduce(x)
times = []
for _ in range(12):
    dist.barrier()
    t0 = time.perf_counter(); dist.all_reduce(x); times.append(time.perf_counter() - t0)
if rank == 0: print(statistics.median(times) * 1e3)
dist.destroy_process_group()
PY

ours() {  # median iteration in ms (one all-reduce per iteration; compute ~0)
  ip netns exec ${tag}a "$qs" coordinator --architecture allreduce --workers 2 --listen 10.215.0.1:0 --insecure > "$tmp/coord" 2>&1 &
  local c=$!
  for _ in $(seq 50); do grep -q listening "$tmp/coord" && break; sleep 0.1; done
  local addr; addr=$(sed -n 's/^listening //p' "$tmp/coord")
  local role=(worker --architecture allreduce --model "$tmp/one.json" --workers 2 --iterations 14 --warmup 2
              --policy synceasgd --coordinator "$addr" --json --no-verify --insecure)
  ip netns exec ${tag}b "$qs" "${role[@]}" --worker-id 1 --link 10.215.0.2 > /dev/null &
  local w1=$!
  ip netns exec ${tag}a "$qs" "${role[@]}" --worker-id 0 --link 10.215.0.1 > "$tmp/w0"
  wait $w1 $c
  "$python" -c 'import json,sys; print(json.load(open(sys.argv[1]))["median_iteration_ns"]/1e6)' "$tmp/w0"
}
theirs() {
  ip netns exec ${tag}b env GLOO_SOCKET_IFNAME=${tag}y "$python" "$tmp/torch_ar.py" 1 $elements &
  local p=$!
  ip netns exec ${tag}a env GLOO_SOCKET_IFNAME=${tag}x "$python" "$tmp/torch_ar.py" 0 $elements
  wait $p
}

echo "one all-reduce of $mib MiB float32, 2 hosts, veth shaped at $rate each way, $runs runs"
printf "%-5s %14s %14s %8s\n" run quicksilver_ms torch_ms ratio
ratios=()
for r in $(seq "$runs"); do
  q=$(ours); t=$(theirs)
  ratio=$("$python" -c "print(f'{$t/$q:.3f}')")
  ratios+=("$ratio")
  printf "%-5s %14.2f %14.2f %8s\n" "$r" "$q" "$t" "$ratio"
done
"$python" -c "import statistics,sys; r=[float(x) for x in sys.argv[1:]]; print(f'median ratio torch/quicksilver {statistics.median(r):.3f} (min {min(r):.3f}, max {max(r):.3f})')" "${ratios[@]}"
