#!/usr/bin/env bash
# The test suite: sets up .venv with the `test` and `tpu` extras (libtpu, for the AOT fit
# checks), then runs pytest on 2 workers.
# Extra arguments go to pytest (e.g. tests/run.sh -k model).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ST5_EXTRAS=test,tpu source launch/setup_env.sh
exec python -m pytest -n "${ST5_TEST_WORKERS:-2}" --durations=15 "$@" tests
