"""SentenceEncoder: load any supported model and turn sentences into embeddings.

    enc = SentenceEncoder.load("path/to/model")
    emb_NxD = enc.encode(["A sentence.", "Another one."])   # float32, L2-normalised
    q_QxD = enc.encode_query(["what is T5?"])               # the model's "query" prompt, if it has one
    bits_NxB = enc.encode(texts, truncate_dim=64, precision="ubinary")  # 64 dims, renormalised, packed bits

Asymmetric towers (ST5Config.towers): `encode_query` / `encode_document` (or `encode(..., task="query")`)
encode with their side's tower; `encode` without a task takes the default route, the document side, as
sentence-transformers' `Router.for_query_document` (the exported folder's Router says the same).

Formats (detected): this project's work dirs and exported model folders, Hugging Face
T5 folders (T5EncoderModel / T5ForConditionalGeneration), sentence-transformers folders,
legacy T5X checkpoints (file or directory, local or gs://), and SavedModels written by
`st5 export`.

Sentences are tokenised with the T5 vocabulary, truncated (EOS kept) and padded to a
length bucket (8, 12, 16, 24, 32, 48, ...: powers of two and 1.5x them, up to
`max_length`), sorted by length so each batch pads little, and the model is jit-compiled
once per (batch, length) bucket. Batches are dispatched without waiting for the previous
one, so padding the next batch on the host overlaps the device's work.
"""

from __future__ import annotations

import copy
import logging
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from st5_jax import encode_options, paths
from st5_jax import vocab as vocab_lib
from st5_jax.checkpoints import loader, tree
from st5_jax.configs import ST5Config
from st5_jax.export.savedmodel import SavedModelEncoder
from st5_jax.inference import default_dtype, length_bucket
from st5_jax.model.st5 import SentenceT5

log = logging.getLogger(__name__)

__all__ = ["SentenceEncoder", "encode_length_bucket"]


def encode_length_bucket(n: int, max_length: int) -> int:
  """The padded length `encode` uses: st5_jax.inference's fine buckets 8, 12, 16, 24, ..."""
  return length_bucket(n, max_length, fine=True)


class SentenceEncoder(encode_options.EncodeAliases):
  """A Sentence-T5 tower with its tokenizer; `encode` maps strings to embeddings."""

  def __init__(self, config: ST5Config, params: Any, *, tokenizer: vocab_lib.Tokenizer,
               source: str = "", report: tree.LoadReport | None = None, max_batch_size: int = 64):
    self.config = config
    self.tokenizer = tokenizer
    self.source = source
    self.report = report
    self.max_batch_size = max_batch_size
    self.params = jax.device_put(jax.tree.map(jnp.asarray, params))
    model = SentenceT5(config)
    self._apply = jax.jit(lambda p, tokens_BxL: model.apply({"params": p}, tokens_BxL,
                                                            side=encode_options.route(config, None)))
    # Asymmetric towers: one compiled encoder per side (st5_jax.encode_options.route).
    self._apply_side = {side: jax.jit(lambda p, tokens_BxL, side=side: model.apply({"params": p}, tokens_BxL,
                                                                                  side=side))
                        for side in encode_options.SIDES} if config.asymmetric else {}

  @classmethod
  def load(cls, path: paths.PathLike, *, pooling: str | None = None, vocab: str | None = None,
           max_length: int | None = None, dtype: str | None = None, batch_size: int = 64,
           checkpoint: str = "auto", truncate_dim: int | None = None) -> "SentenceEncoder":
    """Loads any supported format, local or gs://; see module docstring.

    `checkpoint` (work dirs): "latest", "best" (WORKDIR/best, kept by early stopping) or
    "auto" (best when there is one, else latest). `truncate_dim`: what `encode` keeps by default
    (the first dimensions, renormalised when the model normalises; as SentenceTransformer's)."""
    from st5_jax.checkpoints import native  # pylint: disable=g-import-not-at-top
    path = native.choose_checkpoint(path, checkpoint)
    fmt = loader.detect_format(path)
    if fmt == "savedmodel":
      fixed = {k: v for k, v in dict(pooling=pooling, max_length=max_length, vocab=vocab,
                                     truncate_dim=truncate_dim).items() if v is not None}
      if fixed:
        raise ValueError(f"{', '.join(fixed)} of a SavedModel are fixed at export time; re-export with "
                         "`st5 export --pooling/--max_length/--vocab/--truncate_dim` instead (or pass "
                         "truncate_dim to encode).")
      return SavedModelEncoder(path, batch_size=batch_size)
    config, params, report, fmt = loader.load_model(path, pooling=pooling,
                                                    t5_overrides={"dtype": dtype or default_dtype()})
    if max_length is not None:
      config = config.replace(max_length=max_length)
    if truncate_dim is not None:
      config = config.replace(truncate_dim=truncate_dim)
    vocab_file = loader.resolve_vocab(path, fmt, vocab)
    return cls(config, params, tokenizer=vocab_lib.Tokenizer(vocab_file), source=f"{fmt}:{path}",
               report=report, max_batch_size=batch_size)

  @property
  def dim(self) -> int:
    """Size of what `encode` returns (the model's truncate_dim when it has one)."""
    return self.config.encode_dim

  def with_max_length(self, max_length: int) -> "SentenceEncoder":
    """The same model and compiled encoder with another token limit (retrieval queries vs documents)."""
    if max_length < 2:
      raise ValueError(f"max_length must be at least 2 (a token and EOS), got {max_length}")
    other = copy.copy(self)
    other.config = self.config.replace(max_length=max_length)
    return other

  def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
    return self.tokenizer.encode(texts, max_length=self.config.max_length)

  def encode_tokens(self, tokens_BxL: np.ndarray, side: str | None = None) -> np.ndarray:
    """float32 [B, output_dim] of `side`'s tower (asymmetric towers; default: the default route)."""
    apply = self._apply_side[encode_options.route(self.config, side)] if self._apply_side else self._apply
    return np.asarray(apply(self.params, jnp.asarray(tokens_BxL, jnp.int32)), np.float32)

  def _encode_list(self, texts: list[str], batch_size: int | None, show_progress: bool,
                   side: str | None = None) -> np.ndarray:
    """float32 [len(texts), output_dim] embeddings (L2-normalised) of `side`'s tower, in input order; not yet
    truncated."""
    apply = self._apply_side[encode_options.route(self.config, side)] if self._apply_side else self._apply
    batch_size = batch_size or self.max_batch_size
    out_NxD = np.zeros((len(texts), self.config.output_dim), np.float32)
    if not texts:
      return out_NxD
    rows = self.tokenize(texts)
    order = np.argsort([-len(r) for r in rows], kind="stable")
    starts = range(0, len(texts), batch_size)
    progress = None
    if show_progress:
      progress = tqdm(total=len(texts), desc="encode", unit="sent")
    pending = None  # (rows, device result) of the batch in flight
    for start in starts:
      idx = order[start:start + batch_size]
      L = encode_length_bucket(max(len(rows[i]) for i in idx), self.config.max_length)
      # Pad the batch dimension to a power of two (at most batch_size) to bound recompiles.
      B = max(len(idx), min(batch_size, length_bucket(len(idx), 1 << 30)))
      tokens_BxL = vocab_lib.pad_batch([rows[i] for i in idx] + [[]] * (B - len(idx)), L)
      # Dispatch this batch before fetching the previous one: the host never idles the device.
      current = (idx, apply(self.params, jnp.asarray(tokens_BxL, jnp.int32)))
      if pending is not None:
        out_NxD[pending[0]] = np.asarray(pending[1], np.float32)[: len(pending[0])]
        if progress:
          progress.update(len(pending[0]))
      pending = current
    out_NxD[pending[0]] = np.asarray(pending[1], np.float32)[: len(pending[0])]
    if progress:
      progress.update(len(pending[0]))
    if progress:
      progress.close()
    return out_NxD


