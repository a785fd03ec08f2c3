"""`st5 train --gin_file FILE [--gin.KEY=VALUE ...] --workdir DIR`, t5x-style.

Gin configures the entry point only: `run(...)` and the frozen config dataclasses it
receives. The operative config is written to DIR/operative_config.gin.
"""

from __future__ import annotations

import argparse
import logging
import os
import pathlib
import sys

REPO_GIN_DIR = pathlib.Path(__file__).resolve().parents[2] / "gin"


def register(sub: argparse._SubParsersAction) -> None:
  p = sub.add_parser("train", help="Train (or resume) a Sentence-T5 dual encoder from gin files.",
                     description="Extra --gin.KEY=VALUE arguments override bindings "
                                 "(e.g. --gin.TrainConfig.num_train_steps=100).")
  p.add_argument("--gin_file", action="append", required=True,
                 help="Gin file (repeatable); names are also looked up in gin/ and --gin_search_path.")
  p.add_argument("--gin_search_path", action="append", default=[])
  p.add_argument("--workdir", required=True, help="Checkpoints, metrics and configs go here; rerun to resume.")
  p.add_argument("--no_progress", action="store_true")
  p.set_defaults(run=run, accepts_extra=True)


def gin_overrides(extra: list[str]) -> list[str]:
  """`--gin.A.b=1` / `--gin.A.b 1` -> gin binding strings `A.b=1`."""
  bindings, i = [], 0
  while i < len(extra):
    arg = extra[i]
    if not arg.startswith("--gin."):
      raise SystemExit(f"unrecognized argument {arg!r} (gin overrides look like --gin.KEY=VALUE)")
    body = arg[len("--gin."):]
    if "=" not in body:
      if i + 1 >= len(extra):
        raise SystemExit(f"{arg} needs a value")
      body = f"{body}={extra[i + 1]}"
      i += 1
    bindings.append(body)
    i += 1
  return bindings


class _QuietIncludes:
  """Gin logs 'Path not found' for every search-path candidate it tries; hide those."""

  def filter(self, record) -> bool:
    return not str(record.getMessage()).startswith("Path not found:")


def parse_gin(files: list[str], bindings: list[str], search_paths: list[str] = ()) -> None:
  """Registers configurables and parses gin files + bindings (also used by `st5 aot` and tests)."""
  # gin and gin_config (JAX) here, not at the top: `st5 --help` imports this module.
  import gin  # pylint: disable=g-import-not-at-top

  from st5_jax import gin_config  # pylint: disable=g-import-not-at-top

  logging.getLogger().addFilter(_QuietIncludes())

  gin.clear_config()
  for path in [*search_paths, str(REPO_GIN_DIR)]:
    gin.add_config_file_search_path(path)
  resolved = []
  for f in files:
    if os.path.isfile(f):
      resolved.append(f)
    elif (REPO_GIN_DIR / f).is_file():
      resolved.append(str(REPO_GIN_DIR / f))
    else:
      raise SystemExit(f"gin file {f!r} not found (looked in ., {REPO_GIN_DIR} and search paths)")
  # One-line GinConfigErrors (file:line: binding: reason) for unknown keys, missing includes, syntax.
  gin_config.parse(resolved, bindings)


def run(args: argparse.Namespace) -> int:
  logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
  for noisy in ("absl", "jax._src.xla_bridge", "orbax", "tensorflow"):
    logging.getLogger(noisy).setLevel(logging.WARNING)

  from st5_jax import gin_config, multihost  # pylint: disable=g-import-not-at-top  (JAX; see parse_gin)

  multihost.maybe_initialize()
  parse_gin(args.gin_file, gin_overrides(args.extra), args.gin_search_path)
  result = gin_config.train_from_gin(workdir=args.workdir, progress=not args.no_progress)
  if result.interrupted_by:
    print(f"Interrupted by {result.interrupted_by} at step {result.step}; a checkpoint was saved. "
          f"Rerun the same command to resume.", file=sys.stderr)
    return 143 if result.interrupted_by == "SIGTERM" else 130
  return 0
