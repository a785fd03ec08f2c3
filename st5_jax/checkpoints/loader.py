"""What kind of model is at a path, and loading it: the one owner of both.

Formats (local or gs://, all through st5_jax.paths):
  native                 this project's work dirs and model folders (st5_config.json + orbax)
  savedmodel             SavedModels written by `st5 export` (saved_model.pb)
  sentence_transformers  sentence-transformers folders (modules.json)
  hf                     Hugging Face T5 folders (config.json with model_type t5)
  t5x                    legacy T5X checkpoints (msgpack `checkpoint` + zarr arrays)

Training init (`run.init_from`), `SentenceEncoder.load`, `st5 eval` and `st5 export` all
call `detect_format` / `load_model` here. Folder formats read by libraries that only
open local files (safetensors, torch, TensorFlow's SavedModel loader) are copied from
gs:// to a local temporary folder first; orbax and T5X arrays are read in place.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Callable

import jax

from st5_jax import paths
from st5_jax.checkpoints import hf, native, savedmodel, sentence_transformers, t5x, tree
from st5_jax.configs import ST5Config
from st5_jax.model import st5 as st5_model

log = logging.getLogger(__name__)

FORMATS = ("native", "savedmodel", "sentence_transformers", "hf", "t5x")
SAVEDMODEL_FILE = "saved_model.pb"
ST_MODULES_FILE = "modules.json"
HF_CONFIG_FILE = "config.json"


def detect_format(path: paths.PathLike) -> str:
  """One of FORMATS; FileNotFoundError for a missing path, ValueError for an unknown one."""
  p = os.fspath(paths.path(path))
  if not paths.exists(p):
    raise FileNotFoundError(f"Model path {p} does not exist")
  if native.root(p) is not None:
    return "native"
  if paths.is_dir(p):
    if paths.is_file(paths.join(p, SAVEDMODEL_FILE)):
      return "savedmodel"
    if paths.is_file(paths.join(p, ST_MODULES_FILE)):
      return "sentence_transformers"
    if hf.is_hf_t5_folder(p):
      return "hf"
  if t5x.looks_like_t5x(p):
    return "t5x"
  raise ValueError(
      f"Cannot tell the format of {p}: expected an st5_jax work dir or model folder "
      f"({native.CONFIG_FILE}), a SavedModel ({SAVEDMODEL_FILE}), a sentence-transformers folder "
      f"({ST_MODULES_FILE}), a Hugging Face T5 folder ({HF_CONFIG_FILE} with model_type t5), or a T5X "
      "checkpoint (msgpack `checkpoint`).")


def local_folder(path: paths.PathLike) -> str:
  """A local copy of a folder-format model (the folder itself when it is local)."""
  return paths.local_dir(path)


def read_flat(path: paths.PathLike, fmt: str) -> tuple[ST5Config, dict[str, Any]]:
  """(config as stored, unscanned T5X-named arrays) of a model of format `fmt`."""
  if fmt == "native":
    return native.load_flat(path)
  if fmt == "savedmodel":
    return savedmodel.load_flat(local_folder(path))
  if fmt == "sentence_transformers":
    config, flat, _ = sentence_transformers.load_folder(local_folder(path))
    return config, flat
  if fmt == "hf":
    t5_cfg, flat, unknown = hf.load_folder(local_folder(path))
    if unknown:
      log.warning("%s: ignoring non-T5 tensors %s", path, unknown[:10])
    return ST5Config(t5=t5_cfg, pooling="enc_mean", embedding_dim=None), flat
  if fmt == "t5x":
    t5_cfg, proj_dim, flat = t5x.load(path)
    return ST5Config(t5=t5_cfg, pooling="enc_mean", embedding_dim=proj_dim), flat
  raise ValueError(f"Unknown model format {fmt!r}; known: {FORMATS}")


def load_model(path: paths.PathLike, *, pooling: str | None = None, embedding_dim: int | None | str = "auto",
               fresh_projection: bool = False, rng: jax.Array | None = None,
               t5_overrides: dict[str, Any] | None = None, init_missing_head: bool = False,
               head_prefixes: tuple[str, ...] = (),
               abstract_fn: Callable[[ST5Config], Any] | None = None,
               init_fn: Callable[[ST5Config, jax.Array], Any] | None = None, towers: str | None = None,
               ) -> tuple[ST5Config, dict[str, Any], tree.LoadReport, str]:
  """(config, numpy parameter tree, load report, format) of any supported checkpoint.

  `pooling` overrides the checkpoint's (required for raw T5 checkpoints that do not
  say); `embedding_dim="auto"` keeps the checkpoint's projection (none for raw T5);
  an int adds a freshly initialised projection of that size when the checkpoint has
  none, or when `fresh_projection` is set (the start of contrastive training).
  `t5_overrides` replaces numerics fields (dtype, dropout_rate, scan_layers, ...).
  `head_prefixes`, `abstract_fn(config)`, `init_fn(config, rng)`: a training objective's
  module (the tower plus heads of its own, e.g. ConSERT's `nli_classifier/`) instead of
  the tower: the heads' arrays are loaded when the checkpoint has them, else initialised
  from `rng`. Without them (inference, export) a checkpoint's training heads are reported
  unused and dropped.

  Layer-attention models: `pooling="enc_first"` / `"enc_mean"` removes the attention
  head at inference (the last layer's first token / mean, then the trained projection);
  `pooling="layer_attention"` on a checkpoint without the head is refused unless
  `init_missing_head` (the start of training, which initialises it from `rng`).

  `towers` (st5_jax.configs.TOWERS; None keeps the checkpoint's): a shared checkpoint loaded into
  asymmetric towers gives both sides the same arrays, a projection it lacks (or a fresh one) initialised
  once and copied to both sides, so the model starts as the shared tower (as t5x_retrieval's ADE starts both
  towers from one T5). An asymmetric checkpoint loads only into its own towers.
  """
  path = os.fspath(paths.path(path))
  fmt = detect_format(path)
  config, flat = read_flat(path, fmt)
  src = f"{fmt} checkpoint {path}"

  changes: dict[str, Any] = {}
  if pooling is not None:
    changes["pooling"] = pooling
  fresh: tuple[str, ...] = ()
  split = towers is not None and towers != config.towers
  if split and config.towers != "shared":
    raise ValueError(f"{path} has asymmetric towers (towers={config.towers!r}); it loads only as "
                     f"towers={config.towers!r}, not {towers!r}")
  if fresh_projection:
    if config.asymmetric:
      raise ValueError(f"{path} has asymmetric towers (towers={config.towers!r}): a fresh projection "
                       "(init_projection='fresh') is only for a shared checkpoint")
    flat = {k: v for k, v in flat.items() if not k.startswith("projection_layer/")}
  has_projection = any(st5_model.is_projection_name(k) for k in flat)
  if embedding_dim != "auto":
    if has_projection and embedding_dim != config.embedding_dim:
      raise ValueError(f"{path} has a projection to {config.embedding_dim} dims; asked for {embedding_dim} "
                       "(pass fresh_projection=True to replace it)")
    changes["embedding_dim"] = embedding_dim
    if embedding_dim is not None and not has_projection:
      fresh = ("projection_layer/",)
  if changes.get("pooling", config.pooling) == "layer_attention" and not any(
      st5_model.strip_tower(k).startswith("layer_attention/") for k in flat):
    if not init_missing_head:
      raise ValueError(f"{path} has no layer-attention head (it was trained with {config.pooling} pooling), "
                       "so pooling='layer_attention' would encode with random attention weights. Train one "
                       "(st5 train with st5_model.pooling='layer_attention' and run.init_from) or load it "
                       "with its own pooling.")
    fresh += ("layer_attention/",)
  if t5_overrides:
    changes["t5"] = config.t5.replace(**t5_overrides)
  fresh += tuple(head_prefixes)
  config = config.replace(**changes)
  params, report = tree.assemble(config, flat, source=src, fresh_ok=fresh,
                                 rng=rng if rng is not None else jax.random.PRNGKey(0),
                                 abstract_fn=(lambda: abstract_fn(config)) if abstract_fn else None,
                                 init_fn=(lambda key: init_fn(config, key)) if init_fn else None)
  if split:  # the shared tower just assembled (fresh parts initialised once), copied to both sides
    config = config.replace(towers=towers)
    params, _ = tree.assemble(config, st5_model.split_towers(tree.flatten(params), towers), source=src,
                              abstract_fn=(lambda: abstract_fn(config)) if abstract_fn else None,
                              init_fn=(lambda key: init_fn(config, key)) if init_fn else None)
  return config, params, report, fmt


def model_step(path: paths.PathLike, fmt: str) -> int | None:
  """The checkpoint step a native path loads (latest committed unless a step dir); else None."""
  return native.step_to_load(path)[1] if fmt == "native" else None


def resolve_vocab(path: paths.PathLike, fmt: str, explicit: paths.PathLike | None = None) -> str:
  """The vocabulary of a model: `explicit`, its folder(s), $ST5_VOCAB, $ST5_DATA_DIR."""
  if explicit:
    return paths.vocab_path(explicit)
  p = paths.path(path)
  model_dir = p if paths.is_dir(p) else p.parent
  candidates = [model_dir]
  if fmt == "native":
    candidates = [paths.path(native.root(path))] + candidates
  for d in candidates:
    try:
      return paths.vocab_path(None, model_dir=d)
    except paths.MissingFileError:
      continue
  return paths.vocab_path(None, model_dir=model_dir)  # raises with the full message
