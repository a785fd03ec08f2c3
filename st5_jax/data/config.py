"""Data configuration: data folder, vocabulary, strictness. Gin-bindable, env as fallback.

Gin (entry points only):

    st5_jax.data.options.data_dir = "gs://bucket/st5_data"
    st5_jax.data.options.strict = True

Environment: ST5_DATA_DIR, ST5_VOCAB (see st5_jax.paths) and ST5_DATA_STRICT=1.
Everything is resolved when a dataset is built, never at import, so importing the
`tasks` package works without any data present.
"""

from __future__ import annotations

import dataclasses
import os

import gin

from st5_jax import paths

STRICT_ENV = "ST5_DATA_STRICT"
PREPARED_DIRNAME = "prepared"


@dataclasses.dataclass(frozen=True)
class Options:
  data_dir: str | None
  vocab: str | None
  strict: bool
  max_reported: int


@gin.configurable("options", module="st5_jax.data")
def options(data_dir: str | None = None, vocab: str | None = None, strict: bool | None = None,
            max_reported: int = 5) -> Options:
  """Data options; unbound values fall back to the environment."""
  if strict is None:
    strict = os.environ.get(STRICT_ENV, "").lower() in ("1", "true", "yes")
  return Options(data_dir=data_dir, vocab=vocab, strict=bool(strict), max_reported=max_reported)


def data_dir() -> str:
  """The data folder (gin `options.data_dir`, else $ST5_DATA_DIR), local or gs://."""
  return os.fspath(paths.data_dir(options().data_dir))


def prepared_dir(base: str | None = None) -> str:
  return paths.join(base or data_dir(), PREPARED_DIRNAME)


def vocab_path() -> str:
  return paths.vocab_path(options().vocab)


def strict() -> bool:
  return options().strict
