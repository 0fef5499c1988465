#!/usr/bin/env bash
# Says, for each host of a run started by evaluate_hosts.sh, whether its process is running,
# finished (with its exit status) or gone without one, with the last line of its log.
#   launch/gpu/status.sh [--dry_run] HOSTS_FILE WORKDIR
set -euo pipefail
dry_run=0
if [[ ${1:-} == --dry_run ]]; then dry_run=1; shift; fi
hosts_file=${1:?HOSTS_FILE}
workdir=${2:?WORKDIR}
mapfile -t hosts < <(grep -v '^\s*$' "$hosts_file")
for i in "${!hosts[@]}"; do
  job=$(printf '%q' "$workdir/logs/host$i")
  remote="if [[ -f $job.rc ]]; then state=\"finished, exit status \$(cat $job.rc)\"
elif [[ -f $job.pid ]] && kill -0 \"\$(cat $job.pid)\" 2>/dev/null; then
  state=\"running (pid \$(cat $job.pid))\"
elif [[ -f $job.pid ]]; then state='gone without an exit status (killed?)'
else state='never started'; fi
echo \"\$(hostname): process $i \$state\"
if [[ -f $job.log ]]; then tail -n 1 $job.log; fi"
  if (( dry_run )); then
    # shellcheck disable=SC2016  # The here-document's text, printed as it is.
    printf '+ ssh %q "$(cat <<'\''REMOTE'\''\n%s\nREMOTE\n)"\n' "${hosts[$i]}" "$remote"
  else
    # shellcheck disable=SC2029  # Expanded here on purpose.
    ssh "${hosts[$i]}" "$remote" || echo "${hosts[$i]}: unreachable"
  fi
done
