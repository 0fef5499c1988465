#!/usr/bin/env bash
# Deletes the TPU VM (billing stops; the bucket's results stay), and with --disk its data
# disk ($TPU_NAME-data, made by create.sh --disk_size) too.
#   launch/tpu/delete.sh [--dry_run] [--disk]
# shellcheck source=launch/tpu/common.sh
source "$(dirname "$0")/common.sh"
take_flags "$@"
disk=0
for a in "${ARGS[@]}"; do
  case $a in
    --disk) disk=1 ;;
    *) die "unexpected argument $a" ;;
  esac
done
run gcloud compute tpus tpu-vm delete "$TPU_NAME" --zone "$TPU_ZONE" "${project_flag[@]}" --quiet
if (( disk )); then
  run gcloud compute disks delete "$TPU_NAME-data" --zone "$TPU_ZONE" "${project_flag[@]}" --quiet
fi
