#!/usr/bin/env bash
# Says, on every worker of the TPU VM, whether a detached job (evaluate.sh, convert.sh) is
# running, finished (with its exit status) or gone without one (killed, or the VM was
# preempted), with the last line of its log.
#   launch/tpu/status.sh [--dry_run] NAME
# shellcheck source=launch/tpu/common.sh
source "$(dirname "$0")/common.sh"
take_flags "$@"
set -- "${ARGS[@]}"
name=${1:?NAME (the job: evaluate.sh run name or convert-<name>)}
(( $# == 1 )) || die "unexpected arguments: ${*:2}"
check_name "$name"
job="$REMOTE_LOGS/$name"
on_workers all "
if [[ -f $job.rc ]]; then state=\"finished, exit status \$(cat $job.rc)\"
elif [[ -f $job.pid ]] && kill -0 \"\$(cat $job.pid)\" 2>/dev/null; then
  state=\"running (pid \$(cat $job.pid))\"
elif [[ -f $job.pid ]]; then state='gone without an exit status (killed?)'
else state='never started here'; fi
echo \"\$(hostname): $name \$state\"
if [[ -f $job.log ]]; then tail -n 1 $job.log; fi"
