"""What every inference path shares: padded length buckets and the activation dtype default.

Used by the JAX `SentenceEncoder` (st5_jax/encoder.py: the fine buckets), training's
in-loop STS-B dev evaluation and the SavedModel graph (st5_jax/export/savedmodel.py: powers
of two, a handful of lengths for TF to compile). Padding never changes an embedding (masked
keys, masked mean); the buckets only bound how many shapes get compiled.
"""

from __future__ import annotations

import jax

MIN_LENGTH_BUCKET = 8


def _next_bucket(b: int, fine: bool) -> int:
  if not fine:
    return b * 2
  return b * 3 // 2 if b & (b - 1) == 0 else b * 4 // 3  # 8, 12, 16, 24, 32, 48, ...


def length_bucket(n: int, max_length: int, *, fine: bool = False) -> int:
  """The padded length of a batch whose longest row has n tokens, capped at max_length.

  fine=False: 8, 16, 32, ... (powers of two). fine=True: 8, 12, 16, 24, 32, 48, ... (at most
  1.5x padding, twice the buckets; on the 2,758 STS-B test sentences, batch 64, it pads 15%
  fewer tokens than powers of two, docs/performance.md).
  """
  b = MIN_LENGTH_BUCKET
  while b < n:
    b = _next_bucket(b, fine)
  return min(b, max_length)


def length_buckets(max_length: int, *, fine: bool = False) -> list[int]:
  """Every value `length_bucket(n, max_length, fine=fine)` takes, ascending."""
  out, b = [], MIN_LENGTH_BUCKET
  while b < max_length:
    out.append(b)
    b = _next_bucket(b, fine)
  return out + [max_length]


def default_dtype() -> str:
  """Activation dtype when none is given: bfloat16 on accelerators, float32 on CPU."""
  return "float32" if jax.default_backend() == "cpu" else "bfloat16"
