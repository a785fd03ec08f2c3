"""Reading back a TF SavedModel written by `st5 export` (st5_jax.export.savedmodel writes it).

Layout of DIR (besides saved_model.pb and variables/):

    assets/spiece.model       the SentencePiece vocabulary
    assets/st5_config.json    the ST5Config of the exported tower
    assets/st5_export.json    parameter names (T5X, unscanned) in variable order, metadata

`load_flat` rebuilds T5X-named arrays from the variables without JAX or tracing (only
TensorFlow's checkpoint reader), so every st5_jax tool (`SentenceEncoder.load`, training
`init_from`, `st5 export` of an export) reads an export back through
st5_jax.checkpoints.loader, as it reads the other formats. The writer imports the layout
from here; nothing here imports the exporter.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
from typing import Any

import numpy as np

from st5_jax.configs import ST5Config

VOCAB_FILE = "spiece.model"
CONFIG_FILE = "st5_config.json"
EXPORT_FILE = "st5_export.json"
ASSETS_DIR = "assets"
# Checkpoint key of the i-th entry of the exported module's `params` list.
VARIABLE_KEY = "params/{}/.ATTRIBUTES/VARIABLE_VALUE"
PROMPT_SIGNATURE_PREFIX = "prompt_"


def prompt_signature_key(name: str) -> str:
  """The signature that prepends prompt `name`: "prompt_" + the name, other characters than letters, digits
  and _ written as _ ("query" -> "prompt_query")."""
  return PROMPT_SIGNATURE_PREFIX + re.sub(r"[^A-Za-z0-9_]", "_", name)


def assets(path: str | os.PathLike) -> pathlib.Path:
  return pathlib.Path(path) / ASSETS_DIR


def is_export(path: str | os.PathLike) -> bool:
  """True for a SavedModel written by `export` (not any SavedModel)."""
  return (pathlib.Path(path) / "saved_model.pb").is_file() and (assets(path) / EXPORT_FILE).is_file()


def _require_export(path: str | os.PathLike) -> None:
  if not (pathlib.Path(path) / "saved_model.pb").is_file():
    raise FileNotFoundError(f"{path} is not a SavedModel (no saved_model.pb)")
  if not (assets(path) / EXPORT_FILE).is_file():
    raise ValueError(f"{path} is a SavedModel but not one written by `st5 export` "
                     f"({ASSETS_DIR}/{EXPORT_FILE} is missing), so its parameters cannot be read back. "
                     "It may still be called from TensorFlow directly.")


def read_config(path: str | os.PathLike) -> ST5Config:
  _require_export(path)
  return ST5Config.from_dict(json.loads((assets(path) / CONFIG_FILE).read_text()))


def read_metadata(path: str | os.PathLike) -> dict[str, Any]:
  _require_export(path)
  return json.loads((assets(path) / EXPORT_FILE).read_text())


def load_flat(path: str | os.PathLike) -> tuple[ST5Config, dict[str, np.ndarray]]:
  """Config and unscanned, T5X-named float32 arrays read from the SavedModel's variables."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top  (the checkpoint reader only; no graph is traced)

  config = read_config(path)
  meta = read_metadata(path)
  reader = tf.train.load_checkpoint(str(pathlib.Path(path) / "variables" / "variables"))
  flat = {}
  for i, (name, shape) in enumerate(zip(meta["param_names"], meta["param_shapes"])):
    value = np.asarray(reader.get_tensor(VARIABLE_KEY.format(i)), np.float32)
    if list(value.shape) != list(shape):
      raise ValueError(f"{path}: variable {i} ({name}) has shape {value.shape}, "
                       f"{EXPORT_FILE} says {tuple(shape)}")
    flat[name] = value
  return config, flat
