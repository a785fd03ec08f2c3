#!/usr/bin/env bash
# The test suite: sets up .venv with the `test` extra, then runs pytest on 2 workers.
# Extra arguments go to pytest (e.g. tests/run.sh -k model).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ST5_EXTRAS=test source launch/setup_env.sh
exec python -m pytest -n "${ST5_TEST_WORKERS:-2}" --durations=15 "$@" tests
