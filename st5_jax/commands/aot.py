"""`st5 aot --gin NAME.gin [--topology v4:4x4x4]`: will this run fit on that TPU slice?"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from st5_jax.commands.train import gin_overrides


def register(sub: argparse._SubParsersAction) -> None:
  p = sub.add_parser("aot", help="Compile the real train step for a TPU topology on this host (needs libtpu) "
                     "and report per-chip memory, FLOPs and a roofline step-time estimate.",
                     description="Exit status 1 when the configuration does not fit in the chip's HBM. The step "
                     "time is an estimate (a roofline of the compiled program: FLOPs, HBM bytes and ICI bytes "
                     "per chip over the chip's peak rates), not a measurement.")
  p.add_argument("--gin", "--gin_file", dest="gin_file", action="append", required=True,
                 help="Gin file(s) of the run, as given to `st5 train` (a path, or a shipped file's name).")
  p.add_argument("--topology", default=None, help="e.g. v4:4x4x8 (default: the gin file's run.target).")
  p.add_argument("--slice", default=None, help="e.g. v4-256, v5e-16, v5p-16, v6e-256 (alternative to --topology).")
  p.add_argument("--json", default=None, help="Also write the report as JSON here.")
  p.set_defaults(run=run, accepts_extra=True)


def run(args: argparse.Namespace) -> int:
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
  logging.getLogger("absl").setLevel(logging.ERROR)

  # After the environment above (libtpu reads it), and not at the top: they import JAX.
  from st5_jax import aot, gin_config  # pylint: disable=g-import-not-at-top

  # The fit does not depend on the weights: never require or read run.init_from.
  gin_config.parse_gin(args.gin_file, ["run.init_from = None", *gin_overrides(args.extra)])
  spec = gin_config.run_spec()
  topology = args.topology or (aot.topology_for_slice(args.slice) if args.slice else None)
  name = " + ".join(os.path.basename(f) for f in args.gin_file)
  report = aot.compile_for_topology(spec, topology=topology, name=name)
  print(report.table())
  if args.json:
    with open(args.json, "w") as f:
      json.dump(report.as_dict(), f, indent=2)
  if not report.fits:
    print(report.misfit(), file=sys.stderr)
    return 1
  return 0
