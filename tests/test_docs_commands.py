"""Every `st5 ...` command line in README.md and docs/*.md parses with the real argument parser.

Lines in fenced code blocks (with their `\\` continuations) and inline code spans that start
with `st5` (after environment assignments or a `time` wrapper) are checked:
- a concrete line (no usage notation) must parse: the command exists, its required flags are
  there, every flag is known, choices are valid; `--gin.KEY=VALUE` only where a command takes it;
- a line in usage notation (`[--flag X]`, `a|b`, `...`) must name known flags of an existing command;
- a bare `st5 CMD` (a name in prose) must name an existing command.
"""

from __future__ import annotations

import argparse
import pathlib
import re
import shlex

import pytest

from st5_jax import cli

REPO = pathlib.Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
USAGE = re.compile(r"[\[\]|…]|\.\.\.")
PLACEHOLDER = re.compile(r"^(?:[A-Z][A-Z_]*:?|\.\.\.|…)$")  # `st5 COMMAND ...` in prose
# Commands that pass unknown flags on: `st5 data cache` hands them to Beam as pipeline options.
PASS_ON = {"cache"}


def _command_lines(path: pathlib.Path) -> list[tuple[int, str]]:
  """(line number, text from `st5` on) of every command line in code blocks and inline code spans."""
  out, in_block, pending, start = [], False, "", 0
  for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
    if line.lstrip().startswith("```"):
      in_block, pending = not in_block, ""
      continue
    if in_block:
      text = pending + line.split(" #")[0].rstrip() if pending else line.split(" #")[0].rstrip()
      if text.endswith("\\"):
        pending, start = text[:-1] + " ", start if pending else number
        continue
      out.append((start if pending else number, text))
      pending = ""
    else:
      out += [(number, span) for span in re.findall(r"`([^`]+)`", line)]
  commands = []
  for number, text in out:
    try:
      words = shlex.split(text)
    except ValueError:
      continue
    if "st5" not in words:
      continue
    i = words.index("st5")
    before = words[:i]
    if before and not (all("=" in w for w in before) or before[0].endswith("time")):
      continue
    commands.append((number, words[i + 1:], text))
  return commands


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
  for action in parser._actions:  # pylint: disable=protected-access
    if isinstance(action, argparse._SubParsersAction):  # pylint: disable=protected-access
      return dict(action.choices)
  return {}


def _resolve(parser, words) -> tuple[list[argparse.ArgumentParser], list[str]]:
  """The (sub)parsers the command words name (`encode/eval/export` names three) and the remaining words."""
  parsers = [parser]
  while words and _subparsers(parsers[0]) and not words[0].startswith("-"):
    names = words[0].split("/")
    subs = _subparsers(parsers[0])
    unknown = [n for n in names if n not in subs]
    if unknown:
      raise AssertionError(f"no command {' '.join(unknown)!r}")
    parsers, words = [subs[n] for n in names], words[1:]
  return parsers, words


def _options(parser) -> set[str]:
  return {s for a in parser._actions for s in a.option_strings}  # pylint: disable=protected-access


CASES = [(f"{p.relative_to(REPO)}:{n}", words, text) for p in DOCS for n, words, text in _command_lines(p)]


def test_the_docs_name_commands():
  assert len(CASES) > 40, CASES  # the extraction found the README's and docs' commands
  assert any(w[:1] == ["train"] for _, w, _ in CASES) and any(w[:2] == ["data", "prepare"] for _, w, _ in CASES)


@pytest.mark.parametrize("where,words,text", CASES, ids=[c[0] for c in CASES])
def test_every_documented_command_parses(where, words, text):
  parser = cli.build_parser()
  if not words or PLACEHOLDER.match(words[0]) or "--help" in words or "-h" in words:
    return  # `st5 COMMAND`, `st5 --help`: no command line to check
  if len(words) > 1 and words[0] == "data" and PLACEHOLDER.match(words[1]):
    return
  try:
    parsers, rest = _resolve(parser, list(words))
  except AssertionError as e:
    raise AssertionError(f"{where}: `st5 {' '.join(words)}`: {e}") from None
  # Usage brackets stick to their words (`[--select TASK]`, `--negatives]`): the flag is what is inside.
  flags = [w.strip("[]") for w in rest if w.strip("[]").startswith("--")]
  if not flags:
    return  # a command named in prose
  if USAGE.search(text) or len(parsers) > 1:
    for p in parsers:
      takes_gin = p.get_default("accepts_extra")
      unknown = [f for f in flags if f.split("=")[0] not in _options(p) and not (takes_gin and f.startswith("--gin."))]
      assert not unknown, f"{where}: `{text}`: {p.prog} has no {unknown}"
    return
  try:
    args, extra = parser.parse_known_args(list(words))
  except SystemExit:
    raise AssertionError(f"{where}: `{text}` does not parse (see the error above)") from None
  if any(w in PASS_ON for w in words[:2]):
    return
  if getattr(args, "accepts_extra", False):
    extra = [e for e in extra if not e.startswith("--gin.")]
    extra = [e for i, e in enumerate(extra) if not (i and extra[i - 1].startswith("--gin.") and "=" not in extra[i - 1])]
  assert not extra, f"{where}: `{text}`: unrecognized {extra}"
