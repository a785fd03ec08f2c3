#!/usr/bin/env bash
# The test suite: sets up .venv with the `test` and `tpu` extras (libtpu, for the AOT fit
# checks), then runs pytest on 2 workers. Work stealing (`--dist worksteal`): an idle worker takes half of
# the other's queue, where xdist's default `load` left one worker idle for the last 426 s of a 21.5 min
# run (tests/timeline.py). The wall time stayed about the same: the cores were busy (docs/testing.md).
# Extra arguments go to pytest (e.g. tests/run.sh -k model).
#   tests/run.sh --aot-all   only the AOT fit checks marked aot_all: the large shipped runs and
#                            SEED-Encoder Base (~25 min on 2 cores)
#   tests/run.sh --mutations [-k WORD..] [--baseline]   the hand-written mutation check
#                            (tests/mutations.py, 127 mutants; not part of the default run; docs/testing.md)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ST5_EXTRAS=test,tpu source launch/setup_env.sh
if [ "${1:-}" = "--aot-all" ]; then
  shift
  exec python -m pytest -n "${ST5_TEST_WORKERS:-2}" --dist worksteal --durations=15 -m aot_all "$@" tests
fi
if [ "${1:-}" = "--mutations" ]; then
  shift
  exec python tests/mutations.py "$@"
fi
exec python -m pytest -n "${ST5_TEST_WORKERS:-2}" --dist worksteal --durations=15 "$@" tests
