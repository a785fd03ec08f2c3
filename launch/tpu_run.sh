#!/usr/bin/env bash
# Runs an st5_jax training job described by a gin file, here or on a Cloud TPU VM slice.
#
# Local (this machine's backend: CPU, GPU, or a single TPU VM):
#   launch/tpu_run.sh --gin st5_tiny_cpu.gin [--workdir DIR] [--gin.KEY=VALUE ...]
#   launch/tpu_run.sh --gin st5_base_enc.gin --gin targets/v5p_16.gin ...   (files combine, in order)
#
# TPU pod slice (every worker runs the same trainer; JAX discovers the other hosts):
#   launch/tpu_run.sh --gin st5_11b_encdec.gin --tpu NAME --zone ZONE \
#       [--project PROJECT] [--accelerator v4-256] [--version tpu-ubuntu2204-base] \
#       [--create] [--spot] [--workdir gs://BUCKET/DIR] [--env NAME ...] [--dry-run] [--gin.KEY=VALUE ...]
#       [--takeover] [--allow_config_change] [--lease_expiry_s S] [--lease_renew_s S]   (st5 train's, to every worker)
#
# Pod rehearsal on this machine: the workers' command, as N local JAX processes on CPU
# (ST5_LOCAL_POD_DEVICES fake devices each, default 4), joined like the hosts of a slice:
#   launch/tpu_run.sh --gin FILE.gin --local-pod 2 --workdir gs://BUCKET/DIR [--env NAME ...] [--gin.KEY=VALUE ...]
# (with STORAGE_EMULATOR_HOST=http://127.0.0.1:PORT, gs:// is a local GCS emulator; docs/tpu.md)
#
# The workers' environment (slice and rehearsal alike; docs/tpu.md, "What reaches the
# workers"): a fresh login's, plus every exported ST5_* variable, TFDS_DATA_DIR, and each
# variable named by --env NAME (repeatable). Nothing else of this shell reaches them.
#
# --gin NAME is looked up as a path, then in gin/; repeat it to combine files (a run and a target:
# later files override earlier ones, as `st5 train --gin_file A --gin_file B`). Each --gin.KEY=VALUE (or
# --gin.KEY VALUE) is passed to `st5 train` unchanged: on the TPU workers every
# argument is quoted with printf %q, so values with spaces or quotes arrive intact
# and nothing in them is evaluated by a shell. --dry-run prints the exact commands.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
GINS=() WORKDIR="" TPU="" ZONE="" PROJECT="" ACCEL="" VERSION="tpu-ubuntu2204-base"
CREATE=0 SPOT=0 DRY=0 LOCAL_POD=0
OVERRIDES=()
TRAIN_FLAGS=()
EXTRA_ENV=()

usage() { sed -n '2,27p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }
need() { [ "$#" -ge 2 ] && [ -n "$2" ] || { echo "tpu_run.sh: $1 needs a value" >&2; exit 2; }; }

while [ "$#" -gt 0 ]; do
  case "$1" in
    --gin) need "$@"; GINS+=("$2"); shift 2 ;;
    --gin=*) GINS+=("${1#--gin=}"); shift ;;
    --workdir) need "$@"; WORKDIR="$2"; shift 2 ;;
    --tpu) need "$@"; TPU="$2"; shift 2 ;;
    --zone) need "$@"; ZONE="$2"; shift 2 ;;
    --project) need "$@"; PROJECT="$2"; shift 2 ;;
    --accelerator) need "$@"; ACCEL="$2"; shift 2 ;;
    --version) need "$@"; VERSION="$2"; shift 2 ;;
    --create) CREATE=1; shift ;;
    --spot) SPOT=1; shift ;;
    --dry-run) DRY=1; shift ;;
    --local-pod) need "$@"; LOCAL_POD="$2"; shift 2 ;;
    --env) need "$@"; EXTRA_ENV+=("$2"); shift 2 ;;
    --env=*) EXTRA_ENV+=("${1#--env=}"); shift ;;
    # st5 train's own flags for a held or changed work dir (the refusals name them), passed to every worker.
    --takeover|--allow_config_change) TRAIN_FLAGS+=("$1"); shift ;;
    --lease_expiry_s|--lease_renew_s) need "$@"; TRAIN_FLAGS+=("$1" "$2"); shift 2 ;;
    --gin.*=*) OVERRIDES+=("$1"); shift ;;
    --gin.*) need "$@"; OVERRIDES+=("$1=$2"); shift 2 ;;
    -h|--help) usage 0 ;;
    *) echo "tpu_run.sh: unknown argument: $1" >&2; usage 2 ;;
  esac
done
[ "${#GINS[@]}" -gt 0 ] || { echo "tpu_run.sh: --gin NAME.gin is required" >&2; usage 2; }

GIN_PATHS=()  # absolute paths, in the order given
RUN_NAME=""   # the files' names joined by '+': st5_base_enc+v5p_16
for GIN in "${GINS[@]}"; do
  if [ -f "$GIN" ]; then
    GIN_PATH="$(cd "$(dirname "$GIN")" && pwd)/$(basename "$GIN")"
  elif [ -f "$ROOT/gin/$GIN" ]; then
    GIN_PATH="$ROOT/gin/$GIN"
  else
    echo "tpu_run.sh: gin file '$GIN' not found (as a path or in $ROOT/gin/)" >&2; exit 2
  fi
  GIN_PATHS+=("$GIN_PATH")
  RUN_NAME="${RUN_NAME:+$RUN_NAME+}$(basename "$GIN_PATH" .gin)"
done

# ------------------------------------------------- what reaches the workers
# A slice's worker runs the trainer from a fresh ssh login: nothing of this shell reaches it
# unless the command carries it. The launcher carries, as NAME=VALUE words of the command:
#   - every exported ST5_* variable: the project's own settings (ST5_DATA_DIR, ST5_VOCAB,
#     ST5_USER_*, ST5_DATA_*, ...), which docs/tpu.md tells users to set; none is a secret;
#   - TFDS_DATA_DIR: the one other variable the trainer reads for where its data is;
#   - each --env NAME, a choice the user makes by name.
# Nothing else, on purpose: JAX_PLATFORMS=cpu (launch/setup_env.sh exports it on a machine
# without an accelerator) would put the slice on its CPUs, STORAGE_EMULATOR_HOST names a
# server on this machine, and the workers authenticate as the TPU VM's service account,
# not with this machine's credentials. Collected here, before launch/setup_env.sh is
# sourced (it exports defaults of its own, e.g. a local ST5_DATA_DIR, the slice never sees).
FORWARD_NAMES=()
for name in $(compgen -e | LC_ALL=C sort); do
  case "$name" in ST5_*|TFDS_DATA_DIR) FORWARD_NAMES+=("$name") ;; esac
done
for name in "${EXTRA_ENV[@]}"; do
  [[ "$name" =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || { echo "tpu_run.sh: --env needs a variable name, not '$name'" >&2; exit 2; }
  [ -n "${!name+x}" ] || { echo "tpu_run.sh: --env $name: $name is not set in this shell" >&2; exit 2; }
  [[ " ${FORWARD_NAMES[*]} " == *" $name "* ]] || FORWARD_NAMES+=("$name")
done
FORWARD=()  # NAME=VALUE words, values byte for byte as this shell has them
for name in "${FORWARD_NAMES[@]}"; do FORWARD+=("$name=${!name}"); done
forwarded_note() { echo "[tpu_run] environment forwarded to the workers: ${FORWARD_NAMES[*]:-(none)}" >&2; }

# Prints one command line, each argument shell-quoted (copy-pastable, nothing expanded).
show() { local out="" a; for a in "$@"; do out+="$(printf '%q' "$a") "; done; echo "${out% }"; }
# Runs a command, or prints it with --dry-run.
run() { if [ "$DRY" = 1 ]; then show "$@"; else "$@"; fi; }

# What every TPU worker runs (after `cd` into the shipped tree), and what --local-pod runs.
worker_args() {  # $@: the gin files as the worker sees them
  local gin_flags=() f
  for f in "$@"; do gin_flags+=(--gin_file "$f"); done
  printf '%s\0' train "${gin_flags[@]}" --workdir "$WORKDIR" --no_progress "${TRAIN_FLAGS[@]}" "${OVERRIDES[@]}"
}

if [ "$LOCAL_POD" != 0 ]; then
  # ------------------------------------------------------ local pod rehearsal
  case "$LOCAL_POD" in ''|*[!0-9]*) echo "tpu_run.sh: --local-pod needs a process count" >&2; exit 2 ;; esac
  [ -n "$TPU" ] && { echo "tpu_run.sh: --local-pod and --tpu exclude each other" >&2; exit 2; }
  [ -n "$WORKDIR" ] || { echo "tpu_run.sh: --local-pod needs --workdir (shared by all processes, e.g. gs://BUCKET/DIR)" >&2; exit 2; }
  mapfile -d '' ARGS < <(worker_args "${GIN_PATHS[@]}")
  PORT="${ST5_LOCAL_POD_PORT:-$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')}"
  DEVICES="${ST5_LOCAL_POD_DEVICES:-4}"
  # Each worker starts from an empty environment (`env -i`), built as a slice worker's is: what
  # a fresh login has, then exactly what the launcher forwards, then what only the rehearsal
  # needs. A variable the launcher does not forward is missing here as it is on the slice.
  LOGIN_HOME=~
  LOGIN=(PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "HOME=$LOGIN_HOME" LANG=C.UTF-8)
  # XLA flags only if forwarded (--env XLA_FLAGS), as on the slice; the device count is the rehearsal's.
  FORWARDED_XLA=""
  [[ " ${FORWARD_NAMES[*]} " == *" XLA_FLAGS "* ]] && FORWARDED_XLA="$XLA_FLAGS"
  POD_XLA_FLAGS="$(sed 's/--xla_force_host_platform_device_count=[0-9]*//g' <<< "$FORWARDED_XLA") --xla_force_host_platform_device_count=$DEVICES"
  # The rehearsal's own part, last so it wins: CPU devices, the coordinator the slice's hosts
  # find by themselves, ST5_MULTIHOST=1 as on the slice, and the GCS emulator (this machine's
  # stand-in for GCS and its credentials) when this shell names one.
  REHEARSAL=(JAX_PLATFORMS=cpu "XLA_FLAGS=${POD_XLA_FLAGS# }" "JAX_COORDINATOR_ADDRESS=127.0.0.1:$PORT"
             "JAX_NUM_PROCESSES=$LOCAL_POD" ST5_MULTIHOST=1)
  [ -n "${STORAGE_EMULATOR_HOST:-}" ] && REHEARSAL+=("STORAGE_EMULATOR_HOST=$STORAGE_EMULATOR_HOST")
  # The slice runs the worker's .venv/bin/st5 by its path (no activated venv in a fresh login).
  ST5_BIN="$ROOT/.venv/bin/st5"
  worker_command() {  # $1: the process index; sets WORKER, the whole command of that worker
    WORKER=(env -i "${LOGIN[@]}" "${FORWARD[@]}" "${REHEARSAL[@]}" "JAX_PROCESS_ID=$1" "$ST5_BIN" "${ARGS[@]}")
  }
  if [ "$DRY" = 1 ]; then
    forwarded_note
    for ((i = 0; i < LOCAL_POD; i++)); do worker_command "$i"; show "${WORKER[@]}"; done
    exit 0
  fi
  # shellcheck disable=SC1091
  source "$ROOT/launch/setup_env.sh"
  forwarded_note
  PIDS=()
  forward() { kill -"$1" "${PIDS[@]}" 2>/dev/null || true; }
  trap 'forward TERM' TERM
  trap 'forward INT' INT
  for ((i = 0; i < LOCAL_POD; i++)); do
    echo "[tpu_run] worker $i/$LOCAL_POD: $(show st5 "${ARGS[@]}")" >&2
    worker_command "$i"
    "${WORKER[@]}" > >(trap '' TERM INT; exec sed -u "s/^/[worker $i] /") 2>&1 &
    PIDS+=("$!")
  done
  RC=0
  for pid in "${PIDS[@]}"; do
    while true; do
      set +e; wait "$pid"; code=$?; set -e
      # wait returns >128 when a trapped signal interrupts it; the worker is still running.
      if kill -0 "$pid" 2>/dev/null; then continue; fi
      break
    done
    [ "$code" != 0 ] && [ "$RC" = 0 ] && RC="$code"
  done
  exit "$RC"
fi

if [ -z "$TPU" ]; then
  # ---------------------------------------------------------------- local run
  WORKDIR="${WORKDIR:-$ROOT/workdirs/$RUN_NAME}"
  GIN_FLAGS=()
  for f in "${GIN_PATHS[@]}"; do GIN_FLAGS+=(--gin_file "$f"); done
  CMD=(st5 train "${GIN_FLAGS[@]}" --workdir "$WORKDIR" "${TRAIN_FLAGS[@]}" "${OVERRIDES[@]}")
  if [ "$DRY" = 1 ]; then show "${CMD[@]}"; exit 0; fi
  # shellcheck disable=SC1091
  source "$ROOT/launch/setup_env.sh"
  echo "[tpu_run] $(show "${CMD[@]}")" >&2
  exec "${CMD[@]}"
fi

# ------------------------------------------------------------------ TPU slice
[ -n "$ZONE" ] || { echo "tpu_run.sh: --tpu needs --zone" >&2; exit 2; }
[ -n "$WORKDIR" ] || { echo "tpu_run.sh: on a TPU slice --workdir must be shared by all hosts (gs://BUCKET/DIR)" >&2; exit 2; }
case "$WORKDIR" in gs://*) ;; *) echo "tpu_run.sh: warning: --workdir $WORKDIR is not on GCS; every host must see the same directory" >&2 ;; esac
GCLOUD=(gcloud compute tpus tpu-vm)
WHERE=(--zone "$ZONE")
[ -n "$PROJECT" ] && WHERE+=(--project "$PROJECT")
REMOTE_DIR="st5_jax"

if [ "$CREATE" = 1 ]; then
  [ -n "$ACCEL" ] || { echo "tpu_run.sh: --create needs --accelerator (e.g. v4-64)" >&2; exit 2; }
  if [ "$DRY" = 1 ] || ! "${GCLOUD[@]}" describe "$TPU" "${WHERE[@]}" >/dev/null 2>&1; then
    CREATE_CMD=("${GCLOUD[@]}" create "$TPU" "${WHERE[@]}" --accelerator-type "$ACCEL" --version "$VERSION")
    [ "$SPOT" = 1 ] && CREATE_CMD+=(--spot)
    run "${CREATE_CMD[@]}"
  else
    echo "[tpu_run] reusing existing TPU VM $TPU" >&2
  fi
fi

# Ship the committed tree; a gin file from outside it travels beside it.
TARBALL="${TMPDIR:-/tmp}/st5_jax-$(git -C "$ROOT" rev-parse --short HEAD).tar.gz"
run git -C "$ROOT" archive --format=tar.gz -o "$TARBALL" HEAD
SHIP=("$TARBALL")
REMOTE_GINS=()
for GIN_PATH in "${GIN_PATHS[@]}"; do
  case "$GIN_PATH" in
    "$ROOT"/*) REMOTE_GINS+=("${GIN_PATH#"$ROOT"/}") ;;
    *) [[ " ${REMOTE_GINS[*]} " == *" ../$(basename "$GIN_PATH") "* ]] && {
         echo "tpu_run.sh: two gin files from outside the tree are named $(basename "$GIN_PATH");" \
              "rename one" >&2; exit 2; }
       SHIP+=("$GIN_PATH"); REMOTE_GINS+=("../$(basename "$GIN_PATH")") ;;
  esac
done
run "${GCLOUD[@]}" scp "${SHIP[@]}" "$TPU:~/" "${WHERE[@]}" --worker=all

# Everything after `--command` is one string for the remote shell: build it from
# %q-quoted words only.
REMOTE_SETUP="$(show mkdir -p "$REMOTE_DIR") && $(show tar -xzf "$(basename "$TARBALL")" -C "$REMOTE_DIR") && cd $(show "$REMOTE_DIR") && ST5_EXTRAS=tpu bash launch/setup_env.sh"
run "${GCLOUD[@]}" ssh "$TPU" "${WHERE[@]}" --worker=all --command "$REMOTE_SETUP"

mapfile -d '' TRAIN_ARGS < <(worker_args "${REMOTE_GINS[@]}")
# `env NAME=VALUE ...` carries the forwarded variables (above) into the fresh login's shell:
# each word %q-quoted, so a value with spaces, quotes, `;`, `$` or a glob (ST5_USER_HARD_NEGATIVES=
# 'gs://b/mined/part-*.jsonl') arrives as this shell has it. ST5_MULTIHOST=1 comes last, so it wins.
TRAIN=(env "${FORWARD[@]}" ST5_MULTIHOST=1 .venv/bin/st5 "${TRAIN_ARGS[@]}")
REMOTE_TRAIN="cd $(show "$REMOTE_DIR") && $(show "${TRAIN[@]}")"
case "${ST5_DATA_DIR:-gs://}" in gs://*) ;; *) echo "tpu_run.sh: warning: ST5_DATA_DIR=$ST5_DATA_DIR is not on GCS; each worker reads it from its own disk" >&2 ;; esac
forwarded_note
# All workers run the trainer; their logs stream here until the job ends.
run "${GCLOUD[@]}" ssh "$TPU" "${WHERE[@]}" --worker=all --command "$REMOTE_TRAIN"
