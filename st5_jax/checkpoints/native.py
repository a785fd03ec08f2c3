"""This project's model folders and work dirs.

Layout (one format for training work dirs and saved models):

    DIR/st5_config.json           the ST5Config (model architecture and pooling)
    DIR/spiece.model              the vocabulary, copied in so the folder is self-contained
    DIR/checkpoints/<step>/       orbax CheckpointManager steps, items:
        params/                   the parameter tree (StandardSave)
        opt_state/                optimizer state (training only)
        meta/                     JSON: step, data-iterator position, rng, run info

A step directory is only listed by orbax once it is committed, so a checkpoint
half-written by a crash is never restored.
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any

import numpy as np
from etils import epath

from st5_jax.checkpoints.tree import flatten, unstack_layers
from st5_jax.configs import ST5Config

CONFIG_FILE = "st5_config.json"
CHECKPOINT_DIR = "checkpoints"
VOCAB_FILE = "spiece.model"


def _root(path: str | os.PathLike) -> pathlib.Path | None:
  """The model folder for `path`, which may also be one of its step directories."""
  p = pathlib.Path(path)
  if (p / CONFIG_FILE).is_file():
    return p
  if p.name.isdigit() and (p.parent.parent / CONFIG_FILE).is_file():
    return p.parent.parent
  return None


def is_native(path: str | os.PathLike) -> bool:
  return not str(path).startswith("gs://") and _root(path) is not None


def read_config(path: str | os.PathLike) -> ST5Config:
  return ST5Config.from_dict(json.loads((_root(path) / CONFIG_FILE).read_text()))


def write_config(directory: str | os.PathLike, config: ST5Config) -> None:
  d = epath.Path(directory)  # local or gs://
  d.mkdir(parents=True, exist_ok=True)
  tmp = d / (CONFIG_FILE + ".tmp")
  tmp.write_text(config.to_json())
  tmp.replace(d / CONFIG_FILE)


def copy_vocab(directory: str | os.PathLike, vocab_file: str) -> None:
  dst = epath.Path(directory) / VOCAB_FILE
  if not dst.exists():
    dst.write_bytes(epath.Path(vocab_file).read_bytes())


def vocab_dirs(path: str | os.PathLike) -> list[str]:
  root = _root(path)
  return [str(root)] if root else []


def checkpoint_manager(directory: str | os.PathLike, *, item_handlers=None, **options):
  import orbax.checkpoint as ocp
  if options.get("read_only"):
    options.setdefault("create", False)
    options.setdefault("save_interval_steps", 0)
  path = str(directory) if "://" in str(directory) else os.path.abspath(str(directory))
  return ocp.CheckpointManager(epath.Path(path) / CHECKPOINT_DIR, item_handlers=item_handlers,
                               options=ocp.CheckpointManagerOptions(**options))


def _step_to_load(path: str | os.PathLike) -> tuple[pathlib.Path, int]:
  root = _root(path)
  p = pathlib.Path(path)
  if p != root:  # a step directory was given
    return root, int(p.name)
  mngr = checkpoint_manager(root, read_only=True)
  steps = mngr.all_steps()
  mngr.close()
  if not steps:
    raise FileNotFoundError(f"{root} has {CONFIG_FILE} but no committed checkpoint under {CHECKPOINT_DIR}/")
  return root, max(steps)


def load_params(path: str | os.PathLike) -> tuple[ST5Config, Any, int]:
  """(config, parameter tree as stored, step) of the latest (or given) step."""
  import orbax.checkpoint as ocp

  import jax

  root, step = _step_to_load(path)
  config = read_config(root)
  mngr = checkpoint_manager(root, read_only=True, item_handlers={"params": ocp.StandardCheckpointHandler()})
  try:
    # Restore onto this process's first device whatever mesh wrote it (e.g. a pod slice).
    meta = mngr.item_metadata(step)["params"]
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    target = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device), meta)
    restored = mngr.restore(step, args=ocp.args.Composite(params=ocp.args.StandardRestore(target)))
  finally:
    mngr.close()
  return config, restored["params"], step


def load_flat(path: str | os.PathLike) -> tuple[ST5Config, dict[str, np.ndarray]]:
  """Config and unscanned, T5X-named numpy arrays (the common importer format)."""
  config, params, _ = load_params(path)
  flat = {k: np.asarray(v) for k, v in flatten(params).items()}
  return config, unstack_layers(flat)


def save_model(directory: str | os.PathLike, config: ST5Config, params: Any, *, step: int = 0,
               vocab_file: str | None = None, meta: dict[str, Any] | None = None) -> str:
  """Writes a self-contained model folder (inference only: no optimizer state)."""
  import orbax.checkpoint as ocp

  write_config(directory, config)
  if vocab_file:
    copy_vocab(directory, vocab_file)
  mngr = checkpoint_manager(directory, max_to_keep=1)
  mngr.save(step, args=ocp.args.Composite(params=ocp.args.StandardSave(params),
                                          meta=ocp.args.JsonSave(meta or {"step": step})), force=True)
  mngr.wait_until_finished()
  mngr.close()
  return str(directory)
