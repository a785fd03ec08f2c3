"""The `st5` command. Flags live here and in st5_jax/commands/; the library takes arguments.

Each subcommand is a module in st5_jax.commands with `register(subparsers)` and
`run(args) -> int`; modules import their heavy dependencies inside `run` so that
`st5 --help` stays fast.

Errors: a user error (a missing or invalid path, an unknown task, a malformed gin
binding, a bad flag) prints one line, `st5 COMMAND: error: MESSAGE`, and exits with
status 2; see `is_user_error`. Anything else is a bug and keeps its traceback. The
global `--debug` flag (anywhere on the line) shows the traceback of user errors too.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import tokenize
from typing import NoReturn

from st5_jax import hostmem

# name -> module under st5_jax.commands
COMMANDS = {
    "encode": "encode",
    "data": "data",
    "train": "train",
    "eval": "eval",
    "export": "export",
    "aot": "aot",
    "bench": "bench",
    "sweep": "sweep",
    "index": "index",
    "search": "search",
    "distill-cache": "distill_cache",
}

USER_ERROR_EXIT = 2
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


class UsageError(Exception):
  """A flag combination a command refuses; raised by st5_jax/commands/*, printed as one line."""


class _Parser(argparse.ArgumentParser):
  """argparse, but a bad flag is one line (with a pointer to --help) instead of the usage block."""

  def error(self, message: str) -> NoReturn:
    self.exit(USER_ERROR_EXIT, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def _raised_in(exc: BaseException) -> str:
  tb = exc.__traceback__
  if tb is None:
    return ""
  while tb.tb_next is not None:
    tb = tb.tb_next
  return os.path.abspath(tb.tb_frame.f_code.co_filename)


def _validation_module(filename: str) -> bool:
  """Frames whose ValueErrors are input validation: this package and gin's config parser."""
  if filename.startswith(_PACKAGE_DIR + os.sep):
    return True
  parts = filename.split(os.sep)
  return "gin" in parts[:-1]  # site-packages/gin/config.py, config_parser.py


def is_user_error(exc: BaseException) -> bool:
  """True for errors a user fixes by changing the command line or its inputs.

  Missing files and folders (FileNotFoundError and its subclasses paths.MissingFileError,
  data InputFileError; NotADirectoryError, IsADirectoryError, FileExistsError), this
  project's own error types, ValueError / SyntaxError / KeyError raised by this
  package's validation or by gin's config parser, and our ImportErrors that say which
  extra to `pip install`. The same types raised deep inside
  a library (jax, numpy, TensorFlow) are bugs and keep their traceback.
  """
  from_us = _validation_module(_raised_in(exc))
  if isinstance(exc, (UsageError, FileNotFoundError, NotADirectoryError, IsADirectoryError, FileExistsError)):
    return True
  if isinstance(exc, tokenize.TokenError):  # gin's tokenizer on a malformed binding
    return True
  if isinstance(exc, ImportError) and from_us and "pip install" in str(exc):
    return True  # an optional extra that is not installed; our message names it
  module = type(exc).__module__ or ""
  if module.startswith("st5_jax.") and not isinstance(exc, (TypeError, AttributeError, AssertionError)):
    return True  # PrepareError, DownloadError, UnsupportedExportError, ParameterMismatchError, ...
  return from_us and isinstance(exc, (ValueError, SyntaxError, KeyError))


def one_line(exc: BaseException) -> str:
  """The exception's message on one line (gin's messages span several)."""
  if isinstance(exc, tokenize.TokenError):  # args = (message, (row, col))
    return f"malformed gin binding: {exc.args[0]}"
  if isinstance(exc, KeyError) and len(exc.args) == 1:
    text = str(exc.args[0])
  else:
    text = str(exc)
  lines = [line.strip() for line in text.splitlines() if line.strip()]
  return " | ".join(lines) or type(exc).__name__


def build_parser() -> argparse.ArgumentParser:
  parser = _Parser(prog="st5", description="Sentence-T5 in JAX: encode, data, train, eval, sweep, export, aot, bench.",
                   epilog="Errors print one line and exit 2; --debug (anywhere) shows their traceback.")
  parser.add_argument("--debug", action="store_true", help="Show tracebacks of user errors too.")
  sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
  for module_name in COMMANDS.values():
    importlib.import_module(f"st5_jax.commands.{module_name}").register(sub)
  return parser


def _command_name(args: argparse.Namespace) -> str:
  words = ["st5"]
  if getattr(args, "command", None):
    words.append(args.command)
  if getattr(args, "data_command", None):
    words.append(args.data_command)
  return " ".join(words)


def main(argv: list[str] | None = None) -> int:
  if argv is None:  # run as a program (not called from Python): huge-page malloc, fewer GC passes
    hostmem.reexec_with_hugetlb_malloc()  # docs/performance.md
    hostmem.raise_gc_threshold()
  argv = list(sys.argv[1:] if argv is None else argv)
  debug = "--debug" in argv
  argv = [a for a in argv if a != "--debug"]
  parser = build_parser()
  args, extra = parser.parse_known_args(argv)
  name = _command_name(args)
  if extra and not getattr(args, "accepts_extra", False):
    # As argparse does for every other bad flag: SystemExit(2) after the one line.
    parser.exit(USER_ERROR_EXIT, f"{name}: error: unrecognized arguments: {' '.join(extra)} (see `{name} --help`)\n")
  args.extra = extra
  args.debug = debug
  try:
    return int(args.run(args) or 0)
  except SystemExit as e:
    if isinstance(e.code, str):  # raise SystemExit("message") in a command
      print(f"{name}: error: {e.code}", file=sys.stderr)
      return USER_ERROR_EXIT
    raise
  except Exception as e:  # pylint: disable=broad-except
    if debug or not is_user_error(e):
      raise
    print(f"{name}: error: {one_line(e)}", file=sys.stderr)
    return USER_ERROR_EXIT


if __name__ == "__main__":
  sys.exit(main())
