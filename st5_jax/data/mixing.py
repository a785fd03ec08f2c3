"""Mixing tasks: a deterministic schedule proportional to the mixture's rates.

Item j of task t is due at (j + 1/2) / rate_t; examples are taken in due order. Any
window holds each task's share to within one example, and the continuation depends
only on the examples consumed per task, which is what keeps the iterator state small
and identical on every process. A seqio.Mixture's rates (numbers or rate functions,
sub-mixtures included) are read through `Mixture.get_rate`, so the proportions are
seqio's; the order is this schedule rather than tf.data's random sampling.
"""

from __future__ import annotations

import numpy as np
import seqio

from st5_jax.batch_geometry import DataConfigError


def tasks_and_rates(provider: seqio.DatasetProviderBase) -> tuple[list[seqio.Task], np.ndarray]:
  """The tasks of a task or mixture (sub-mixtures flattened) and their rates."""
  if isinstance(provider, seqio.Mixture):
    tasks = list(provider.tasks)
    rates = np.asarray([float(provider.get_rate(t)) for t in tasks], np.float64)
  else:
    tasks, rates = [provider], np.ones(1, np.float64)
  if not tasks:
    raise DataConfigError(f"Mixture {provider.name} has no tasks.")
  if not np.all(np.isfinite(rates)) or np.any(rates < 0) or rates.sum() <= 0:
    raise DataConfigError(f"Mixture {provider.name} has invalid rates {rates.tolist()}.")
  return tasks, rates


def schedule(positions: np.ndarray, rates: np.ndarray, n: int, limits: np.ndarray | None = None) -> np.ndarray:
  """Task ids of the next n examples of a mixture.

  Item j of task t is due at time (j + 0.5) / rate_t; examples are taken in order of
  due time (ties to the lower task id). The order depends only on `positions`, so a
  restored iterator continues the exact sequence, and each task's share of any
  window is within one example of its rate. `limits` caps each task (one epoch).
  """
  ids, times = [], []
  for t, (pos, rate) in enumerate(zip(positions, rates)):
    avail = n if limits is None else max(0, min(n, int(limits[t] - pos)))
    if avail == 0 or rate <= 0:
      continue
    j = np.arange(avail, dtype=np.float64)
    times.append((pos + j + 0.5) / rate)
    ids.append(np.full(avail, t, np.int64))
  if not ids:
    return np.zeros(0, np.int64)
  times_all, ids_all = np.concatenate(times), np.concatenate(ids)
  order = np.lexsort((ids_all, times_all))[:n]
  return ids_all[order]
