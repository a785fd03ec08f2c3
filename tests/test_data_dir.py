"""One place decides where the data lives: st5_jax.paths.resolve_data_dir.

A command's --data_dir, else gin `st5_jax.data.options.data_dir` (declared in
st5_jax.data.config), else $ST5_DATA_DIR; the tasks (config.data_dir), paths.data_dir
(evaluation, `st5 eval`), the vocabulary fallback, the trainer's STS-B dev evaluation and
`st5 data prepare` all ask it.
"""

from __future__ import annotations

import argparse
import os

import gin
import pytest

from st5_jax import gin_config, paths
from st5_jax.commands import data as data_command
from st5_jax.gin_config import parse_gin
from st5_jax.data import config


@pytest.fixture
def folders(tmp_path, monkeypatch):
  env, bound, arg = (tmp_path / n for n in ("env", "gin", "arg"))
  for d in (env, bound, arg):
    (d / "t5_spiece").mkdir(parents=True)
    (d / "t5_spiece" / "spiece.model").write_bytes(d.name.encode())
  monkeypatch.setenv(paths.DATA_DIR_ENV, str(env))
  monkeypatch.delenv(paths.VOCAB_ENV, raising=False)
  gin.clear_config()
  yield env, bound, arg
  gin.clear_config()


def test_argument_then_gin_then_environment(folders):
  env, bound, arg = folders
  assert config.data_dir() == str(env)
  gin.bind_parameter(config.GIN_DATA_DIR, str(bound))
  assert config.data_dir() == str(bound)
  assert config.data_dir(str(arg)) == str(arg)
  # Every other reader agrees: the evaluation path, the vocabulary fallback, the tasks' prepared folder.
  assert os.fspath(paths.data_dir()) == str(bound)
  assert paths.read_bytes(paths.vocab_path()) == b"gin"
  assert config.prepared_dir() == paths.join(str(bound), config.PREPARED_DIRNAME)


def test_nothing_set_says_what_to_set(folders, monkeypatch, tmp_path):
  monkeypatch.delenv(paths.DATA_DIR_ENV)
  assert config.data_dir(required=False) is None and paths.data_dir(required=False) is None
  with pytest.raises(paths.MissingFileError, match=rf"set {paths.DATA_DIR_ENV} \(or gin {config.GIN_DATA_DIR}\)"):
    config.data_dir()
  gin.bind_parameter(config.GIN_DATA_DIR, str(tmp_path / "absent"))
  with pytest.raises(paths.MissingFileError, match=rf"absent does not exist \(from gin {config.GIN_DATA_DIR}\)"):
    paths.data_dir()
  assert config.data_dir(required=False) == str(tmp_path / "absent")  # e.g. a folder `st5 data prepare` creates


def test_a_run_file_binding_reaches_the_trainer_and_the_old_binding_is_refused(folders, monkeypatch):
  env, bound, _ = folders
  # The trainer's STS-B dev folder is what gin_config.train_from_gin passes; it reads config.data_dir.
  parse_gin(["st5_tiny_cpu.gin"], [f"{config.GIN_DATA_DIR} = '{bound}'"])
  seen = {}
  monkeypatch.setattr(gin_config.train, "train", lambda **kw: seen.update(kw))
  gin_config.train_from_gin(workdir=str(env.parent / "workdir"))
  assert seen["eval_data_dir"] == str(bound)  # not $ST5_DATA_DIR
  assert paths.read_bytes(seen["vocab_file"]) == b"gin"
  parse_gin(["st5_tiny_cpu.gin"], [f"run.eval_data_dir = '{bound}'"])
  with pytest.raises(gin_config.GinConfigError, match=rf"run.eval_data_dir is no longer read: bind "
                                                      rf"{config.GIN_DATA_DIR} = '{bound}'"):
    gin_config.run_spec()


def test_data_prepare_defaults_to_the_data_folder(folders, monkeypatch):
  from st5_jax.data.offline import prepare as prepare_lib  # pylint: disable=g-import-not-at-top
  env, _, _ = folders
  seen = {}

  def stop(**kwargs):
    seen.update(kwargs)
    raise prepare_lib.PrepareError("stopped before any work")

  monkeypatch.setattr(prepare_lib, "prepare", stop)
  args = argparse.Namespace(out=None, source=None, base_url=None, datasets=None, offline=True, trust_unverified=False,
                            strict=False, no_progress=True, timeout=1, tfds=False)
  with pytest.raises(data_command.UsageError, match="stopped before any work"):
    data_command._prepare(args)  # pylint: disable=protected-access
  assert seen["out_dir"] == str(env)
  monkeypatch.delenv(paths.DATA_DIR_ENV)
  with pytest.raises(data_command.UsageError, match="pass --out DIR"):
    data_command._prepare(args)  # pylint: disable=protected-access
