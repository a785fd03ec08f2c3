"""Embeddings of distinct sentences, computed once and shared by every task."""

from __future__ import annotations

import logging
import time
from typing import Callable, Iterable, Sequence

import numpy as np

log = logging.getLogger(__name__)

Encode = Callable[[Sequence[str]], np.ndarray]


class EmbeddingCache:
  """Calls `encode` once per distinct text, in length-sorted chunks; `cache(texts)` -> emb_NxD.

  Sorting by length keeps padding low for any padded encoder, and chunking bounds the
  memory a single `encode` call needs. Embeddings are stored as float32.
  """

  def __init__(self, encode: Encode, *, chunk_size: int = 4096):
    self.encode = encode
    self.chunk_size = chunk_size
    self._index: dict[str, int] = {}
    self._blocks: list[np.ndarray] = []
    self._matrix: np.ndarray | None = None
    self.encode_seconds = 0.0

  def __len__(self) -> int:
    return len(self._index)

  @property
  def dim(self) -> int | None:
    return self._blocks[0].shape[1] if self._blocks else None

  def add(self, texts: Iterable[str]) -> int:
    """Encodes the texts not seen yet; returns how many were new."""
    new = [t for t in dict.fromkeys(texts) if t not in self._index]
    if not new:
      return 0
    new.sort(key=len)
    start = time.perf_counter()
    for i in range(0, len(new), self.chunk_size):
      chunk = new[i:i + self.chunk_size]
      emb_NxD = np.asarray(self.encode(list(chunk)))
      if emb_NxD.ndim != 2 or emb_NxD.shape[0] != len(chunk):
        raise ValueError(f"encode returned shape {emb_NxD.shape} for {len(chunk)} texts; expected [N, D]")
      if self._blocks and emb_NxD.shape[1] != self.dim:
        raise ValueError(f"encode returned dimension {emb_NxD.shape[1]}, earlier {self.dim}")
      if not np.all(np.isfinite(emb_NxD)):
        raise ValueError("encode returned non-finite values")
      offset = len(self._index)
      for j, text in enumerate(chunk):
        self._index[text] = offset + j
      self._blocks.append(emb_NxD.astype(np.float32, copy=False))
      log.info("encoded %d / %d new texts", min(i + self.chunk_size, len(new)), len(new))
    self.encode_seconds += time.perf_counter() - start
    self._matrix = None
    return len(new)

  def __call__(self, texts: Sequence[str]) -> np.ndarray:
    self.add(texts)
    if self._matrix is None:
      self._matrix = np.concatenate(self._blocks, axis=0)
      self._blocks = [self._matrix]
    return self._matrix[[self._index[t] for t in texts]]
