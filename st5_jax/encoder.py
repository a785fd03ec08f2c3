"""SentenceEncoder: load any supported model and turn sentences into embeddings.

    enc = SentenceEncoder.load("path/to/model")
    emb_NxD = enc.encode(["A sentence.", "Another one."])   # float32, L2-normalised

Formats (detected): this project's work dirs and exported model folders, Hugging Face
T5 folders (T5EncoderModel / T5ForConditionalGeneration), sentence-transformers folders,
legacy T5X checkpoints (file or directory, local or gs://), and SavedModels written by
`st5 export`.

Sentences are tokenised with the T5 vocabulary, truncated (EOS kept) and padded to a
length bucket (powers of two up to `max_length`), sorted by length so each batch pads
little, and the model is jit-compiled once per (batch, length) bucket.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from st5_jax import paths
from st5_jax import vocab as vocab_lib
from st5_jax.checkpoints import tree
from st5_jax.configs import ST5Config

log = logging.getLogger(__name__)

MIN_BUCKET = 8


def default_dtype() -> str:
  """bfloat16 activations on accelerators, float32 on CPU."""
  return "float32" if jax.default_backend() == "cpu" else "bfloat16"


def length_bucket(n: int, max_length: int) -> int:
  b = MIN_BUCKET
  while b < n:
    b *= 2
  return min(b, max_length)


def detect_format(path: str | os.PathLike) -> str:
  """One of: native, savedmodel, sentence_transformers, hf, t5x."""
  from st5_jax.checkpoints import hf, native, sentence_transformers, t5x

  p = str(path)
  if not p.startswith("gs://") and not os.path.exists(p):
    raise FileNotFoundError(f"Model path {p} does not exist")
  if native.is_native(p):
    return "native"
  if not p.startswith("gs://") and os.path.isfile(os.path.join(p, "saved_model.pb")):
    return "savedmodel"
  if not p.startswith("gs://") and sentence_transformers.is_st_folder(p):
    return "sentence_transformers"
  if not p.startswith("gs://") and hf.is_hf_t5_folder(p):
    return "hf"
  if t5x.looks_like_t5x(p):
    return "t5x"
  raise ValueError(
      f"Cannot tell the format of {p}: expected an st5_jax work dir or model folder "
      "(st5_config.json), a SavedModel (saved_model.pb), a sentence-transformers folder "
      "(modules.json), a Hugging Face T5 folder (config.json with model_type t5), or a T5X "
      "checkpoint (msgpack `checkpoint`).")


def load_model(path: str | os.PathLike, *, pooling: str | None = None, embedding_dim: int | None | str = "auto",
               fresh_projection: bool = False, rng: jax.Array | None = None,
               t5_overrides: dict[str, Any] | None = None, init_missing_head: bool = False,
               ) -> tuple[ST5Config, dict[str, Any], tree.LoadReport, str]:
  """(config, numpy parameter tree, load report, format) of any supported checkpoint.

  `pooling` overrides the checkpoint's (required for raw T5 checkpoints that do not
  say); `embedding_dim="auto"` keeps the checkpoint's projection (none for raw T5);
  an int adds a freshly initialised projection of that size when the checkpoint has
  none, or when `fresh_projection` is set (the start of contrastive training).
  `t5_overrides` replaces numerics fields (dtype, dropout_rate, scan_layers, ...).

  Layer-attention models: `pooling="enc_first"` / `"enc_mean"` removes the attention
  head at inference (the last layer's first token / mean, then the trained projection);
  `pooling="layer_attention"` on a checkpoint without the head is refused unless
  `init_missing_head` (the start of training, which initialises it from `rng`).
  """
  from st5_jax.checkpoints import hf, native, sentence_transformers, t5x

  fmt = detect_format(path)
  src = f"{fmt} checkpoint {path}"
  if fmt == "native":
    config, flat = native.load_flat(path)
  elif fmt == "savedmodel":
    from st5_jax.export import savedmodel
    config, flat = savedmodel.load_flat(path)
  elif fmt == "sentence_transformers":
    config, flat, _ = sentence_transformers.load_folder(path)
  elif fmt == "hf":
    t5_cfg, flat, unknown = hf.load_folder(path)
    if unknown:
      log.warning("%s: ignoring non-T5 tensors %s", path, unknown[:10])
    config = ST5Config(t5=t5_cfg, pooling="enc_mean", embedding_dim=None)
  else:
    t5_cfg, proj_dim, flat = t5x.load(path)
    config = ST5Config(t5=t5_cfg, pooling="enc_mean", embedding_dim=proj_dim)

  changes: dict[str, Any] = {}
  if pooling is not None:
    changes["pooling"] = pooling
  fresh: tuple[str, ...] = ()
  if fresh_projection:
    flat = {k: v for k, v in flat.items() if not k.startswith("projection_layer/")}
  has_projection = "projection_layer/kernel" in flat
  if embedding_dim != "auto":
    if has_projection and embedding_dim != config.embedding_dim:
      raise ValueError(f"{path} has a projection to {config.embedding_dim} dims; asked for {embedding_dim} "
                       "(pass fresh_projection=True to replace it)")
    changes["embedding_dim"] = embedding_dim
    if embedding_dim is not None and not has_projection:
      fresh = ("projection_layer/",)
  if changes.get("pooling", config.pooling) == "layer_attention" and not any(
      k.startswith("layer_attention/") for k in flat):
    if not init_missing_head:
      raise ValueError(f"{path} has no layer-attention head (it was trained with {config.pooling} pooling), "
                       "so pooling='layer_attention' would encode with random attention weights. Train one "
                       "(st5 train with st5_model.pooling='layer_attention' and run.init_from) or load it "
                       "with its own pooling.")
    fresh += ("layer_attention/",)
  if t5_overrides:
    changes["t5"] = config.t5.replace(**t5_overrides)
  config = config.replace(**changes)
  params, report = tree.assemble(config, flat, source=src, fresh_ok=fresh,
                                 rng=rng if rng is not None else jax.random.PRNGKey(0))
  return config, params, report, fmt


class SentenceEncoder:
  """A Sentence-T5 tower with its tokenizer; `encode` maps strings to embeddings."""

  def __init__(self, config: ST5Config, params: Any, *, tokenizer: vocab_lib.Tokenizer,
               source: str = "", report: tree.LoadReport | None = None, max_batch_size: int = 64):
    from st5_jax.model.st5 import SentenceT5

    self.config = config
    self.tokenizer = tokenizer
    self.source = source
    self.report = report
    self.max_batch_size = max_batch_size
    self.params = jax.device_put(jax.tree.map(jnp.asarray, params))
    model = SentenceT5(config)
    self._apply = jax.jit(lambda p, tokens_BxL: model.apply({"params": p}, tokens_BxL))

  @classmethod
  def load(cls, path: str | os.PathLike, *, pooling: str | None = None, vocab: str | None = None,
           max_length: int | None = None, dtype: str | None = None, batch_size: int = 64) -> "SentenceEncoder":
    """Loads any supported format; see module docstring."""
    path = str(path)
    fmt = detect_format(path)
    if fmt == "savedmodel":
      from st5_jax.export.savedmodel import SavedModelEncoder
      fixed = {k: v for k, v in dict(pooling=pooling, max_length=max_length, vocab=vocab).items() if v is not None}
      if fixed:
        raise ValueError(f"{', '.join(fixed)} of a SavedModel are fixed at export time; re-export with "
                         "`st5 export --pooling/--max_length/--vocab` instead.")
      return SavedModelEncoder(path, batch_size=batch_size)
    config, params, report, fmt = load_model(path, pooling=pooling,
                                             t5_overrides={"dtype": dtype or default_dtype()})
    if max_length is not None:
      config = config.replace(max_length=max_length)
    model_dir = path if os.path.isdir(path) else os.path.dirname(path)
    candidates = [model_dir]
    if fmt == "native":
      from st5_jax.checkpoints import native
      candidates = native.vocab_dirs(path) + candidates
    vocab_file = None
    for d in candidates:
      try:
        vocab_file = paths.vocab_path(vocab, model_dir=d)
        break
      except paths.MissingFileError:
        continue
    if vocab_file is None:
      vocab_file = paths.vocab_path(vocab, model_dir=model_dir)  # raises with the full message
    return cls(config, params, tokenizer=vocab_lib.Tokenizer(vocab_file), source=f"{fmt}:{path}",
               report=report, max_batch_size=batch_size)

  @property
  def dim(self) -> int:
    return self.config.output_dim

  def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
    return self.tokenizer.encode(texts, max_length=self.config.max_length)

  def encode_tokens(self, tokens_BxL: np.ndarray) -> np.ndarray:
    return np.asarray(self._apply(self.params, jnp.asarray(tokens_BxL, jnp.int32)), np.float32)

  def encode(self, texts: Sequence[str], batch_size: int | None = None, *,
             show_progress: bool = False) -> np.ndarray:
    """float32 [len(texts), dim] embeddings (L2-normalised), in input order."""
    if isinstance(texts, str):
      raise TypeError("encode() takes a list of strings, not a single string")
    texts = list(texts)
    batch_size = batch_size or self.max_batch_size
    out_NxD = np.zeros((len(texts), self.dim), np.float32)
    if not texts:
      return out_NxD
    rows = self.tokenize(texts)
    order = np.argsort([-len(r) for r in rows], kind="stable")
    starts = range(0, len(texts), batch_size)
    progress = None
    if show_progress:
      from tqdm import tqdm
      progress = tqdm(total=len(texts), desc="encode", unit="sent")
    for start in starts:
      idx = order[start:start + batch_size]
      L = length_bucket(max(len(rows[i]) for i in idx), self.config.max_length)
      # Pad the batch dimension to a power of two (at most batch_size) to bound recompiles.
      B = max(len(idx), min(batch_size, length_bucket(len(idx), 1 << 30)))
      tokens_BxL = vocab_lib.pad_batch([rows[i] for i in idx] + [[]] * (B - len(idx)), L)
      out_NxD[idx] = self.encode_tokens(tokens_BxL)[: len(idx)]
      if progress:
        progress.update(len(idx))
    if progress:
      progress.close()
    return out_NxD

  __call__ = encode

