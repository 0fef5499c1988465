#!/usr/bin/env bash
# Creates a Cloud TPU VM or pod slice, with a data disk if asked.
#   launch/tpu/create.sh [--dry_run] [ACCELERATOR_TYPE] [RUNTIME_VERSION] [--disk_size GB]
#       [--disk_type TYPE] [other gcloud tpu-vm create flags: --spot, ...]
#   TPU_NAME=eval-8b TPU_ZONE=us-west4-a launch/tpu/create.sh v5litepod-8 --disk_size 500
# ACCELERATOR_TYPE: v5litepod-8 (one host, 8 v5e chips; the default), v5litepod-16 (two
# hosts), v4-16, v5p-16, v6e-8, ... RUNTIME_VERSION: the TPU software image
# (v2-alpha-tpuv5-lite for v5e, tpu-ubuntu2204-base for v4, v2-alpha-tpuv5 for v5p,
# v2-alpha-tpuv6e for v6e). --spot: preemptible capacity (a fraction of the price; the
# evaluation resumes when rerun).
# --disk_size GB: a data disk of that size ($TPU_NAME-data; pd-balanced, hyperdisk-balanced
# on v6e, or --disk_type) is created, attached read-write and mounted at /mnt/data
# (formatted ext4 when blank) for hub downloads and checkpoints beyond the 100 GB boot
# disk. A read-write disk attaches to one TPU VM only: on a pod slice (several hosts) put
# the checkpoint in the bucket instead (convert.sh writes a gs:// orbax checkpoint that
# every host reads its shards of).
# shellcheck source=launch/tpu/common.sh
source "$(dirname "$0")/common.sh"
take_flags "$@"
set -- "${ARGS[@]}"
positional=() extra=() disk_size='' disk_type=''
while (( $# )); do
  case $1 in
    --disk_size) disk_size=${2:?--disk_size GB}; shift 2 ;;
    --disk_type) disk_type=${2:?--disk_type TYPE}; shift 2 ;;
    -*) extra+=("$1"); shift ;;
    *) if (( ${#positional[@]} < 2 )); then positional+=("$1"); else extra+=("$1"); fi; shift ;;
  esac
done
accelerator=${positional[0]:-v5litepod-8}
version=${positional[1]:-v2-alpha-tpuv5-lite}
disk_flag=()
if [[ -n $disk_size ]]; then
  [[ $disk_size =~ ^[0-9]+$ ]] || die "--disk_size $disk_size: a size in GB"
  if [[ -z $disk_type ]]; then
    case $accelerator in
      v6e*|tpu7x*) disk_type=hyperdisk-balanced ;;  # v6e takes no Persistent Disk.
      *) disk_type=pd-balanced ;;
    esac
  fi
  project=${TPU_PROJECT:-}
  if [[ -z $project ]]; then
    if (( DRY_RUN )); then
      run gcloud config get-value project
      project=PROJECT
    else
      project=$(gcloud config get-value project)
    fi
  fi
  disk="$TPU_NAME-data"
  run gcloud compute disks create "$disk" --zone "$TPU_ZONE" "${project_flag[@]}" \
    --size "${disk_size}GB" --type "$disk_type"
  disk_flag=(--data-disk "source=projects/$project/zones/$TPU_ZONE/disks/$disk,mode=read-write")
fi
run gcloud compute tpus tpu-vm create "$TPU_NAME" --zone "$TPU_ZONE" "${project_flag[@]}" \
  --accelerator-type "$accelerator" --version "$version" "${disk_flag[@]}" "${extra[@]}"
if [[ -n $disk_size ]]; then
  # The first data disk of a TPU VM; SPEC_JAX_DATA_DEVICE on the worker overrides it.
  # shellcheck disable=SC2016  # Expanded on the workers.
  on_workers all '
dev=${SPEC_JAX_DATA_DEVICE:-/dev/disk/by-id/google-persistent-disk-1}
if [[ ! -e $dev ]]; then echo "no data disk at $dev (set SPEC_JAX_DATA_DEVICE):"; lsblk; exit 1; fi
if ! sudo blkid "$dev" >/dev/null; then
  sudo mkfs.ext4 -m 0 -E lazy_itable_init=0,lazy_journal_init=0,discard "$dev"
fi
sudo mkdir -p /mnt/data
mountpoint -q /mnt/data || sudo mount -o discard,defaults "$dev" /mnt/data
sudo chown "$USER" /mnt/data
df -h /mnt/data'
fi
