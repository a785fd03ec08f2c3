"""Legacy T5X checkpoints: a msgpack `checkpoint` file plus tensorstore/zarr arrays.

Layout (t5x/checkpoints.py, versions 2-3): the msgpack holds
`optimizer/{target,state}` (or `target`/`state` at the top); small arrays are inline,
large ones are replaced by a tensorstore spec whose kvstore (driver `gfile`) names a
directory beside the msgpack file. We read only the parameters (`target`).

gs:// paths work where tensorstore can reach Google Cloud Storage: the msgpack is read
with tf.io.gfile and each `gfile` kvstore becomes a `gcs` kvstore in the same bucket
(not testable on this machine, which has no GCS access).

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

from st5_jax.checkpoints.tree import flatten
from st5_jax.configs import T5Config


def _read_bytes(path: str) -> bytes:
  if path.startswith("gs://"):
    import tensorflow as tf
    with tf.io.gfile.GFile(path, "rb") as f:
      return f.read()
  with open(path, "rb") as f:
    return f.read()


def msgpack_path(path: str | os.PathLike) -> str:
  """The msgpack file of a checkpoint given as the file itself or its directory."""
  path = str(path)
  if path.startswith("gs://"):
    return path if path.endswith("/checkpoint") else path.rstrip("/") + "/checkpoint"
  if os.path.isdir(path):
    candidate = os.path.join(path, "checkpoint")
    if not os.path.isfile(candidate):
      raise FileNotFoundError(f"{path} has no T5X `checkpoint` msgpack file")
    return candidate
  return path


def looks_like_t5x(path: str | os.PathLike) -> bool:
  try:
    mp = msgpack_path(path)
  except FileNotFoundError:
    return False
  if mp.startswith("gs://"):
    return True
  if not os.path.isfile(mp):
    return False
  with open(mp, "rb") as f:
    head = f.read(64)
  # A msgpack map whose first keys include "optimizer", "target", "state" or "version".
  return head[:1] in (b"\x81", b"\x82", b"\x83", b"\x84", b"\xde") and any(
      k in head for k in (b"optimizer", b"target", b"version", b"state"))


def _is_ts_spec(x: Any) -> bool:
  return isinstance(x, Mapping) and "driver" in x and "kvstore" in x


def _read_ts(spec: Mapping[str, Any], ckpt_dir: str) -> np.ndarray:
  import tensorstore as ts
  spec = dict(spec)
  kv = dict(spec["kvstore"])
  rel = kv["path"]
  if ckpt_dir.startswith("gs://"):
    bucket, _, prefix = ckpt_dir[len("gs://"):].partition("/")
    spec["kvstore"] = {"driver": "gcs", "bucket": bucket, "path": f"{prefix}/{rel}".lstrip("/")}
  else:
    spec["kvstore"] = {"driver": "file", "path": os.path.join(ckpt_dir, rel)}
  return np.asarray(ts.open(spec, open=True).result().read().result())


def read_params(path: str | os.PathLike) -> dict[str, np.ndarray]:
  """T5X parameters (`target`) as a flat dict of float32 arrays."""
  from flax import serialization

  mp = msgpack_path(path)
  ckpt_dir = os.path.dirname(mp)
  state = serialization.msgpack_restore(_read_bytes(mp))
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


def load(path: str | os.PathLike) -> tuple[T5Config, int | None, dict[str, np.ndarray]]:
  flat = read_params(path)
  cfg, proj_dim = infer_config(flat)
  return cfg, proj_dim, flat


__all__ = ["load", "read_params", "infer_config", "looks_like_t5x", "msgpack_path", "flatten"]
