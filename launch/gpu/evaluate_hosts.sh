#!/usr/bin/env bash
# An evaluation across GPU hosts without a scheduler: starts one process per host over SSH
# with an explicit coordinator (the first host), detached from the SSH session (setsid
# nohup: a dropped connection does not end the run), and returns. Every host needs this
# checkout at the same path with its .venv installed (Python >= 3.11), and WORKDIR on a
# shared filesystem (what it needs: launch/gpu/evaluate.sbatch). Each host's output goes
# to WORKDIR/logs/host<i>.log (tail -F it from any machine that mounts WORKDIR), its pid
# and, when it ends, its exit status beside it; launch/gpu/status.sh says which run.
#   launch/gpu/evaluate_hosts.sh [--dry_run] HOSTS_FILE CONFIG WORKDIR [extra evaluate.py flags]
# HOSTS_FILE: one SSH host name per line; the first is process 0 and the coordinator.
# PORT (default 8476): the coordinator's port, reachable from every host. Needs bash >= 4.4.
# --dry_run: print the ssh commands (each host's script as a here-document), run none.
set -euo pipefail
dry_run=0
if [[ ${1:-} == --dry_run ]]; then dry_run=1; shift; fi
hosts_file=${1:?HOSTS_FILE}
config=${2:?CONFIG}
workdir=${3:?WORKDIR (shared by every host)}
shift 3
mapfile -t hosts < <(grep -v '^\s*$' "$hosts_file")
# single_quoted S: S quoted for a shell, in single quotes unless it holds one (printf %q
# quotes with backslashes).
single_quoted() {
  if [[ $1 == *"'"* ]]; then printf '%q' "$1"; else printf "'%s'" "$1"; fi
}
repo=$(cd "$(dirname "$0")/../.." && pwd)
first=${hosts[0]#*@}  # A 'user@host' line: the coordinator is the host.
coordinator="$first:${PORT:-8476}"
logs="$workdir/logs"
for i in "${!hosts[@]}"; do
  # Every value reaches the remote shell quoted.
  job=$(printf '%q' "$logs/host$i")
  py_command="python launch/evaluate.py$(printf ' %q' --config "$config" --workdir "$workdir" \
    --coordinator "$coordinator" --num_processes "${#hosts[@]}" --process_id "$i" "$@")"
  inner="echo \$\$ > $job.pid; cd $(printf '%q' "$repo") && . .venv/bin/activate && $py_command"
  inner+="; echo \$? > $job.rc"
  remote="set -euo pipefail
mkdir -p $(printf '%q' "$logs")
rm -f $job.rc
setsid nohup bash -c $(single_quoted "$inner") >> $job.log 2>&1 < /dev/null &
echo \"\$(hostname): process $i started, log $job.log\""
  if (( dry_run )); then
    # shellcheck disable=SC2016  # The here-document's text, printed as it is.
    printf '+ ssh %q "$(cat <<'\''REMOTE'\''\n%s\nREMOTE\n)"\n' "${hosts[$i]}" "$remote"
  else
    # shellcheck disable=SC2029  # Expanded here on purpose: the same values on every host.
    ssh "${hosts[$i]}" "$remote"
  fi
done
echo "logs: $logs/host<i>.log; state: launch/gpu/status.sh $hosts_file $workdir;" \
  "report (when done): $workdir/report/report.md"
