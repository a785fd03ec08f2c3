"""Evaluation inside a training run: the run's sharded parameters, one compiled encoder.

The training parameters stay where they are (sharded over the mesh, possibly over
several processes); every process calls the encoder with the same texts and gets the
same embeddings back. Batches have one fixed shape per length bucket, so the encoder
is compiled once per bucket for the whole run, not at every evaluation.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Sequence

import jax
import numpy as np
from jax.sharding import Mesh

from st5_jax import multihost, partitioning
from st5_jax import vocab as vocab_lib
from st5_jax.inference import length_bucket
from st5_jax.evaluation.sts import sts_dev_spearman

log = logging.getLogger(__name__)


class ShardedEncoder:
  """texts -> float32 [N, D] embeddings with parameters laid out as in training.

  Call with the same texts on every process (a collective runs per batch). The batch
  is split over the mesh's batch axes; the output is replicated, so each process reads
  all of it locally.
  """

  def __init__(self, encode: Callable[[Any, jax.Array], jax.Array], *, param_keys: Sequence[str], max_length: int,
               mesh: Mesh, param_shardings: Any, tokenizer: vocab_lib.Tokenizer, batch_size: int = 128):
    """encode(params, tokens_BxL) -> emb_BxD: the tower in inference mode, handed over by the trainer.

    param_keys: the top-level parameter subtrees it reads (training may hold more: a head).
    """
    shards = partitioning.num_batch_shards(mesh)
    self.batch_size = max(shards, -(-batch_size // shards) * shards)  # a multiple of the batch shards
    self.max_length = max_length
    self.tokenizer = tokenizer
    self.mesh = mesh
    self._in_sharding = partitioning.batch_sharding(mesh)
    self._keys = tuple(param_keys)
    param_shardings = {k: param_shardings[k] for k in self._keys}
    self._apply = jax.jit(encode, in_shardings=(param_shardings, self._in_sharding),
                          out_shardings=partitioning.replicated(mesh))
    self._compiled = {}  # (B, L) -> executable: one compile per length bucket for the run

  def __call__(self, params: Any, texts: Sequence[str]) -> np.ndarray:
    params = {k: params[k] for k in self._keys}
    rows = self.tokenizer.encode(list(texts), max_length=self.max_length)
    order = np.argsort([-len(r) for r in rows], kind="stable")
    out_NxD = None
    B = self.batch_size
    with jax.set_mesh(self.mesh):
      for start in range(0, len(rows), B):
        idx = order[start:start + B]
        L = length_bucket(max(len(rows[i]) for i in idx), self.max_length)
        tokens_BxL = vocab_lib.pad_batch([rows[i] for i in idx] + [[]] * (B - len(idx)), L)
        batch = jax.make_array_from_callback(tokens_BxL.shape, self._in_sharding, lambda i: tokens_BxL[i])
        if tokens_BxL.shape not in self._compiled:
          self._compiled[tokens_BxL.shape] = multihost.compile_together(self._apply, params, batch,
                                                                        name=f"encode_{B}x{L}")
        emb_BxD = np.asarray(self._compiled[tokens_BxL.shape](params, batch).addressable_data(0), np.float32)
        if out_NxD is None:
          out_NxD = np.zeros((len(rows), emb_BxD.shape[1]), np.float32)
        out_NxD[idx] = emb_BxD[: len(idx)]
    return out_NxD if out_NxD is not None else np.zeros((0, 0), np.float32)


class StsDevEvaluator:
  """STS-B dev Spearman x100 of the training parameters (every process gets the same value)."""

  def __init__(self, encoder: ShardedEncoder, *, data_dir):
    self.encoder = encoder
    self.data_dir = data_dir

  def __call__(self, params: Any) -> float:
    return float(sts_dev_spearman(lambda texts: self.encoder(params, texts), data_dir=self.data_dir))
