#!/usr/bin/env bash
# Creates a Cloud TPU VM or pod slice.
#   launch/tpu/create.sh [ACCELERATOR_TYPE] [RUNTIME_VERSION] [--spot]
#   TPU_NAME=eval-8b TPU_ZONE=us-west4-a launch/tpu/create.sh v5litepod-16
# ACCELERATOR_TYPE: v5litepod-8 (one host, 8 v5e chips; the default), v5litepod-16 (two
# hosts), v4-16, v5p-16, ... RUNTIME_VERSION: the TPU software image
# (v2-alpha-tpuv5-lite for v5e, tpu-ubuntu2204-base for v4, v2-alpha-tpuv5 for v5p).
# --spot: preemptible capacity (a fraction of the price; the evaluation resumes when rerun).
# shellcheck source=launch/tpu/common.sh
source "$(dirname "$0")/common.sh"
accelerator=${1:-v5litepod-8}
version=${2:-v2-alpha-tpuv5-lite}
extra=("${@:3}")
gcloud compute tpus tpu-vm create "$TPU_NAME" --zone "$TPU_ZONE" "${project_flag[@]}" \
  --accelerator-type "$accelerator" --version "$version" "${extra[@]}"
