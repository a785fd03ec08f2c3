"""The `st5` command. Flags live here and in st5_jax/commands/; the library takes arguments.

Each subcommand is a module in st5_jax.commands with `register(subparsers)` and
`run(args) -> int`; modules import their heavy dependencies inside `run` so that
`st5 --help` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> module under st5_jax.commands
COMMANDS = {
    "encode": "encode",
    "data": "data",
    "train": "train",
    "eval": "eval",
    "export": "export",
    "aot": "aot",
    "bench": "bench",
}


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(prog="st5", description="Sentence-T5 in JAX: encode, data, train, eval, export, aot, bench.")
  sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
  for name, module_name in COMMANDS.items():
    try:
      module = importlib.import_module(f"st5_jax.commands.{module_name}")
    except ModuleNotFoundError as e:
      if e.name == f"st5_jax.commands.{module_name}":
        continue  # not built yet in this checkout
      raise
    module.register(sub)
  return parser


def main(argv: list[str] | None = None) -> int:
  parser = build_parser()
  args, extra = parser.parse_known_args(argv)
  if extra and not getattr(args, "accepts_extra", False):
    parser.error(f"unrecognized arguments: {' '.join(extra)}")
  args.extra = extra
  return int(args.run(args) or 0)


if __name__ == "__main__":
  sys.exit(main())
