"""User-facing strings name what a user has (a layout, `st5 data prepare`, docs/data.md), never a
development-machine path such as ../shared/data or /work/."""

from __future__ import annotations

import ast
import pathlib
import sys
import types

import pytest

from st5_jax import cli, paths
from st5_jax.objectives.consert import tasks as consert_tasks
from st5_jax.data import builders
from st5_jax.data.rows import RowStats
from st5_jax.errors import InputFileError
from st5_jax.evaluation.baselines import HashedBagOfWords

ROOT = pathlib.Path(__file__).resolve().parents[1]
FORBIDDEN = ("../shared", "/work/")


def _strings(tree: ast.AST):
  """Every string constant (docstrings, messages, help) and every literal part of an f-string."""
  for node in ast.walk(tree):
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
      yield node.lineno, node.value


def test_no_development_machine_paths_in_package_strings():
  files = sorted((ROOT / "st5_jax").rglob("*.py")) + sorted((ROOT / "tasks").rglob("*.py"))
  assert len(files) > 50
  bad = []
  for f in files:
    for lineno, s in _strings(ast.parse(f.read_text(encoding="utf-8"), filename=str(f))):
      bad += [f"{f.relative_to(ROOT)}:{lineno}: {s[:80]!r}" for needle in FORBIDDEN if needle in s]
  assert not bad, "\n".join(bad)


def test_scan_sees_f_string_parts_and_docstrings():
  tree = ast.parse('"""Doc ../shared/data."""\nx = f"at {y} laid out like ../shared/data"\n')
  assert sum("../shared" in s for _, s in _strings(tree)) == 2


def _one_error_line(capsys, command: str) -> str:
  err = capsys.readouterr().err
  errors = [line for line in err.splitlines() if line.startswith(f"{command}: error: ")]
  assert len(errors) == 1, err
  assert "Traceback" not in err, err
  return errors[0]


def test_missing_eval_set_names_the_layout_and_the_command(tmp_path, capsys, monkeypatch):
  # A bag-of-words encoder in place of a model: the error comes from the first reader.
  class BowEncoder:
    @classmethod
    def load(cls, path, **kwargs):
      return cls()

    def encode(self, texts, batch_size=None):
      return HashedBagOfWords(16)(texts)

  fake = types.ModuleType("st5_jax.encoder")
  fake.SentenceEncoder = BowEncoder
  monkeypatch.setitem(sys.modules, "st5_jax.encoder", fake)
  (tmp_path / "data").mkdir()
  rc = cli.main(["eval", "--model", "bow", "--tasks", "STSBenchmark", "--data_dir", str(tmp_path / "data"),
                 "--output", str(tmp_path / "r.json")])
  assert rc == 2
  line = _one_error_line(capsys, "st5 eval")
  assert "sts-" in line and "st5 data prepare --out DIR" in line and "docs/data.md" in line, line
  assert not any(needle in line for needle in FORBIDDEN), line


def test_missing_training_file_says_how_to_make_it(tmp_path):
  with pytest.raises(InputFileError) as e:
    builders.build_trecqa(tmp_path, stats=RowStats())
  msg = str(e.value)
  assert f"st5 data prepare --out {tmp_path}" in msg and paths.LAYOUT_HINT in msg, msg
  assert not any(needle in msg for needle in FORBIDDEN), msg


def test_missing_consert_file_names_the_layout(tmp_path):
  with pytest.raises(InputFileError) as e:
    consert_tasks._file_lines(str(tmp_path / "absent.txt"))
  msg = str(e.value)
  assert "absent.txt" in msg and paths.LAYOUT_HINT in msg, msg
