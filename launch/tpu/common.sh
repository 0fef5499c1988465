# shellcheck shell=bash
# Shared by the TPU scripts: the TPU VM's name and zone, and how to run a command on every
# worker (host) of it. Source it; override any of these in the environment. bash >= 4.4.
#   TPU_NAME     the TPU VM or pod slice (default spec-jax)
#   TPU_ZONE     its zone (default us-central1-a)
#   TPU_PROJECT  the Google Cloud project (default: gcloud's configured one)
set -euo pipefail
TPU_NAME=${TPU_NAME:-spec-jax}
TPU_ZONE=${TPU_ZONE:-us-central1-a}
project_flag=()
if [[ -n "${TPU_PROJECT:-}" ]]; then project_flag=(--project "$TPU_PROJECT"); fi

# on_all_workers CMD: runs CMD on every host of the slice at once (one SSH per host).
on_all_workers() {
  gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone "$TPU_ZONE" "${project_flag[@]}" \
    --worker=all --command "$1"
}
