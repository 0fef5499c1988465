#!/usr/bin/env bash
# An evaluation across GPU hosts without a scheduler: starts one process per host over SSH
# with an explicit coordinator (the first host), waits for all. Every host needs this
# checkout at the same path with its environment installed, and WORKDIR on a shared
# filesystem.
#   launch/gpu/evaluate_hosts.sh HOSTS_FILE CONFIG WORKDIR [extra evaluate.py flags]
# HOSTS_FILE: one SSH host name per line; the first is process 0 and the coordinator.
# PORT (default 8476): the coordinator's port, reachable from every host. Needs bash >= 4.4.
set -euo pipefail
hosts_file=${1:?HOSTS_FILE}
config=${2:?CONFIG}
workdir=${3:?WORKDIR (shared by every host)}
shift 3
mapfile -t hosts < <(grep -v '^\s*$' "$hosts_file")
repo=$(cd "$(dirname "$0")/../.." && pwd)
first=${hosts[0]#*@}  # A 'user@host' line: the coordinator is the host.
coordinator="$first:${PORT:-8476}"
pids=()
for i in "${!hosts[@]}"; do
  # Every value reaches the remote shell quoted.
  remote="cd $(printf '%q' "$repo") && . .venv/bin/activate && python launch/evaluate.py"
  remote+=$(printf ' %q' --config "$config" --workdir "$workdir" --coordinator "$coordinator" \
    --num_processes "${#hosts[@]}" --process_id "$i" "$@")
  # shellcheck disable=SC2029  # Expanded here on purpose: the same values on every host.
  ssh "${hosts[$i]}" "$remote" > "evaluate_host$i.log" 2>&1 &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
echo "logs: evaluate_host*.log; report: $workdir/report/report.md"
exit $status
