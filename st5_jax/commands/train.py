"""`st5 train --gin_file FILE [--gin.KEY=VALUE ...] --workdir DIR`, t5x-style.

Gin configures the entry point only: `run(...)` and the frozen config dataclasses it
receives. The first invocation writes the operative config to DIR/operative_config.gin; a
resume with other bindings is refused unless they are allow-listed or `--allow_config_change`
is given, and every change is recorded in DIR/config_history.json (st5_jax/provenance.py).
One trainer per work dir: a second one is refused unless `--takeover` (st5_jax/checkpoints/lease.py).
"""

from __future__ import annotations

import argparse
import logging
import sys


def register(sub: argparse._SubParsersAction) -> None:
  p = sub.add_parser("train", help="Train (or resume) a Sentence-T5 dual encoder from gin files.",
                     description="Extra --gin.KEY=VALUE arguments override bindings "
                                 "(e.g. --gin.TrainConfig.num_train_steps=100).")
  p.add_argument("--gin_file", action="append", required=True,
                 help="Gin file (repeatable): a path, else a name looked up in each --gin_search_path, then among "
                      "the shipped gin files.")
  p.add_argument("--gin_search_path", action="append", default=[],
                 help="A folder of gin files and includes, searched before the shipped ones (repeatable).")
  p.add_argument("--workdir", required=True, help="Checkpoints, metrics and configs go here; rerun to resume.")
  p.add_argument("--no_progress", action="store_true")
  p.add_argument("--takeover", action="store_true",
                 help="Take the work dir over from the trainer that holds its lease (that trainer stops before its "
                      "next checkpoint); without it a held work dir is refused until its lease expires.")
  p.add_argument("--allow_config_change", action="store_true",
                 help="Resume even though bindings differ from the ones recorded in the work dir (recorded in "
                      "config_history.json); paths, logging/eval/checkpoint cadence and the mesh need no flag.")
  p.add_argument("--lease_expiry_s", type=float, default=600.0,
                 help="The work dir lease expires this long after its last renewal (default 600).")
  p.add_argument("--lease_renew_s", type=float, default=None,
                 help="Renew the lease this often (default: a quarter of --lease_expiry_s).")
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


def run(args: argparse.Namespace) -> int:
  logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
  for noisy in ("absl", "jax._src.xla_bridge", "orbax", "tensorflow"):
    logging.getLogger(noisy).setLevel(logging.WARNING)

  # Here, not at the top: JAX, gin and TensorFlow, which `st5 --help` does not need.
  from st5_jax import gin_config, multihost  # pylint: disable=g-import-not-at-top
  from st5_jax.checkpoints import lease  # pylint: disable=g-import-not-at-top

  options = lease.LeaseOptions(expiry_s=args.lease_expiry_s, renew_s=args.lease_renew_s, takeover=args.takeover)
  multihost.maybe_initialize()
  gin_config.parse_gin(args.gin_file, gin_overrides(args.extra), args.gin_search_path)
  result = gin_config.train_from_gin(workdir=args.workdir, progress=not args.no_progress, lease=options,
                                     allow_config_change=args.allow_config_change)
  if result.interrupted_by:
    print(f"Interrupted by {result.interrupted_by} at step {result.step}; a checkpoint was saved. "
          f"Rerun the same command to resume.", file=sys.stderr)
    return 143 if result.interrupted_by == "SIGTERM" else 130
  return 0
