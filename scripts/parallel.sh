#!/usr/bin/env bash
# Sourced by scripts/fuzz.sh and scripts/sanitize.sh. run_at_most JOBS FUNC ITEM...: runs
# `FUNC ITEM` for each item in the background, at most JOBS at a time, and waits for all.
# FUNC records its own status (each writes ITEM's .rc file), so the callers report in the
# items' order whatever order they end in.
run_at_most() {
  local jobs=$1 func=$2 item running=0
  shift 2
  for item in "$@"; do
    if [ $running -ge "$jobs" ]; then
      wait -n || true
      running=$((running - 1))
    fi
    "$func" "$item" &
    running=$((running + 1))
  done
  wait
}
