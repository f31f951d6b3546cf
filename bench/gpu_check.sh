#!/usr/bin/env bash
# GPU checks of issue 29, for the accelerator machine (one NVIDIA H100/H200, pip PyTorch with
# CUDA, Ubuntu, no Debian packages, no internet; ../shared/MACHINE-NOTES.md). One script,
# stages in priority order, each under its own timeout and all inside QS_GPU_DEADLINE
# (default 480 s), one summary line per stage, never stopping at the first failure:
#
#   build   the quicksilver command and the Python module (build/gpu), for python3 on PATH.
#           C++ dependencies the machine lacks come from Debian 12 packages in $QS_DEBS
#           (default build/gpu-debs: `bash bench/gpu_check.sh --fetch` fills it here, on a
#           Debian machine), unpacked with dpkg -x into build/gpu-prefix, never into /.
#   probe   the module imports beside CUDA torch; a small CUDA profile
#   a+b/2   2 ranks sharing the GPU: ResNet-18 (GroupNorm) through mercury, bytescheduler,
#           wfbp, mgwfbp, deft and auto (switching to bytescheduler at step 3: CUDA
#           staging across a switch), then compression on the wire (bf16, fp16), mixed
#           precision (autocast + GradScaler) and a bfloat16 model; each exact against its
#           one-process reference and rank against rank; then samples/s against DDP (gloo)
#           with the GPU's idle share (bench/gpu_train.py)
#   c       pinned copy bandwidth D2H/H2D; the urgent gradient's delay behind a large copy
#           (bench/gpu_copy.py)
#   e       the emulated cluster on the machine's cores: ResNet-50 at 4+4 and 8+8 hosts,
#           wfbp, bytescheduler and mercury beside the simulator, with the CPU idle share,
#           retransmissions and drops (bench/cluster_table.py). ip, tc, ss and iperf3 are the
#           machine's or Debian 12's from $QS_DEBS/net, run through the system's loader.
#   a+b/4   as a+b/2, with 4 ranks
#   d       GPU profiles of ResNet-50 and a BERT-Base-shaped transformer (quicksilver profile
#           --device cuda), and simulate's prediction for them at 10 and 25 Gbit/s
#
# With --cpu it runs what needs no GPU (the build, and stage a+b/2 on the CPU, small).
# Output: stdout, and $OUT/gpu_check.log when OUT is set. QS_GPU_STAGES=a,b,... runs only
# those stages; QS_GPU_SKIP_BUILD=1 with QS_GPU_BUILD=DIR uses a build already there.
#
#   bash bench/gpu_check.sh --fetch     # here (Debian): the .debs for the accelerator
#   bash bench/gpu_check.sh             # there
set -uo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
mode=gpu
case "${1:-}" in
  --fetch)
    mkdir -p build/gpu-debs && cd build/gpu-debs
    apt-get download nlohmann-json3-dev libcli11-dev libsodium-dev libsodium23 libgloo-dev libgloo0 \
      libhiredis0.14 libibverbs1 libnl-3-200 libnl-route-3-200 pkgconf pkgconf-bin libpkgconf3 || exit 1
    # Stage (e)'s tools and the libraries they need that are not glibc's, zlib's or libcap's:
    # run there through the system's loader with these libraries first (bench_tools below).
    mkdir -p net && cd net
    exec apt-get download iproute2 iperf3 libiperf0 libbpf1 libbsd0 libelf1 libmd0 libmnl0 libsctp1 libssl3 \
      libxtables12 libcap2 libtirpc3 libgssapi-krb5-2 libkrb5-3 libk5crypto3 libkrb5support0 libcom-err2 \
      libkeyutils1 ;;
  --cpu) mode=cpu ;;
  "") ;;
  *) echo "usage: bash bench/gpu_check.sh [--fetch | --cpu]" >&2; exit 2 ;;
esac
log=/dev/null
[ -n "${OUT:-}" ] && log="$OUT/gpu_check.log"
say() { echo "$*" | tee -a "$log"; }
summary=()
# QS_GPU_DEADLINE: seconds from the start by which every stage has ended (a stage's limit
# is cut to what is left; one with under 20 s left is skipped), so the summary always prints
# inside the device call's own limit.
deadline=$((start + ${QS_GPU_DEADLINE:-480}))
stage() {  # stage NAME SECONDS COMMAND...: runs it under its timeout, keeps its summary
  local name=$1 limit=$2 t0 rc left
  shift 2
  t0=$(date +%s)
  left=$((deadline - t0))
  if [ "$left" -lt 20 ]; then
    summary+=("$(printf '%-8s %s' "$name" "skipped (QS_GPU_DEADLINE: ${left}s left)")")
    say "== $name skipped: ${left}s left before QS_GPU_DEADLINE"
    return
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  say "== $name (at most ${limit}s)"
  timeout --kill-after=10 "$limit" bash -c '"$@"' stage "$@" 2>&1 | tee -a "$log"
  rc=${PIPESTATUS[0]}
  local line
  line=$(printf '%-8s %-7s %4ss' "$name" "$([ "$rc" = 0 ] && echo ok || echo "FAILED($rc)")" "$(($(date +%s) - t0))")
  summary+=("$line")
  say "-- $line"
}

PY=$(command -v python3)
BUILD=${QS_GPU_BUILD:-build/gpu}
PREFIX=$PWD/build/gpu-prefix
DEBS=${QS_DEBS:-build/gpu-debs}

deps() {  # the Debian packages into $PREFIX, paths rewritten to it
  rm -rf "$PREFIX" && mkdir -p "$PREFIX"
  for d in "$DEBS"/*.deb; do dpkg -x "$d" "$PREFIX"; done
  sed -i "s#\"/usr/#\"$PREFIX/usr/#g" "$PREFIX"/usr/share/cmake/Gloo/GlooTargets-*.cmake
  sed -i "s#^prefix=/usr#prefix=$PREFIX/usr#" "$PREFIX"/usr/lib/x86_64-linux-gnu/pkgconfig/*.pc
  # At run time only the libraries this machine lacks come from the packages (in
  # $PREFIX/missing): the machine's own (an rdma-core with its providers, libsodium) stay.
  mkdir -p "$PREFIX/missing"
  local f so lacking=()
  for f in "$PREFIX"/usr/lib/*.so.* "$PREFIX"/usr/lib/x86_64-linux-gnu/*.so.*; do
    so=$(basename "$f")
    [[ "$so" =~ \.so\.[0-9]+(\.[0-9]+)?$ ]] || continue
    if ! ldconfig -p | grep -q " $so "; then
      ln -sf "$f" "$PREFIX/missing/$so"
      lacking+=("$so")
    fi
  done
  echo "dependencies: $(ls "$DEBS"/*.deb | wc -l) packages unpacked into $PREFIX; at run time from them: ${lacking[*]:-none}"
}

build() {
  local extra=()
  if [ -d "$DEBS" ] && ls "$DEBS"/*.deb > /dev/null 2>&1; then
    deps || return 1
    export CMAKE_PREFIX_PATH="$PREFIX/usr" PKG_CONFIG_PATH="$PREFIX/usr/lib/x86_64-linux-gnu/pkgconfig"
    export CPATH="$PREFIX/usr/include" LIBRARY_PATH="$PREFIX/usr/lib:$PREFIX/usr/lib/x86_64-linux-gnu"
    export LD_LIBRARY_PATH="$PREFIX/missing${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"  # the linker's, for libgloo's own
    command -v pkg-config > /dev/null || extra+=(-DPKG_CONFIG_EXECUTABLE="$PREFIX/usr/bin/pkgconf")
  fi
  local pybind
  pybind=$("$PY" -c 'import pybind11; print(pybind11.get_cmake_dir())' 2> /dev/null) && extra+=(-Dpybind11_DIR="$pybind")
  local gen=()
  command -v ninja > /dev/null && gen=(-G Ninja)
  cmake -S . -B "$BUILD" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DQS_WITH_GLOO=ON -DQS_WITH_TORCH=ON \
    -DQS_BUILD_TESTS=OFF -DQS_BUILD_BENCH=OFF -DQS_HEADER_CHECK=OFF -DPython3_EXECUTABLE="$PY" \
    -DCMAKE_POLICY_VERSION_MINIMUM=3.5 "${extra[@]}" > "$BUILD.configure.log" 2>&1 \
    || { tail -30 "$BUILD.configure.log"; return 1; }
  cmake --build "$BUILD" -j "$(nproc)" --target quicksilver _quicksilver 2>&1 | tail -3
  [ "${PIPESTATUS[0]}" = 0 ] && "$BUILD/quicksilver" --version
}

# The build's environment for every later stage (the unpacked libraries, the package).
env_for_run() {
  [ -d "$PREFIX/missing" ] && export LD_LIBRARY_PATH="$PREFIX/missing${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export PYTHONPATH="$PWD/$BUILD/python${PYTHONPATH:+:$PYTHONPATH}"
  export OMP_NUM_THREADS=1 CUBLAS_WORKSPACE_CONFIG=:4096:8 PYTHONFAULTHANDLER=1
}

ranks() {  # ranks N ARGS...: bench/gpu_train.py on N ranks
  local n=$1 fix=()
  shift
  # Debian's torch 1.13 torchrun fails without --redirects/--tee on Python 3.11
  # (../shared/MACHINE-NOTES.md); pip's torch 2.x needs nothing.
  [ "$("$PY" -c 'import torch; print(torch.__version__.split(".")[0])' 2> /dev/null)" = 1 ] \
    && fix=(--redirects 2 --tee 2)
  "$PY" -m torch.distributed.run --standalone "${fix[@]}" --nproc_per_node "$n" bench/gpu_train.py "$@" 2>&1 \
    | grep -v '^\[W\|^W1\|warnings.warn\|UserWarning\|^  *warnings\|OMP_NUM_THREADS\|^\*\*\*\*'
  return "${PIPESTATUS[0]}"
}

profiles() {
  set -o pipefail  # a simulate that fails fails the stage, whatever grep says
  local out=$BUILD/profiles rc=0
  mkdir -p "$out"
  "$BUILD/quicksilver" profile --python "$PY" --model torchvision:resnet50 --input 3,224,224 --batch 32 \
    --classes 1000 --device cuda --out "$out/resnet50.json" || rc=1
  "$BUILD/quicksilver" profile --python "$PY" --model bench/torch_models.py:bert_base --input 128 --batch 32 \
    --classes 2 --device cuda --out "$out/bert_base.json" || rc=1
  for m in resnet50 bert_base; do
    [ -f "$out/$m.json" ] || continue
    [ -n "${OUT:-}" ] && cp "$out/$m.json" "$OUT/gpu-$m.json"
    for bw in 10Gbps 25Gbps; do
      echo "-- simulate $m (GPU profile) at $bw, 8 workers, 8 servers (ps):"
      "$BUILD/quicksilver" simulate --model "$out/$m.json" --policy all --workers 8 --servers 8 --bandwidth "$bw" \
        | grep -v '^  prophet: bandwidth monitor' || rc=1
      echo "-- simulate $m at $bw, 8 workers, all-reduce:"
      "$BUILD/quicksilver" simulate --model "$out/$m.json" --architecture allreduce --policy all --workers 8 \
        --bandwidth "$bw" | grep -v 'bandwidth monitor\|^  deft:' || rc=1
    done
  done
  return $rc
}

# Stage (e)'s ip, tc, ss and iperf3: the machine's own, or Debian 12's carried in $DEBS/net,
# unpacked into build/gpu-net and started through the system's loader with their libraries
# first (--library-path), so that those libraries reach nothing else. The emulated cluster
# finds them on PATH (it runs `ip`, `tc`, and `ip netns exec NS iperf3` / `ss` to calibrate).
bench_tools() {
  local missing=() b
  for b in ip tc ss iperf3; do  # QS_GPU_CARRIED_TOOLS=1: the carried ones even where the machine has its own
    [ -z "${QS_GPU_CARRIED_TOOLS:-}" ] && command -v "$b" > /dev/null || missing+=("$b")
  done
  [ ${#missing[@]} = 0 ] && { echo "tools: the machine's own ip, tc, ss, iperf3"; return 0; }
  ls "$DEBS"/net/*.deb > /dev/null 2>&1 || { echo "no ${missing[*]} here, and none carried in $DEBS/net (bash bench/gpu_check.sh --fetch)"; return 1; }
  local root=$PWD/build/gpu-net loader=/lib64/ld-linux-x86-64.so.2 real
  rm -rf "$root" && mkdir -p "$root/wrap"
  for b in "$DEBS"/net/*.deb; do dpkg -x "$b" "$root"; done
  local libs=$root/usr/lib/x86_64-linux-gnu:$root/lib/x86_64-linux-gnu
  for b in "${missing[@]}"; do
    real=$(ls "$root"/usr/bin/"$b" "$root"/sbin/"$b" "$root"/bin/"$b" 2> /dev/null | head -1)
    [ -n "$real" ] || { echo "$b: not in the carried packages"; return 1; }
    printf '#!/bin/sh\nexec %s --library-path %s %s "$@"\n' "$loader" "$libs" "$real" > "$root/wrap/$b"
    chmod +x "$root/wrap/$b"
  done
  export PATH="$root/wrap:$PATH"
  echo "tools: ${missing[*]} from Debian 12's packages ($(ip -V 2>&1 | head -1); $(iperf3 --version 2>&1 | head -1))"
}

cluster() {  # (e) ResNet-50 on the emulated cluster at N+N hosts, beside the simulator
  bench_tools || return 1
  local n rc=0 json
  for n in ${QS_GPU_HOSTS:-4 8}; do
    json=$BUILD/cluster-$n.json
    echo "-- run --netns: resnet50, $n workers + $n servers, 10 Gbps (scaled by the calibration)"
    "$BUILD/quicksilver" run --netns --json --model resnet50 --policy "${QS_GPU_CLUSTER_POLICIES:-wfbp,bytescheduler,mercury}" \
      --workers "$n" --servers "$n" --bandwidth 10Gbps --iterations "${QS_GPU_CLUSTER_ITERATIONS:-6}" --timeout 120s \
      --keep-going > "$json" 2> "$json.err" || rc=1
    grep -v '^  ' "$json.err" | tail -5
    [ -n "${OUT:-}" ] && cp "$json" "$OUT/cluster-$n.json"
    "$PY" bench/cluster_table.py "$json" || rc=1
  done
  return $rc
}

export PY BUILD PREFIX DEBS log
probe() {  # the module imports beside CUDA torch, and a small CUDA profile
  "$PY" -c 'import torch; torch.zeros(1, device="cuda"); import quicksilver.torch as q; print("import: ok,", q.__file__)' \
    && "$BUILD/quicksilver" profile --python "$PY" --model tests/python/models.py:DigitsCNN --input 1,8,8 --batch 8 \
      --iterations 3 --warmup 1 --device cuda --out "$BUILD/digits-cuda.json"
}

export -f say deps build ranks profiles probe bench_tools cluster
say "gpu_check: $(date -u +%FT%TZ), $(nproc) cores, $("$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU")' 2>&1 | tail -1)"
if [ -n "${QS_GPU_SKIP_BUILD:-}" ]; then  # a build already there (trying a stage on a CPU machine)
  summary+=("build    skipped (QS_GPU_SKIP_BUILD: $BUILD as it is)")
else
  stage build 200 build
fi
env_for_run
if [ "$mode" = cpu ]; then
  # Mixed precision (autocast + GradScaler) too where this torch has a CPU GradScaler (2.x).
  variants=mercury+wire-bf16
  "$PY" -c 'import torch; torch.amp.GradScaler' 2> /dev/null && variants+=,mgwfbp+amp
  stage a+b/2 300 ranks 2 --device cpu --size 32 --batch 4 --steps 2 --iterations 2 --warmup 1 \
    --policies mercury,mgwfbp,deft --variants "$variants" --speed-variants mercury+wire-bf16
else
  # QS_GPU_STAGES: the stages to run (default all, in this order); QS_GPU_POLICIES: theirs.
  want() { [ -z "${QS_GPU_STAGES:-}" ] || [[ ",$QS_GPU_STAGES," == *",$1,"* ]]; }
  pol=()
  [ -n "${QS_GPU_POLICIES:-}" ] && pol=(--policies "$QS_GPU_POLICIES")
  # policy="auto" (issue 30) switches to bytescheduler at step 3 of stage (a): on CUDA.
  export QS_AUTO_SCHEDULE=${QS_AUTO_SCHEDULE:-3:bytescheduler}
  want probe && stage probe 60 probe
  want a+b/2 && stage a+b/2 150 ranks 2 "${pol[@]}"
  want c && stage c 60 "$PY" bench/gpu_copy.py
  want e && stage e 200 cluster
  want a+b/4 && stage a+b/4 150 ranks 4 "${pol[@]}"
  want d && stage d 120 profiles
fi
say "== gpu_check summary ($(($(date +%s) - start)) s)"
failed=0
for l in "${summary[@]}"; do
  say "  $l"
  case "$l" in *FAILED*) failed=1 ;; esac
done
exit $failed
