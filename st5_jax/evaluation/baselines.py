"""A cheap deterministic encoder for tests and timing the harness: hashed bag of words."""

from __future__ import annotations

import re
import zlib
from typing import Sequence

import numpy as np

_TOKEN = re.compile(r"[a-z0-9]+")


class HashedBagOfWords:
  """Lower-cased word tokens hashed (crc32) into `dim` signed buckets, summed, L2-normalised.

  Deterministic across processes and machines (no Python `hash`). Texts without a
  word token map to the zero vector. `calls` counts encoded texts, for cache tests.
  """

  def __init__(self, dim: int = 64):
    self.dim = dim
    self.calls = 0
    self._buckets: dict[str, tuple[int, float]] = {}

  def _bucket(self, token: str) -> tuple[int, float]:
    hit = self._buckets.get(token)
    if hit is None:
      h = zlib.crc32(token.encode("utf-8"))
      hit = self._buckets[token] = (h % self.dim, 1.0 if (h >> 31) & 1 else -1.0)
    return hit

  def __call__(self, texts: Sequence[str]) -> np.ndarray:
    self.calls += len(texts)
    rows, cols, vals = [], [], []
    for i, text in enumerate(texts):
      for token in _TOKEN.findall(text.lower()):
        j, sign = self._bucket(token)
        rows.append(i)
        cols.append(j)
        vals.append(sign)
    emb_NxD = np.zeros((len(texts), self.dim), np.float32)
    np.add.at(emb_NxD, (np.asarray(rows, np.int64), np.asarray(cols, np.int64)), np.asarray(vals, np.float32))
    norm_N1 = np.linalg.norm(emb_NxD, axis=1, keepdims=True)
    return emb_NxD / np.where(norm_N1 > 0, norm_N1, 1.0)
