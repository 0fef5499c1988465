#!/usr/bin/env bash
# Runs an evaluation on every host of the TPU VM: one process per host, JAX's own cluster
# detection joins them (--coordinator auto), each decodes its share of the samples on its
# chips and process 0 merges the results and writes the report, all under the output
# bucket (mounted with gcsfuse on every host at /mnt/spec_jax).
#   launch/tpu/evaluate.sh CONFIG BUCKET [RUN_NAME] [-- extra evaluate.py flags]
#   launch/tpu/evaluate.sh configs/experiments/llama31_8b_eagle3.py gs://my-bucket llama8b \
#       -- --config.dtype=bfloat16 --config.mesh.model=-1
# Rerun the same command after a preemption or a lost host: finished samples are skipped.
# shellcheck source=launch/tpu/common.sh
source "$(dirname "$0")/common.sh"
config=${1:?CONFIG (a configs/ file, relative to the repository)}
bucket=${2:?BUCKET (gs://name)}
shift 2
run=$(basename "${config%.py}")
if (( $# )) && [[ "$1" != "--" ]]; then run=$1; shift; fi
if (( $# )) && [[ "$1" == "--" ]]; then shift; fi
# Every value reaches the workers' shell quoted.
args=$(printf ' %q' --config "$config" --workdir "/mnt/spec_jax/runs/$run" \
  --coordinator auto "$@")
log=$(printf '%q' "evaluate_$run.log")
on_all_workers "
  set -eo pipefail
  if ! mountpoint -q /mnt/spec_jax; then
    sudo mkdir -p /mnt/spec_jax && sudo chown \$USER /mnt/spec_jax
    gcsfuse --implicit-dirs $(printf '%q' "${bucket#gs://}") /mnt/spec_jax
  fi
  cd spec_jax && . .venv/bin/activate
  python launch/evaluate.py $args 2>&1 | tee -a ~/$log
"
echo "report: $bucket/runs/$run/report/report.md"
