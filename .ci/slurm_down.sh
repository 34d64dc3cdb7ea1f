#!/usr/bin/env bash
# Stop the daemons .ci/slurm_up.sh started (by their pid files in RGB_SLURM_DIR) and remove that directory.
set -euo pipefail
dir="${RGB_SLURM_DIR:?RGB_SLURM_DIR is not set: nothing to stop}"
for pidfile in "$dir/slurmd.pid" "$dir/slurmctld.pid" "$dir/munge/munged.pid"; do
  [ -f "$pidfile" ] || continue
  pid="$(cat "$pidfile")"
  kill "$pid" 2>/dev/null || continue
  for _ in $(seq 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
  kill -9 "$pid" 2>/dev/null || true
done
rm -rf "$dir"
echo "slurm_down: stopped, removed $dir" >&2
