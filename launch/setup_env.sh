#!/usr/bin/env bash
# Creates (or reuses) the virtual environment at .venv/ and installs st5_jax into it.
# Sourced by launch/tpu_run.sh and tests/run.sh; safe to run again (a stamp file skips
# the install when pyproject.toml, the lock file and the extras are unchanged).
#
#   source launch/setup_env.sh            # the package (training, export, eval)
#   ST5_EXTRAS=test source launch/setup_env.sh   # plus the test references (torch CPU, transformers)
#
# torch: `pip install torch==2.13.0` takes the CPU build where one is on the machine's
# disk or index; elsewhere point pip at PyTorch's CPU index first:
#   pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
# Strict mode for this script only: a shell that sources it gets its own options back at the end
# (left on, a later failing command, e.g. an `st5` user error, would close an interactive shell).
_st5_saved_options="$(set +o)"
set -euo pipefail
ST5_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ST5_EXTRAS="${ST5_EXTRAS:-}"
PYTHON="${PYTHON:-python3}"

# A venv whose creation was interrupted has a python but no activate script: create it again.
if [ ! -x "$ST5_ROOT/.venv/bin/python" ] || [ ! -f "$ST5_ROOT/.venv/bin/activate" ]; then
  echo "[setup] creating $ST5_ROOT/.venv" >&2
  "$PYTHON" -m venv --clear "$ST5_ROOT/.venv"
fi
# shellcheck disable=SC1091
source "$ST5_ROOT/.venv/bin/activate"

# The stamp names the pyproject/lock hash and lists the extras installed with them; a
# request for a subset of those extras (e.g. the launcher inside the test venv) is met.
stamp="$ST5_ROOT/.venv/.st5-installed-$(cat "$ST5_ROOT/pyproject.toml" "$ST5_ROOT/requirements/lock.txt" | sha256sum | cut -c1-16)"
need_install=0
if [ ! -f "$stamp" ]; then
  need_install=1
else
  for extra in ${ST5_EXTRAS//,/ }; do
    grep -qx "$extra" "$stamp" || need_install=1
  done
fi
if [ "$need_install" = 1 ]; then
  # Keep the extras already installed with this lock (installing fewer never removes any).
  [ -f "$stamp" ] && ST5_EXTRAS="$(sort -u <(tr ',' '\n' <<< "$ST5_EXTRAS") "$stamp" | grep -v '^$' | paste -sd, -)"
  echo "[setup] installing st5_jax${ST5_EXTRAS:+[$ST5_EXTRAS]} into .venv (first run takes a few minutes)" >&2
  python -m pip install --quiet --upgrade pip
  if [[ ",$ST5_EXTRAS," == *",test,"* ]]; then
    # Before the extra, so that nothing pulls a CUDA build of torch.
    python -m pip install --quiet "torch==2.13.0" ${ST5_TORCH_INDEX:+--index-url "$ST5_TORCH_INDEX"}
  fi
  spec="$ST5_ROOT"
  [ -n "$ST5_EXTRAS" ] && spec="$ST5_ROOT[$ST5_EXTRAS]"
  python -m pip install --quiet -c "$ST5_ROOT/requirements/lock.txt" -e "$spec"
  rm -f "$ST5_ROOT"/.venv/.st5-installed-*
  tr ',' '\n' <<< "$ST5_EXTRAS" | grep -v '^$' > "$stamp" || true
fi

# Public data and the vocabulary: ../shared/data beside the checkout unless set.
if [ -z "${ST5_DATA_DIR:-}" ] && [ -d "$ST5_ROOT/../shared/data" ]; then
  export ST5_DATA_DIR="$(cd "$ST5_ROOT/../shared/data" && pwd)"
fi
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-3}"
# No accelerator here (no TPU device nodes, no NVIDIA driver): use the CPU directly, so an
# installed libtpu neither probes for TPU hosts nor takes its lockfile.
if [ -z "${JAX_PLATFORMS:-}" ] && ! ls /dev/accel* /dev/vfio/[0-9]* >/dev/null 2>&1 \
    && ! command -v nvidia-smi >/dev/null 2>&1; then
  export JAX_PLATFORMS=cpu
fi
eval "$_st5_saved_options"
unset _st5_saved_options
