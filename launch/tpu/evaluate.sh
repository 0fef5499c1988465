#!/usr/bin/env bash
# Starts an evaluation on every host of the TPU VM, detached: one process per host, JAX's
# own cluster detection joins them (--coordinator auto), each decodes its share of the
# samples on its chips and process 0 merges the results and writes the report, all under
# the output bucket (mounted with gcsfuse on every host at /mnt/spec_jax, metadata caching
# off: common.sh, mount_bucket). The script returns once every host has started; the run
# goes on without the SSH sessions (a dropped connection does not end it).
#   launch/tpu/evaluate.sh [--dry_run] CONFIG BUCKET [RUN_NAME] [-- extra evaluate.py flags]
#   (RUN_NAME defaults to the config's name: configs/experiments/x.py:v5e -> x_v5e)
#   launch/tpu/evaluate.sh configs/experiments/llama31_8b_eagle3.py gs://my-bucket llama8b \
#       -- --config.dtype=bfloat16 --config.mesh.model=-1
#   launch/tpu/logs.sh llama8b        # worker 0's log (--follow to keep reading)
#   launch/tpu/status.sh llama8b      # running / exit status on every worker
# A target checkpoint in the bucket is read straight from gs:// (an orbax directory written
# by convert.sh: --config.model=gs://my-bucket/ckpt/llama8b). Rerun the same command after
# a preemption or a lost host: finished samples are skipped.
# shellcheck source=launch/tpu/common.sh
source "$(dirname "$0")/common.sh"
take_flags "$@"
set -- "${ARGS[@]}"
config=${1:?CONFIG (a configs/ file, relative to the repository)}
bucket=${2:?BUCKET (gs://name)}
[[ $bucket == gs://* && $bucket != gs://*/* ]] || die "BUCKET $bucket: gs://name (no path)"
shift 2
# The default run name: the config file's name, then its argument ('x.py:a/b' -> x_a_b).
run=$(basename "${config%%:*}" .py)
if [[ $config == *:* ]]; then arg=${config#*:}; run+=_${arg//[^A-Za-z0-9._-]/_}; fi
if (( $# )) && [[ "$1" != "--" ]]; then run=$1; shift; fi
if (( $# )) && [[ "$1" == "--" ]]; then shift; fi
check_name "$run"
# Every value reaches the workers' shell quoted.
job_command="python launch/evaluate.py$(printf ' %q' --config "$config" \
  --workdir "$MOUNT/runs/$run" --coordinator auto "$@")"
on_workers all "$(mount_bucket "$bucket")
$(detached "$run" "$job_command")"
echo "report (when done): $bucket/runs/$run/report/report.md"
echo "log: launch/tpu/logs.sh $run [--follow]; state: launch/tpu/status.sh $run"
