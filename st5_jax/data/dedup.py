"""Keeping duplicate texts out of one batch (false negatives for the in-batch softmax).

Each window of batches is rearranged greedily so that no batch holds the same left
text twice or the same right text (targets, hard negatives) twice; rows are compared
by a 64-bit hash of their token ids. Nothing is dropped and batch shapes stay fixed.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

_HASH_MULTIPLIERS = np.random.default_rng(20240611).integers(1, 2**63, 4096, dtype=np.uint64) | np.uint64(1)


def _row_hashes(tokens_BxL: np.ndarray) -> list[int]:
  """64-bit hash of each row's tokens; padding (0) adds nothing, so lengths do not matter.

  A collision (odds ~2^-64 per pair) would only move a row to another batch.
  """
  length = tokens_BxL.shape[1]
  if length > len(_HASH_MULTIPLIERS):
    raise ValueError(f"dedup supports sequences up to {len(_HASH_MULTIPLIERS)} tokens, got {length}")
  with np.errstate(over="ignore"):
    return (tokens_BxL.astype(np.uint64) * _HASH_MULTIPLIERS[:length]).sum(axis=1, dtype=np.uint64).tolist()


def _swap_into(i, keys, batches, left_keys, right_keys, open_batches) -> bool:
  """Places row i in a full batch k by moving one of k's rows to an open batch; False if none fits."""
  lk, rk = keys[i]
  # A text already in every batch cannot be placed cleanly anywhere: do not search.
  if all(lk in keys_j for keys_j in left_keys) or any(all(k in keys_j for keys_j in right_keys) for k in rk):
    return False
  for j in open_batches:
    for k, batch in enumerate(batches):
      if k == j:
        continue
      for pos, r in enumerate(batch):
        lr, rr = keys[r]
        if lr in left_keys[j] or rr & right_keys[j]:
          continue  # r would clash in j
        if (lk in left_keys[k] and lk != lr) or rk & (right_keys[k] - rr):
          continue  # i would clash in k even without r
        batch[pos] = i
        left_keys[k].discard(lr)
        right_keys[k] -= rr
        left_keys[k].add(lk)
        right_keys[k] |= rk
        batches[j].append(r)
        left_keys[j].add(lr)
        right_keys[j] |= rr
        return True
  return False


def dedup_assign(left_BxL: np.ndarray, rights: Sequence[np.ndarray], *, batch_size: int,
                 num_batches: int) -> tuple[list[np.ndarray], int, int]:
  """Splits rows into batches with no repeated left text and no repeated right text per batch.

  Greedy in stream order: each row goes to the earliest batch with room and no clash;
  a row that clashes everywhere swaps with a row of a full batch when that resolves
  both, else goes to the first batch with room and is counted as unresolved.
  Returns (row indices per batch, rows moved, rows unresolved).
  """
  batches = [[] for _ in range(num_batches)]
  left_keys = [set() for _ in range(num_batches)]
  right_keys = [set() for _ in range(num_batches)]
  right_hashes = [_row_hashes(r) for r in rights]
  keys = [(lk, set(rk)) for lk, *rk in zip(_row_hashes(left_BxL), *right_hashes)]
  first_open = 0
  deferred = []
  for i, (lk, rk) in enumerate(keys):
    while first_open < num_batches and len(batches[first_open]) == batch_size:
      first_open += 1
    for j in range(first_open, num_batches):
      if len(batches[j]) < batch_size and lk not in left_keys[j] and not (rk & right_keys[j]):
        batches[j].append(i)
        left_keys[j].add(lk)
        right_keys[j].update(rk)
        break
    else:
      deferred.append(i)
  unresolved = 0
  for i in deferred:
    lk, rk = keys[i]
    open_batches = [j for j in range(num_batches) if len(batches[j]) < batch_size]
    clean = [j for j in open_batches if lk not in left_keys[j] and not (rk & right_keys[j])]
    if clean:
      j = clean[0]
    elif _swap_into(i, keys, batches, left_keys, right_keys, open_batches):
      continue
    else:
      j = open_batches[0]
      unresolved += 1
    batches[j].append(i)
    left_keys[j].add(lk)
    right_keys[j].update(rk)
  moved = sum(1 for j, b in enumerate(batches) for i in b if i // batch_size != j)
  return [np.asarray(b, np.int64) for b in batches], moved, unresolved


