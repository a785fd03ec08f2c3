"""Data configuration: data folder, vocabulary, strictness. Gin-bindable, env as fallback.

Gin (entry points only):

    st5_jax.data.options.data_dir = "gs://bucket/st5_data"
    st5_jax.data.options.strict = True
    st5_jax.data.options.tfds_data_dir = "gs://tfds-data/datasets"   # TFDS-backed tasks
    st5_jax.data.options.decontaminate = False   # keep public examples that share a text with evaluation sets

Environment: ST5_DATA_DIR, ST5_VOCAB (see st5_jax.paths), ST5_DATA_STRICT=1 and
ST5_DATA_DECONTAMINATE=0. `data_dir()` below is the one place that decides where the data
folder is (gin, else $ST5_DATA_DIR); paths.data_dir and the commands ask it.
Everything is resolved when a dataset is built, never at import, so importing the
`tasks` package works without any data present.
"""

from __future__ import annotations

import dataclasses
import os

import gin

from st5_jax import paths

STRICT_ENV = "ST5_DATA_STRICT"
DECONTAMINATE_ENV = "ST5_DATA_DECONTAMINATE"
PREPARED_DIRNAME = "prepared"
GIN_DATA_DIR = "st5_jax.data.options.data_dir"


@dataclasses.dataclass(frozen=True)
class Options:
  data_dir: str | None
  vocab: str | None
  strict: bool
  max_reported: int
  tfds_data_dir: str | None = None
  decontaminate: bool = True


@gin.configurable("options", module="st5_jax.data")
def options(data_dir: str | None = None, vocab: str | None = None, strict: bool | None = None,
            max_reported: int = 5, tfds_data_dir: str | None = None, decontaminate: bool | None = None) -> Options:
  """Data options; unbound values fall back to the environment."""
  if strict is None:
    strict = os.environ.get(STRICT_ENV, "").lower() in ("1", "true", "yes")
  if decontaminate is None:
    decontaminate = os.environ.get(DECONTAMINATE_ENV, "1").lower() not in ("0", "false", "no")
  return Options(data_dir=data_dir, vocab=vocab, strict=bool(strict), max_reported=max_reported,
                 tfds_data_dir=tfds_data_dir, decontaminate=bool(decontaminate))


def data_dir(explicit: str | os.PathLike | None = None, *, required: bool = True) -> str | None:
  """Where the data lives: the one place that decides, for the tasks, the trainer's STS-B dev
  evaluation, the vocabulary fallback and every command.

  `explicit` (a command's --data_dir), else gin `st5_jax.data.options.data_dir`, else
  $ST5_DATA_DIR; local or gs://. required: the folder must exist (a missing one is a
  MissingFileError that says what to set); otherwise None when nothing is set, and a set
  folder is returned unchecked (e.g. `st5 data prepare` creates it).
  """
  if explicit:
    value, source = os.fspath(explicit), "argument"
  elif options().data_dir:
    value, source = options().data_dir, f"gin {GIN_DATA_DIR}"
  elif os.environ.get(paths.DATA_DIR_ENV):
    value, source = os.environ[paths.DATA_DIR_ENV], paths.DATA_DIR_ENV
  elif required:
    raise paths.MissingFileError(
        f"No data directory given. Pass --data_dir, set {paths.DATA_DIR_ENV} (or gin {GIN_DATA_DIR}) to a folder "
        f"(local or gs://) in {paths.LAYOUT_HINT}.")
  else:
    return None
  p = paths.path(value)
  if required and not p.is_dir():
    raise paths.MissingFileError(f"Data directory {p} does not exist (from {source}). It should be a folder in "
                                 f"{paths.LAYOUT_HINT}.")
  return os.fspath(p)


def prepared_dir(base: str | None = None) -> str:
  return paths.join(base or data_dir(), PREPARED_DIRNAME)


def vocab_path() -> str:
  return paths.vocab_path(options().vocab)


def strict() -> bool:
  return options().strict
