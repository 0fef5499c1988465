#!/usr/bin/env bash
# Deletes the TPU VM (billing stops; the bucket's results stay).
#   launch/tpu/delete.sh
# shellcheck source=launch/tpu/common.sh
source "$(dirname "$0")/common.sh"
gcloud compute tpus tpu-vm delete "$TPU_NAME" --zone "$TPU_ZONE" "${project_flag[@]}" --quiet
