"""Data configuration: data folder, vocabulary, strictness. Gin-bindable, env as fallback.

Gin (entry points only):

    st5_jax.data.options.data_dir = "gs://bucket/st5_data"
    st5_jax.data.options.strict = True
    st5_jax.data.options.tfds_data_dir = "gs://tfds-data/datasets"   # TFDS-backed tasks
    st5_jax.data.options.decontaminate = False   # keep public examples that share a text with evaluation sets

Environment: ST5_DATA_DIR, ST5_VOCAB (see st5_jax.paths), ST5_DATA_STRICT=1 and
ST5_DATA_DECONTAMINATE=0. Where the data folder is (argument, else gin, else $ST5_DATA_DIR)
is decided in one place, st5_jax.paths.resolve_data_dir: this module declares the gin
parameter and hands its value to paths when imported; `data_dir()` below is paths'.
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
GIN_DATA_DIR = paths.GIN_DATA_DIR


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
  """Where the data lives (argument, gin `st5_jax.data.options.data_dir`, $ST5_DATA_DIR), as a
  string: st5_jax.paths.resolve_data_dir, which reads the gin binding through the hook below."""
  return paths.resolve_data_dir(explicit, required=required)


paths.set_configured_data_dir(lambda: options().data_dir)


def prepared_dir(base: str | None = None) -> str:
  return paths.join(base or data_dir(), PREPARED_DIRNAME)


def vocab_path() -> str:
  return paths.vocab_path(options().vocab)


def strict() -> bool:
  return options().strict
