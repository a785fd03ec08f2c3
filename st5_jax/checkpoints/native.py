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
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from st5_jax import paths, vocab
from st5_jax.checkpoints.tree import flatten, unstack_layers
from st5_jax.configs import ST5Config

CONFIG_FILE = "st5_config.json"
CHECKPOINT_DIR = "checkpoints"
VOCAB_FILE = "spiece.model"
BEST_DIR = "best"  # WORKDIR/best: the best evaluated parameters (early stopping), a model folder of its own
CHECKPOINT_CHOICES = ("auto", "latest", "best")


def root(path: paths.PathLike) -> str | None:
  """The model folder for `path` (which may also be one of its step directories), or None."""
  p = paths.path(path)
  if paths.is_file(p / CONFIG_FILE):
    return os.fspath(p)
  if p.name.isdigit() and paths.is_file(p.parent.parent / CONFIG_FILE):
    return os.fspath(p.parent.parent)
  return None


def choose_checkpoint(path: paths.PathLike, which: str = "auto") -> str:
  """The model folder to load for `which` of a work dir: "latest" (its newest step), "best" (WORKDIR/best,
  written when early stopping is on), or "auto": best when the work dir has one, else latest.
  Anything that is not a work dir (a step directory, another format) is returned unchanged."""
  if which not in CHECKPOINT_CHOICES:
    raise ValueError(f"checkpoint must be one of {CHECKPOINT_CHOICES}, got {which!r}")
  path = os.fspath(paths.path(path))
  folder = root(path)
  if folder is None or folder != path or paths.path(folder).name == BEST_DIR:
    if which == "best" and (folder is None or paths.path(folder).name != BEST_DIR):
      raise FileNotFoundError(f"--checkpoint best needs a work dir; {path} is not one.")
    return path
  best = paths.join(folder, BEST_DIR)
  has_best = paths.is_file(paths.join(best, CONFIG_FILE)) and bool(committed_steps(best))
  if which == "best" and not has_best:
    raise FileNotFoundError(f"{folder} has no best checkpoint ({best}); it is written during training when "
                            "TrainConfig.early_stopping is set.")
  return best if (which == "best" or (which == "auto" and has_best)) else path


def read_config(path: paths.PathLike) -> ST5Config:
  return ST5Config.from_dict(json.loads(paths.read_text(paths.join(root(path), CONFIG_FILE))))


def write_config(directory: paths.PathLike, config: ST5Config) -> None:
  paths.write_text(paths.join(directory, CONFIG_FILE), config.to_json())


def copy_vocab(directory: paths.PathLike, vocab_file: str) -> None:
  dst = paths.join(directory, VOCAB_FILE)
  if not paths.exists(dst):
    paths.write_bytes(dst, vocab.model_proto(vocab_file))  # a tokenizer.json is converted


def checkpoint_manager(directory: paths.PathLike, *, item_handlers=None, **options) -> ocp.CheckpointManager:
  if options.get("read_only"):
    options.setdefault("create", False)
    options.setdefault("save_interval_steps", 0)
  return ocp.CheckpointManager(paths.path(directory) / CHECKPOINT_DIR, item_handlers=item_handlers,
                               options=ocp.CheckpointManagerOptions(**options))


def committed_steps(folder: paths.PathLike) -> list[int]:
  """Steps orbax has finalised under DIR/checkpoints (no CheckpointManager: it warns when read-only)."""
  return sorted(ocp.path.step.checkpoint_steps(paths.path(folder) / CHECKPOINT_DIR))


def step_to_load(path: paths.PathLike) -> tuple[str, int]:
  """(model folder, step): the step directory given, else the latest committed step."""
  folder = root(path)
  if folder is None:
    raise FileNotFoundError(f"{path} is not an st5_jax model folder or work dir (no {CONFIG_FILE})")
  if os.fspath(paths.path(path)) != folder:  # a step directory was given
    return folder, int(paths.path(path).name)
  steps = committed_steps(folder)
  if not steps:
    raise FileNotFoundError(f"{folder} has {CONFIG_FILE} but no committed checkpoint under {CHECKPOINT_DIR}/")
  return folder, max(steps)


def load_params(path: paths.PathLike) -> tuple[ST5Config, Any, int]:
  """(config, parameter tree as stored, step) of the latest (or given) step.

  Restores only the `params` item, with a StandardCheckpointer on its directory: a
  CheckpointManager would warn about the `meta` / `opt_state` items it is not asked for
  (and about being read-only) on every load.
  """
  folder, step = step_to_load(path)
  config = read_config(folder)
  item = paths.path(folder) / CHECKPOINT_DIR / str(step) / "params"
  if not paths.is_dir(item):
    raise FileNotFoundError(f"{item} does not exist: step {step} of {folder} has no params item")
  # The item's handler, not a Checkpointer: the step-level _CHECKPOINT_METADATA is the
  # manager's, and a Checkpointer on the item directory warns that it has none.
  handler = ocp.StandardCheckpointHandler()
  try:
    meta = handler.metadata(item)
    # Restore onto this process's first device whatever mesh wrote it (e.g. a pod slice).
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    target = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device), meta)
    params = handler.restore(item, args=ocp.args.StandardRestore(target))
  finally:
    handler.close()
  return config, params, step


def load_flat(path: paths.PathLike) -> tuple[ST5Config, dict[str, np.ndarray]]:
  """Config and unscanned, T5X-named numpy arrays (the common importer format)."""
  config, params, _ = load_params(path)
  flat = {k: np.asarray(v) for k, v in flatten(params).items()}
  return config, unstack_layers(flat)


def save_model(directory: paths.PathLike, config: ST5Config, params: Any, *, step: int = 0,
               vocab_file: str | None = None, meta: dict[str, Any] | None = None) -> str:
  """Writes a self-contained model folder (inference only: no optimizer state)."""
  write_config(directory, config)
  if vocab_file:
    copy_vocab(directory, vocab_file)
  mngr = checkpoint_manager(directory, max_to_keep=1)
  mngr.save(step, args=ocp.args.Composite(params=ocp.args.StandardSave(params),
                                          meta=ocp.args.JsonSave(meta or {"step": step})), force=True)
  mngr.wait_until_finished()
  mngr.close()
  return str(directory)
