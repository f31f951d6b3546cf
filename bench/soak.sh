#!/usr/bin/env bash
# Soak (issue 15, point 8; docs/reliability.md "Soak"): long runs on the emulated cluster
# (network namespaces, tc-shaped links; root) with the bandwidth changing every few
# seconds, for a parameter-server policy (mercury: 2 workers, 2 servers) and an all-reduce
# policy (deft on gloo: 2 workers). While each runs, every process of the job (servers,
# workers, the gloo rendezvous, the launcher) is sampled once a second: resident memory
# and open descriptors, into CSV files; at the end the launcher's --json gives every
# iteration's time (the slowest worker's) and each worker's count of iterations whose sums
# were checked exact. bench/soak_plot.py draws the samples and iteration times over time
# (docs/img/soak.png) and prints the figures (start and end RSS and descriptors per
# process; iteration time in the first and the last fifth of the run). Not a CI test.
#
#   bash bench/soak.sh [QUICKSILVER] [ITERATIONS] [OUT_DIR]
#     ITERATIONS per policy (default 4000: about 5-6 minutes each on this project's
#     2-core machine). Run it on an otherwise idle machine (uptime's load below 1.5).
#   POLICIES="mercury deft" narrows it down; PERIOD (default 3) is the seconds between
#   rate changes; RATES (default "1Gbps 300Mbps 600Mbps 150Mbps") the cycle of rates.
set -euo pipefail
qs=${1:-build/quicksilver}
iters=${2:-4000}
out=${3:-$(mktemp -d /tmp/qs-soak-XXXXXX)}
policies=${POLICIES:-mercury deft}
period=${PERIOD:-3}
read -r -a rates <<< "${RATES:-1Gbps 300Mbps 600Mbps 150Mbps}"
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
[ "$(id -u)" -eq 0 ] || { echo "soak.sh: needs root (network namespaces)" >&2; exit 2; }

# 6 layers, 2.6 MB of float32 gradients, ~20 ms of emulated compute per iteration.
cp "$(dirname "$0")/../tests/data/small.json" "$out/model.json"
# The rates in a cycle, one every PERIOD seconds, for two hours (the last one then holds).
: > "$out/trace.txt"
for ((i = 0; i < 7200 / period; i++)); do
  echo "$((i * period))s ${rates[$((i % ${#rates[@]}))]}" >> "$out/trace.txt"
done

# Samples every process of launcher $1's job once a second until it exits:
# t_s,process,pid,rss_kb,fds
sample() {
  local launcher=$1 csv=$2 t0
  t0=$(date +%s.%N)
  echo "t_s,process,pid,rss_kb,fds" > "$csv"
  while kill -0 "$launcher" 2> /dev/null; do
    local t
    t=$(echo "$(date +%s.%N) - $t0" | bc)
    for p in $launcher $(pgrep -P "$launcher" -f "(server|worker|coordinator) " 2> /dev/null); do
      local cmd rss fds name
      cmd=$(tr '\0' ' ' < "/proc/$p/cmdline" 2> /dev/null) || continue
      rss=$(awk '/^VmRSS/{print $2}' "/proc/$p/status" 2> /dev/null) || continue
      fds=$(ls "/proc/$p/fd" 2> /dev/null | wc -l)
      case "$cmd" in
        # The launcher's children: `quicksilver ROLE --job DIR/ROLE<id>.job.json`.
        *" server --job "*) name="server $(echo "$cmd" | sed 's/.*server\([0-9]*\)\.job\.json.*/\1/')" ;;
        *" worker --job "*) name="worker $(echo "$cmd" | sed 's/.*worker\([0-9]*\)\.job\.json.*/\1/')" ;;
        *" coordinator "*) name="coordinator" ;;
        *) name="launcher" ;;
      esac
      [ -n "$rss" ] && echo "$t,$name,$p,$rss,$fds" >> "$csv"
    done
    sleep 1
  done
}

for policy in $policies; do
  arch=(); workers=(--workers 2 --servers 2)
  [ "$policy" = mercury ] || arch=(--architecture allreduce)
  [ "$policy" = mercury ] || workers=(--workers 2)
  echo "== $policy: $iters iterations, rates ${rates[*]} every ${period}s (out: $out)"
  start=$(date +%s)
  "$qs" run --netns "${arch[@]}" --model "$out/model.json" --policy "$policy" "${workers[@]}" --bandwidth 1Gbps \
    --scale 1 --bandwidth-trace "$out/trace.txt" --iterations "$iters" --warmup 10 --statistic mean \
    --timeout 3600s --json > "$out/$policy.json" 2> "$out/$policy.err" &
  launcher=$!
  sample $launcher "$out/$policy.samples.csv"
  rc=0; wait $launcher || rc=$?
  echo "   exit $rc after $(( $(date +%s) - start )) s; $(tail -1 "$out/$policy.err")"
done
"$(QS_BUILD_DIR=${QS_BUILD_DIR:-$(dirname "$qs")} bash "$here/../scripts/python.sh" --no-torch)" "$here/soak_plot.py" "$out" "$period" ${policies}
