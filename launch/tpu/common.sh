# shellcheck shell=bash
# Shared by the TPU scripts: the TPU VM's name and zone, how to run a command on its workers
# (hosts), a detached job's files, and --dry_run. Source it; bash >= 4.4. Environment:
#   TPU_NAME     the TPU VM or pod slice (default spec-jax)
#   TPU_ZONE     its zone (default us-central1-a)
#   TPU_PROJECT  the Google Cloud project (default: gcloud's configured one)
# --dry_run (any script, before a `--`): print each command it would run (`+ gcloud ...`;
# a script sent to the workers follows as a quoted here-document) and run none; nothing is
# asked of gcloud.
set -euo pipefail
TPU_NAME=${TPU_NAME:-spec-jax}
TPU_ZONE=${TPU_ZONE:-us-central1-a}
project_flag=()
if [[ -n "${TPU_PROJECT:-}" ]]; then project_flag=(--project "$TPU_PROJECT"); fi
DRY_RUN=0
# On every worker: the checkout with its venv, the detached jobs' files, the bucket mount
# ($HOME expanded there).
# shellcheck disable=SC2016
REMOTE_REPO='"$HOME"/spec_jax'
# shellcheck disable=SC2016
REMOTE_LOGS='"$HOME"/spec_jax_logs'
MOUNT=/mnt/spec_jax

# take_flags ARGS...: --dry_run taken out (before a `--`); the other arguments in ARGS.
take_flags() {
  ARGS=()
  local rest=0 a
  for a in "$@"; do
    if (( ! rest )) && [[ $a == --dry_run ]]; then DRY_RUN=1; continue; fi
    if [[ $a == -- ]]; then rest=1; fi
    ARGS+=("$a")
  done
}

die() { echo "$(basename "$0"): $*" >&2; exit 2; }

# run CMD...: runs CMD, or with --dry_run prints it: one line of shell-quoted words, a last
# argument of several lines (a workers' script) as a here-document.
run() {
  if (( ! DRY_RUN )); then "$@"; return; fi
  local words=("$@") last=${*: -1}
  if [[ $last == *$'\n'* ]]; then
    unset 'words[-1]'
    printf '+'; printf ' %q' "${words[@]}"
    # shellcheck disable=SC2016  # The here-document's text, printed as it is.
    printf ' "$(cat <<'\''REMOTE'\''\n%s\nREMOTE\n)"\n' "$last"
  else
    printf '+'; printf ' %q' "${words[@]}"; printf '\n'
  fi
}

# on_workers WORKERS SCRIPT: runs the bash SCRIPT on workers WORKERS ('all', 0, '0,1')
# of the slice at once (one SSH each), with this prelude.
on_workers() {
  local script
  # shellcheck disable=SC2016  # Expanded on the workers.
  script=$(printf '%s\n' 'set -euo pipefail' 'export PATH="$HOME/.local/bin:$PATH"' "$2")
  run gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone "$TPU_ZONE" "${project_flag[@]}" \
    --worker="$1" --command "$script"
}

# check_name NAME: a job name (a file name on the workers): letters, digits, . _ -.
check_name() {
  [[ $1 =~ ^[A-Za-z0-9._-]+$ ]] || die "job name '$1': use letters, digits, '.', '_', '-'"
}

# mount_bucket BUCKET: the workers' lines that mount gs://BUCKET at $MOUNT (gcsfuse) unless
# mounted. Metadata caching off (--metadata-cache-ttl-secs=0): every stat, open and
# listing asks Cloud Storage, so the file another host closed a moment ago (its results,
# fsynced and closed before the barrier) is what process 0 reads when it merges, never a
# cached older size or a listing without it.
mount_bucket() {
  local bucket
  bucket=$(printf '%q' "${1#gs://}")
  cat <<EOF
if ! mountpoint -q $MOUNT; then
  sudo mkdir -p $MOUNT && sudo chown "\$USER" $MOUNT
  gcsfuse --implicit-dirs --metadata-cache-ttl-secs=0 $bucket $MOUNT
fi
EOF
}

# detached NAME COMMAND: the workers' lines that start COMMAND (a shell command run in the
# checkout with its venv active) detached from the SSH session (setsid nohup), its output
# appended to $REMOTE_LOGS/NAME.log, its pid in NAME.pid and its exit status in NAME.rc
# when it ends: a dropped connection leaves it running (logs.sh, status.sh).
detached() {
  local job inner
  job="$REMOTE_LOGS/$1"
  inner="echo \$\$ > $job.pid; cd $REMOTE_REPO && . .venv/bin/activate && $2; echo \$? > $job.rc"
  # Single-quoted for the workers' shell (printf %q quotes with backslashes, never with
  # single quotes, so only a value the caller wrote with one needs %q here).
  if [[ $inner == *"'"* ]]; then inner=$(printf '%q' "$inner"); else inner="'$inner'"; fi
  cat <<EOF
mkdir -p $REMOTE_LOGS
if [[ -f $job.pid ]] && ! [[ -f $job.rc ]] && kill -0 "\$(cat $job.pid)" 2>/dev/null; then
  echo "\$(hostname): $1 is already running (pid \$(cat $job.pid))" >&2; exit 1
fi
rm -f $job.rc
# shellcheck disable=SC2016  # Expanded by the job's own shell.
setsid nohup bash -c $inner >> $job.log 2>&1 < /dev/null &
echo "\$(hostname): started $1 (launch/tpu/logs.sh $1, status.sh $1)"
EOF
}
