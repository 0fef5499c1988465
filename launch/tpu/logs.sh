#!/usr/bin/env bash
# Prints the log of a detached job (evaluate.sh, convert.sh) on one worker of the TPU VM.
#   launch/tpu/logs.sh [--dry_run] NAME [--worker N] [--follow] [--lines N]
# NAME: the job's name (the run name; convert-<basename of OUT>). --worker: 0 by default
# (process 0 writes the report); --follow: keep printing as it grows (Ctrl-C stops the
# printing, not the job); --lines: how many of the last lines (default 100).
# shellcheck source=launch/tpu/common.sh
source "$(dirname "$0")/common.sh"
take_flags "$@"
set -- "${ARGS[@]}"
name=${1:?NAME (the job: evaluate.sh run name or convert-<name>)}
shift
worker=0 follow='' lines=100
while (( $# )); do
  case $1 in
    --worker) worker=${2:?--worker N}; shift 2 ;;
    --follow) follow=' -F'; shift ;;
    --lines) lines=${2:?--lines N}; shift 2 ;;
    *) die "unexpected argument $1" ;;
  esac
done
check_name "$name"
[[ $worker =~ ^[0-9]+$ && $lines =~ ^[0-9]+$ ]] || die '--worker and --lines take numbers'
on_workers "$worker" "tail -n $lines$follow $REMOTE_LOGS/$name.log"
