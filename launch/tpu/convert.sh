#!/usr/bin/env bash
# Converts a checkpoint into an orbax one in the bucket, detached, on every host of the TPU
# VM together: one mesh over all their chips (--mesh_hosts all), each host reading only the
# regions of each tensor its chips keep and writing its own shards (launch/convert.py,
# checkpoints.convert_to_orbax). Evaluations then read it from gs:// (--config.model=OUT).
#   launch/tpu/convert.sh [--dry_run] SOURCE OUT [-- extra convert.py flags]
#   launch/tpu/convert.sh Qwen/Qwen2.5-72B-Instruct gs://my-bucket/ckpt/qwen72b \
#       -- --dtype bfloat16
#   launch/tpu/convert.sh /mnt/spec_jax/hf/Qwen2.5-72B-Instruct gs://my-bucket/ckpt/qwen72b
# SOURCE: a hub id (downloaded on every host, into /mnt/data/hf when create.sh mounted a
# data disk there), a path on the worker (/mnt/data/...), or an HF directory staged in the
# bucket, seen at /mnt/spec_jax/... (the bucket of OUT is mounted: each host then fetches
# only its regions' bytes). OUT: gs://bucket/path (absent or empty).
#   launch/tpu/logs.sh convert-qwen72b; launch/tpu/status.sh convert-qwen72b
# shellcheck source=launch/tpu/common.sh
source "$(dirname "$0")/common.sh"
take_flags "$@"
set -- "${ARGS[@]}"
source_spec=${1:?SOURCE (hub id, worker path, or /mnt/spec_jax/... in the bucket)}
out=${2:?OUT (gs://bucket/path)}
[[ $out == gs://*/* ]] || die "OUT $out: gs://bucket/path"
shift 2
if (( $# )) && [[ "$1" == "--" ]]; then shift; fi
name="convert-$(basename "$out")"
check_name "$name"
bucket=${out#gs://}
bucket=gs://${bucket%%/*}
job_command="python launch/convert.py$(printf ' %q' --source "$source_spec" --out "$out" \
  --mesh_model -1 --mesh_hosts all --coordinator auto "$@")"
# shellcheck disable=SC2016  # Expanded on the workers.
hf_home='if [[ -d /mnt/data ]]; then export HF_HOME=/mnt/data/hf; fi'
on_workers all "$(mount_bucket "$bucket")
$hf_home
$(detached "$name" "$job_command")"
echo "log: launch/tpu/logs.sh $name [--follow]; state: launch/tpu/status.sh $name"
