"""The device mesh and the rules that map logical axis names to it.

Model code names axes (`embed`, `mlp`, `heads`, `joined_kv`, `vocab`, ...); this
module alone decides where they go. Mesh axes:

  data   pure data parallelism (parameters replicated)
  fsdp   data parallelism whose shards also hold a slice of every parameter and
         its optimizer state (ZeRO-3 style: the `embed` axis is split over it)
  model  tensor parallelism (heads / MLP / vocab split across chips)

The batch is split over ("data", "fsdp"). Optimizer-state shardings are derived from
the parameters' specs here (t5x's approach) by the optimizer, which knows which
parameter dimension each statistic keeps (st5_jax.optim.state_shardings).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from st5_jax import batch_geometry

MESH_AXES = ("data", "fsdp", "model")
BATCH_AXES = ("data", "fsdp")

# (logical axis, mesh axis or None). First match wins (flax semantics).
DEFAULT_RULES: tuple[tuple[str, Any], ...] = (
    ("batch", BATCH_AXES),
    ("vocab", "model"),
    ("embed", "fsdp"),
    ("mlp", "model"),
    ("heads", "model"),
    ("joined_kv", "model"),
    ("kv", None),
    ("relpos_buckets", None),
    ("layers", None),
    ("length", None),
    ("affinity", None),
)


class PartitioningError(ValueError):
  """A mesh or sharding that cannot work; raised before anything compiles."""


@dataclasses.dataclass(frozen=True)
class MeshConfig:
  """Sizes of the mesh axes; one of them may be -1 (= all remaining devices)."""

  data: int = -1
  fsdp: int = 1
  model: int = 1

  def shape(self, num_devices: int) -> tuple[int, int, int]:
    sizes = [self.data, self.fsdp, self.model]
    if sizes.count(-1) > 1:
      raise PartitioningError(f"At most one mesh axis may be -1, got {self}")
    if -1 in sizes:
      known = math.prod(s for s in sizes if s != -1)
      if known <= 0 or num_devices % known:
        raise PartitioningError(f"Mesh {self} cannot fill {num_devices} devices: {num_devices} is not "
                                f"divisible by {known}")
      sizes[sizes.index(-1)] = num_devices // known
    if math.prod(sizes) != num_devices or min(sizes) < 1:
      raise PartitioningError(
          f"Mesh data={sizes[0]} x fsdp={sizes[1]} x model={sizes[2]} needs {math.prod(sizes)} devices, "
          f"but {num_devices} are available ({jax.default_backend()}). Set the mesh in the gin file "
          f"(MeshConfig.data/fsdp/model), or use -1 for one axis.")
    return tuple(sizes)


def make_mesh(config: MeshConfig = MeshConfig(), devices: Sequence[jax.Device] | None = None) -> Mesh:
  devices = list(devices if devices is not None else jax.devices())
  shape = config.shape(len(devices))
  # Auto axes: shardings are propagated by XLA from the explicit in/out shardings and
  # the logical constraints (not JAX's sharding-in-types "explicit" mode).
  auto = (jax.sharding.AxisType.Auto,) * len(MESH_AXES)
  if len(devices) > 1 and devices[0].platform != "cpu":
    try:  # topology-aware device order on TPU/GPU slices (also compile-only AOT devices)
      return Mesh(mesh_utils.create_device_mesh(shape, devices=devices), MESH_AXES, axis_types=auto)
    except Exception:  # noqa: BLE001  (fall back to the plain order)
      pass
  return Mesh(np.asarray(devices).reshape(shape), MESH_AXES, axis_types=auto)


def num_batch_shards(mesh: Mesh) -> int:
  return math.prod(mesh.shape[a] for a in BATCH_AXES)


def check_batch_size(global_batch_size: int, mesh: Mesh) -> None:
  """The batch over BATCH_AXES and the processes; the data side's check (one rule, one place)."""
  batch_geometry.check_global_batch_size(global_batch_size, mesh=mesh, data_axes=BATCH_AXES)


def batch_sharding(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P(BATCH_AXES))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def param_specs(boxed_params: Any, rules=DEFAULT_RULES) -> Any:
  """Mesh PartitionSpecs of a boxed (logically annotated) parameter tree."""
  return nn.logical_to_mesh(nn.get_partition_spec(boxed_params), rules)


def _axis_size(mesh: Mesh, entry) -> int:
  if entry is None:
    return 1
  names = entry if isinstance(entry, tuple) else (entry,)
  return math.prod(mesh.shape[n] for n in names)


def check_divisible(abstract: Any, specs: Any, mesh: Mesh) -> None:
  """Every sharded dimension must divide by its mesh axes; name the parameter otherwise."""
  problems = []
  flat_shapes = jax.tree_util.tree_flatten_with_path(abstract)[0]
  flat_specs = jax.tree.leaves(specs, is_leaf=lambda x: isinstance(x, P))
  for (path, leaf), spec in zip(flat_shapes, flat_specs):
    for dim, entry in zip(leaf.shape, tuple(spec)):
      size = _axis_size(mesh, entry)
      if dim % size:
        problems.append(f"{jax.tree_util.keystr(path)} dim {dim} over mesh axis {entry} (size {size})")
  if problems:
    raise PartitioningError("Parameter dimensions not divisible by their mesh axes: " + "; ".join(problems) +
                            ". Change the mesh shape or the logical axis rules.")


def param_shardings(boxed_abstract_params: Any, mesh: Mesh, rules=DEFAULT_RULES) -> Any:
  """NamedShardings for the (unboxed) parameter tree; checks divisibility."""
  specs = param_specs(boxed_abstract_params, rules)
  check_divisible(nn.unbox(boxed_abstract_params), specs, mesh)
  return jax.tree.map(lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda x: isinstance(x, P))


def with_rules(rules=DEFAULT_RULES):
  """Context manager: activation constraints (`nn.with_logical_constraint`) use these rules."""
  return nn.logical_axis_rules(rules)


def rules_from_pairs(pairs: Mapping[str, Any] | Sequence[tuple[str, Any]]) -> tuple[tuple[str, Any], ...]:
  items = pairs.items() if isinstance(pairs, Mapping) else pairs
  return tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in items)
