"""Legacy T5X checkpoints: a msgpack `checkpoint` file plus tensorstore/zarr arrays.

Layout (t5x/checkpoints.py, versions 2-3): the msgpack holds
`optimizer/{target,state}` (or `target`/`state` at the top); small arrays are inline,
large ones are replaced by a tensorstore spec whose kvstore (driver `gfile`) names a
directory beside the msgpack file. We read only the parameters (`target`).

Paths may be local or gs:// (st5_jax.paths): the msgpack is read through the path
layer and each `gfile` kvstore becomes the tensorstore kvstore of the array's directory
beside it (`gcs` in the same bucket, or `file`).

Config is inferred from shapes (T5X checkpoints carry none):
heads from the relative-position table, MLP type from `wi` vs `wi_0`/`wi_1`, tied
logits from the absence of `decoder/logits_dense`. `relative_attention_max_distance`
is not recoverable and is taken as 128 (every public T5 checkpoint).
"""

from __future__ import annotations

import os
import re
from typing import Any, Mapping

import numpy as np
import tensorstore as ts
from flax import serialization

from st5_jax import paths
from st5_jax.checkpoints.tree import flatten
from st5_jax.configs import T5Config

MSGPACK_FILE = "checkpoint"


def msgpack_path(path: paths.PathLike) -> str:
  """The msgpack file of a checkpoint given as the file itself or its directory."""
  if paths.is_dir(path):
    candidate = paths.join(path, MSGPACK_FILE)
    if not paths.is_file(candidate):
      raise FileNotFoundError(f"{path} has no T5X `{MSGPACK_FILE}` msgpack file")
    return candidate
  return os.fspath(paths.path(path))


def looks_like_t5x(path: paths.PathLike) -> bool:
  try:
    mp = msgpack_path(path)
  except FileNotFoundError:
    return False
  if not paths.is_file(mp):
    return False
  head = paths.read_head(mp, 64)
  # A msgpack map whose first keys include "optimizer", "target", "state" or "version".
  return head[:1] in (b"\x81", b"\x82", b"\x83", b"\x84", b"\xde") and any(
      k in head for k in (b"optimizer", b"target", b"version", b"state"))


def _is_ts_spec(x: Any) -> bool:
  return isinstance(x, Mapping) and "driver" in x and "kvstore" in x


def _read_ts(spec: Mapping[str, Any], ckpt_dir: str) -> np.ndarray:
  spec = dict(spec)
  spec["kvstore"] = paths.tensorstore_kvstore(paths.join(ckpt_dir, dict(spec["kvstore"])["path"]))
  return np.asarray(ts.open(spec, open=True).result().read().result())


def read_params(path: paths.PathLike) -> dict[str, np.ndarray]:
  """T5X parameters (`target`) as a flat dict of float32 arrays."""
  mp = msgpack_path(path)
  ckpt_dir = os.fspath(paths.path(mp).parent)
  try:
    state = serialization.msgpack_restore(paths.read_bytes(mp))
  except ValueError as e:  # msgpack's errors do not say which file (truncated, corrupt)
    raise ValueError(f"{mp} is not a readable T5X msgpack checkpoint ({e}); the file may be truncated "
                     "or corrupt.") from e
  if not isinstance(state, dict):
    raise ValueError(f"{mp} is not a T5X checkpoint: its msgpack holds a {type(state).__name__}, not a map")
  if "optimizer" in state:
    target = state["optimizer"]["target"]
  elif "target" in state:
    target = state["target"]
  else:
    raise ValueError(f"{mp} is not a T5X checkpoint: no optimizer/target or target key "
                     f"(top-level keys: {sorted(state)})")

  out = {}

  def walk(node, prefix):
    if _is_ts_spec(node):
      out[prefix] = _read_ts(node, ckpt_dir)
    elif isinstance(node, Mapping):
      for k, v in node.items():
        walk(v, f"{prefix}/{k}" if prefix else str(k))
    else:
      out[prefix] = np.asarray(node)

  walk(target, "")
  return {k: v.astype(np.float32) for k, v in out.items()}


def _count_layers(flat: Mapping[str, Any], stack: str) -> int:
  idx = {int(m[1]) for k in flat if (m := re.match(rf"^{stack}/layers_(\d+)/", k))}
  return (max(idx) + 1) if idx else 0


def infer_config(flat: Mapping[str, np.ndarray]) -> tuple[T5Config, int | None]:
  """(T5Config, projection dim or None) from parameter shapes."""
  try:
    vocab, emb = flat["token_embedder/embedding"].shape
    heads, buckets = flat["encoder/relpos_bias/rel_embedding"].shape
    joined = flat["encoder/layers_0/attention/query/kernel"].shape[1]
  except KeyError as e:
    raise ValueError(f"Not a T5 parameter set: {e.args[0]} is missing") from None
  gated = "encoder/layers_0/mlp/wi_0/kernel" in flat
  mlp_dim = flat["encoder/layers_0/mlp/" + ("wi_0" if gated else "wi") + "/kernel"].shape[1]
  n_enc, n_dec = _count_layers(flat, "encoder"), _count_layers(flat, "decoder")
  cfg = T5Config(vocab_size=vocab, emb_dim=emb, num_heads=heads, head_dim=joined // heads, mlp_dim=mlp_dim,
                 num_encoder_layers=n_enc, num_decoder_layers=n_dec or n_enc,
                 mlp_activations=("gelu", "linear") if gated else ("relu",),
                 logits_via_embedding="decoder/logits_dense/kernel" not in flat,
                 relative_attention_num_buckets=buckets)
  proj = flat.get("projection_layer/kernel")
  return cfg, (None if proj is None else int(proj.shape[1]))


def load(path: paths.PathLike) -> tuple[T5Config, int | None, dict[str, np.ndarray]]:
  flat = read_params(path)
  cfg, proj_dim = infer_config(flat)
  return cfg, proj_dim, flat


__all__ = ["load", "read_params", "infer_config", "looks_like_t5x", "msgpack_path", "flatten"]
