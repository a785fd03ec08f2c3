"""Batch geometry: how a global batch splits over the mesh's data axes and the processes.

The one place that checks a batch size against a mesh (st5_jax.partitioning delegates
here) and that decides which shard of the data each process reads (st5_jax.data.iterator
asks it). It sits below both: it imports only JAX, so the mesh side (partitioning) does
not depend on the input pipeline (st5_jax.data), nor the pipeline on the model's
partitioning rules. DataConfigError, the pipeline's error for an inconsistent batch size,
mesh, task or iterator state, is defined here for the same reason (also exported as
st5_jax.data.DataConfigError).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping, Sequence

import jax
from jax.sharding import NamedSharding, PartitionSpec


class DataConfigError(ValueError):
  """Inconsistent batch size, mesh, task or iterator state; raised before any compilation."""


def num_data_shards(mesh: jax.sharding.Mesh, data_axes: Sequence[str]) -> int:
  missing = [a for a in data_axes if a not in mesh.shape]
  if missing:
    raise DataConfigError(f"data_axes {tuple(data_axes)} name axes {missing} that the mesh lacks; "
                          f"mesh axes are {dict(mesh.shape)}.")
  return math.prod(mesh.shape[a] for a in data_axes)


def check_global_batch_size(global_batch_size: int, *, mesh: jax.sharding.Mesh, data_axes: Sequence[str],
                            process_count: int | None = None) -> None:
  """Raises DataConfigError unless the batch splits evenly over data shards and processes."""
  process_count = jax.process_count() if process_count is None else process_count
  shards = num_data_shards(mesh, data_axes)
  if global_batch_size <= 0:
    raise DataConfigError(f"global_batch_size must be positive, got {global_batch_size}.")
  if global_batch_size % shards:
    lo = global_batch_size - global_batch_size % shards
    raise DataConfigError(
        f"global_batch_size={global_batch_size} is not divisible by the number of data shards {shards} "
        f"(mesh axes {tuple(data_axes)} of sizes {[mesh.shape[a] for a in data_axes]}); "
        f"use a multiple of {shards}, e.g. {lo or shards} or {lo + shards}.")
  if global_batch_size % process_count:
    raise DataConfigError(f"global_batch_size={global_batch_size} is not divisible by the number of "
                          f"processes {process_count}; each process feeds an equal slice.")


def batch_sharding(mesh: jax.sharding.Mesh, data_axes: Sequence[str], ndim: int) -> NamedSharding:
  """The batch dimension over `data_axes`, every other dimension replicated."""
  return NamedSharding(mesh, PartitionSpec(tuple(data_axes), *([None] * (ndim - 1))))


@dataclasses.dataclass(frozen=True)
class ReaderAssignment:
  """Which shard of the data this process reads and how many rows it feeds per batch."""
  reader_id: int
  num_readers: int
  local_batch_size: int


def reader_assignment(*, mesh: jax.sharding.Mesh, data_axes: Sequence[str], global_batch_size: int,
                      process_index: int | None = None) -> ReaderAssignment:
  """Derives this process's shard from the batch rows its devices hold.

  Processes holding the same rows (data replicated across processes) read the same
  shard; in the plain data-parallel case reader_id == process_index.
  """
  process_index = jax.process_index() if process_index is None else process_index
  sharding = batch_sharding(mesh, data_axes, 1)
  rows_of: dict[int, list[tuple[int, int]]] = {}
  for device, index in sharding.devices_indices_map((global_batch_size,)).items():
    s = index[0]
    rows_of.setdefault(device.process_index, []).append(
        (s.start or 0, global_batch_size if s.stop is None else s.stop))
  return assign_readers(rows_of, process_index, mesh_shape=dict(mesh.shape))


def assign_readers(rows_of: Mapping[int, Sequence[tuple[int, int]]], process_index: int, *,
                   mesh_shape: Mapping[str, int] | None = None) -> ReaderAssignment:
  """Reader ids from the batch rows [start, stop) that each process's devices hold."""
  ranges = {}
  for p, spans in rows_of.items():
    spans = sorted(set(spans))
    merged = [list(spans[0])]
    for a, b in spans[1:]:
      if a <= merged[-1][1]:
        merged[-1][1] = max(merged[-1][1], b)
      else:
        merged.append([a, b])
    if len(merged) != 1:
      raise DataConfigError(
          f"Process {p} holds non-contiguous batch rows {merged} on mesh {mesh_shape}; order the mesh's "
          "devices so that each process's devices are adjacent along the data axes "
          "(jax.experimental.mesh_utils.create_device_mesh does this).")
    ranges[p] = tuple(merged[0])
  distinct = sorted(set(ranges.values()))
  sizes = {b - a for a, b in distinct}
  if len(sizes) != 1 or any(x[1] > y[0] for x, y in zip(distinct, distinct[1:])):
    raise DataConfigError(f"Processes hold overlapping or unequal batch slices {distinct} on mesh {mesh_shape}.")
  mine = ranges[process_index]
  return ReaderAssignment(reader_id=distinct.index(mine), num_readers=len(distinct),
                          local_batch_size=mine[1] - mine[0])
