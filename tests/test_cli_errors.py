"""Every `st5` command: user errors are one line + exit 2; bugs keep their traceback; --debug shows it."""

from __future__ import annotations

import subprocess
import sys

import pytest

import st5_jax
from st5_jax import cli


def _one_error_line(capsys, command: str) -> str:
  err = capsys.readouterr().err
  lines = [line for line in err.splitlines() if line.strip() and "absl::InitializeLog" not in line
           and "cudart_stub" not in line]
  errors = [line for line in lines if line.startswith(f"{command}: error: ")]
  assert len(errors) == 1, err
  assert "Traceback" not in err, err
  return errors[0]


def test_encode_missing_model(tmp_path, capsys):
  (tmp_path / "in.txt").write_text("a\n")
  rc = cli.main(["encode", "--model", str(tmp_path / "nonexistent"), "--input", str(tmp_path / "in.txt"),
                 "--output", str(tmp_path / "o.npy")])
  assert rc == 2
  assert "does not exist" in _one_error_line(capsys, "st5 encode")


def test_encode_missing_input(tmp_path, capsys):
  rc = cli.main(["encode", "--model", str(tmp_path), "--input", str(tmp_path / "nope.txt"), "--output", "o.npy"])
  assert rc == 2
  assert "nope.txt" in _one_error_line(capsys, "st5 encode")


def test_encode_bad_flag_is_one_line(capsys):
  with pytest.raises(SystemExit) as e:
    cli.main(["encode", "--model", "m"])
  assert e.value.code == 2
  line = _one_error_line(capsys, "st5 encode")
  assert "--input" in line and "st5 encode --help" in line
  with pytest.raises(SystemExit) as e:
    cli.main(["encode", "--model", "m", "--input", "i", "--output", "o", "--bogus"])
  assert e.value.code == 2
  assert "unrecognized arguments: --bogus" in _one_error_line(capsys, "st5 encode")


def test_eval_unknown_task(tmp_path, data_dir, capsys):
  rc = cli.main(["eval", "--model", "m", "--tasks", "stsx", "--data_dir", str(data_dir),
                 "--output", str(tmp_path / "r.json")])
  assert rc == 2
  assert "stsx" in _one_error_line(capsys, "st5 eval")


def test_eval_no_model(tmp_path, capsys):
  assert cli.main(["eval", "--output", str(tmp_path / "r.json")]) == 2
  assert "--model" in _one_error_line(capsys, "st5 eval")


def test_export_missing_model(tmp_path, capsys):
  rc = cli.main(["export", "--model", str(tmp_path / "nope"), "--format", "savedmodel", "--out", str(tmp_path / "o")])
  assert rc == 2
  assert "does not exist" in _one_error_line(capsys, "st5 export")


def test_train_malformed_gin_value(tmp_path, capsys):
  rc = cli.main(["train", "--gin_file", "st5_tiny_cpu.gin", "--workdir", str(tmp_path),
                 "--gin.TrainConfig.num_train_steps=(3"])
  assert rc == 2
  assert "gin" in _one_error_line(capsys, "st5 train")


def test_train_unknown_gin_parameter_and_missing_file(tmp_path, capsys):
  rc = cli.main(["train", "--gin_file", "st5_tiny_cpu.gin", "--workdir", str(tmp_path), "--gin.TrainConfig.bogus=1"])
  assert rc == 2
  assert "bogus" in _one_error_line(capsys, "st5 train")
  rc = cli.main(["train", "--gin_file", "nope.gin", "--workdir", str(tmp_path)])
  assert rc == 2
  assert "nope.gin" in _one_error_line(capsys, "st5 train")
  rc = cli.main(["train", "--gin_file", "st5_tiny_cpu.gin", "--workdir", str(tmp_path), "--steps=3"])
  assert rc == 2
  assert "--gin.KEY=VALUE" in _one_error_line(capsys, "st5 train")


def test_aot_missing_gin_and_malformed_binding(capsys):
  assert cli.main(["aot", "--gin", "nope.gin"]) == 2
  assert "nope.gin" in _one_error_line(capsys, "st5 aot")
  assert cli.main(["aot", "--gin", "st5_tiny_cpu.gin", "--gin.Nope.x=1"]) == 2
  assert "No configurable matching 'Nope'" in _one_error_line(capsys, "st5 aot")


def test_bench_unknown_size(capsys):
  assert cli.main(["bench", "--size", "t5_galactic", "--encode_sentences", "0"]) == 2
  assert "Unknown T5 size 't5_galactic'" in _one_error_line(capsys, "st5 bench")


def test_data_subcommands(tmp_path, data_dir, capsys, monkeypatch):
  monkeypatch.setenv("ST5_DATA_DIR", str(data_dir))
  assert cli.main(["data", "overlap", "--tasks", "no_such_task"]) == 2
  assert "no_such_task" in _one_error_line(capsys, "st5 data overlap")
  assert cli.main(["data", "nli-triples", "--input", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "t.csv")]) == 2
  assert "missing.jsonl" in _one_error_line(capsys, "st5 data nli-triples")
  assert cli.main(["data", "prepare", "--source", str(tmp_path / "nodir"), "--out", str(tmp_path / "o")]) == 2
  assert "is not a folder" in _one_error_line(capsys, "st5 data prepare")


def test_missing_optional_extra_is_one_line(tmp_path, data_dir, capsys, monkeypatch):
  monkeypatch.setitem(sys.modules, "mteb", None)  # as if the `mteb` extra were not installed
  monkeypatch.delitem(sys.modules, "st5_jax.mteb", raising=False)
  # `from st5_jax import mteb` takes the package's attribute when an earlier test in this worker
  # imported the module: without it gone too, the import succeeds and the test depends on order.
  monkeypatch.delattr(st5_jax, "mteb", raising=False)
  rc = cli.main(["eval", "--model", str(tmp_path), "--mteb", "STSBenchmark", "--data_dir", str(data_dir),
                 "--output", str(tmp_path / "r.json")])
  assert rc == 2
  assert "pip install 'st5_jax[mteb]'" in _one_error_line(capsys, "st5 eval")


def test_bugs_keep_their_traceback(monkeypatch):
  from st5_jax.commands import encode

  def buggy(args):
    import numpy as np
    return np.reshape(np.zeros(3), (2, 2))  # a ValueError raised inside numpy, not our validation

  monkeypatch.setattr(encode, "run", buggy)
  with pytest.raises(ValueError, match="cannot reshape"):
    cli.main(["encode", "--model", "m", "--input", "i", "--output", "o"])

  def type_error(args):
    return len(3)

  monkeypatch.setattr(encode, "run", type_error)
  with pytest.raises(TypeError):
    cli.main(["encode", "--model", "m", "--input", "i", "--output", "o"])


def test_debug_shows_the_traceback_of_user_errors(tmp_path):
  argv = ["eval", "--model", "m", "--tasks", "stsx", "--output", str(tmp_path / "r.json"), "--debug"]
  with pytest.raises(ValueError, match="stsx"):
    cli.main(argv)
  proc = subprocess.run([sys.executable, "-m", "st5_jax.cli", "--debug", *argv[:-1]], capture_output=True, text=True)
  assert proc.returncode == 1 and "Traceback" in proc.stderr
  proc = subprocess.run([sys.executable, "-m", "st5_jax.cli", *argv[:-1]], capture_output=True, text=True)
  assert proc.returncode == 2 and "Traceback" not in proc.stderr
  assert proc.stderr.strip().splitlines()[-1].startswith("st5 eval: error: ")
