#!/usr/bin/env bash
# What strangers can make a parameter server hold (issue 15, point 2; docs/reliability.md):
# resident memory and open descriptors of one `quicksilver server` before, after N garbage
# connections (each sends 100 bytes that are neither a frame nor an authentication, then
# waits for the close), while
# N idle connections are held open, and after they are closed. Not a CI test (it takes a
# while for large N); the bounds themselves are tested by tests/runtime_cluster_test.cc.
#
#   bash bench/reliability.sh [QUICKSILVER_BINARY] [N]
#
# A binary without --secret-file (before issue 15) runs unauthenticated; otherwise the
# server gets a fresh secret, which the strangers do not know.
set -euo pipefail
qs=${1:-build/quicksilver}
n=${2:-2000}
tmp=$(mktemp -d)
trap 'kill $server 2> /dev/null || true; rm -rf "$tmp"' EXIT

cat > "$tmp/tiny.json" << 'EOF'
{"name": "tiny", "batch_size": 1, "layers": [
  {"name": "l1", "forward_ms": 1, "backward_ms": 1, "tensors": [{"name": "w", "elements": 1024}]}]}
EOF
auth=()
if "$qs" server --help | grep -q -- --secret-file; then
  head -c 32 /dev/urandom > "$tmp/secret"
  auth=(--secret-file "$tmp/secret")
fi
"$qs" server --server-id 0 --listen 127.0.0.1:0 --model "$tmp/tiny.json" --policy mercury --workers 2 --servers 1 \
  --connect-timeout 600s "${auth[@]}" > "$tmp/out" 2> "$tmp/err" &
server=$!
for _ in $(seq 100); do grep -q listening "$tmp/out" && break; sleep 0.05; done
port=$(awk '/listening/{print $2}' "$tmp/out" | cut -d: -f2)

sample() {
  local rss fds
  rss=$(awk '/VmRSS/{print $2}' "/proc/$server/status")
  fds=$(ls "/proc/$server/fd" | wc -l)
  printf '%-40s RSS %7.1f MB  descriptors %5d\n' "$1" "$(echo "$rss / 1024" | bc -l)" "$fds"
}

echo "server: $qs (${auth[*]:-no authentication}), port $port, N = $n"
sample "started"
python3 - "$port" "$n" garbage << 'EOF'
import socket, sys
port, n = int(sys.argv[1]), int(sys.argv[2])
for _ in range(n):
    try:
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"\x51" * 100)
        s.settimeout(10)
        while s.recv(4096):
            pass
    except OSError:
        pass
    s.close()
EOF
sleep 0.5
sample "after $n garbage connections"
python3 - "$port" "$n" "$server" << 'EOF' &
import socket, sys, time
port, n = int(sys.argv[1]), int(sys.argv[2])
held = []
for _ in range(n):
    try:
        held.append(socket.create_connection(("127.0.0.1", port)))
    except OSError as e:
        print("connect failed after", len(held), ":", e)
        break
open("/dev/shm/qs-reliability-%s" % sys.argv[3], "w").close()
time.sleep(3)
EOF
idle=$!
for _ in $(seq 200); do [ -e "/dev/shm/qs-reliability-$server" ] && break; sleep 0.05; done
sleep 0.5
sample "while $n idle connections are open"
wait $idle || true
rm -f "/dev/shm/qs-reliability-$server"
sleep 0.5
sample "after they closed"
if kill -0 $server 2> /dev/null; then echo "server still running"; else echo "server exited: $(tail -1 "$tmp/err")"; fi
grep -c "refused" "$tmp/err" | sed 's/^/refused-peer log lines: /' || true

# Statistics that grew with the run: one job of `iters` iterations (64 packets per worker
# per iteration); the server's resident memory sampled as it runs (the peak, and after the
# first tenth of the run).
iters=${3:-3000}
kill $server 2> /dev/null || true
wait $server 2> /dev/null || true
cat > "$tmp/packets.json" << 'EOF2'
{"name": "packets", "batch_size": 1, "layers": [
  {"name": "l1", "forward_ms": 0.2, "backward_ms": 0.2, "tensors": [{"name": "w", "elements": 65536}]}]}
EOF2
job=(--model "$tmp/packets.json" --policy mercury --packet-size 4KiB --workers 2 --servers 1 --iterations "$iters"
     "${auth[@]}")
"$qs" server --server-id 0 --listen 127.0.0.1:0 "${job[@]}" > "$tmp/out" 2> "$tmp/err" &
server=$!
for _ in $(seq 100); do grep -q listening "$tmp/out" && break; sleep 0.05; done
addr=$(awk '/listening/{print $2}' "$tmp/out")
start=$(date +%s.%N)
"$qs" worker --worker-id 0 --connect "$addr" "${job[@]}" > /dev/null 2> "$tmp/w0" &
w0=$!
"$qs" worker --worker-id 1 --connect "$addr" "${job[@]}" > /dev/null 2> "$tmp/w1" &
w1=$!
peak=0
early=0
while kill -0 $server 2> /dev/null; do
  rss=$(awk '/VmRSS/{print $2}' "/proc/$server/status" 2> /dev/null || echo 0)
  [ "${rss:-0}" -gt "$peak" ] && peak=$rss
  [ "$early" -eq 0 ] && [ "$(echo "$(date +%s.%N) - $start > 2" | bc)" -eq 1 ] && early=$rss
  sleep 0.1
done
wait $w0 && wait $w1 && echo "$iters iterations, sums exact" || echo "the job failed: $(tail -1 "$tmp/w0")"
printf 'server RSS after 2 s %.1f MB, peak %.1f MB over %d iterations (%.1f s)\n' "$(echo "$early / 1024" | bc -l)" \
  "$(echo "$peak / 1024" | bc -l)" "$iters" "$(echo "$(date +%s.%N) - $start" | bc)"
