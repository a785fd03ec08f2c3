"""Ahead-of-time fit check: compile the real train step for a TPU topology on this host.

With libtpu installed (the `tpu` extra), `jax.experimental.topologies` describes a TPU
slice without owning one; the trainer's own `build()` (same gin, same shardings, same
step) is lowered with abstract inputs and compiled for it. Nothing is allocated.
XLA's memory analysis gives per-chip bytes; FLOPs are the objective's analytic count
(`Objective.step_flops`) because XLA's cost analysis counts a scanned layer body only
once. The batch is what the objective declares it reads (`Objective.features`).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import time
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.experimental import topologies

from st5_jax import objectives, partitioning, train

GIB = 1024 ** 3


@dataclasses.dataclass(frozen=True)
class ChipSpec:
  hbm_bytes: int  # per JAX device
  peak_bf16_flops: float  # per JAX device


# Per JAX device (v4/v5p megacore: one device per chip; v2/v3: one per core).
CHIPS = {
    "TPU v2": ChipSpec(8 * GIB, 22.5e12),
    "TPU v3": ChipSpec(16 * GIB, 61.5e12),
    "TPU v4": ChipSpec(32 * GIB, 275e12),
    "TPU v5 lite": ChipSpec(16 * GIB, 197e12),
    "TPU v5e": ChipSpec(16 * GIB, 197e12),
    "TPU v5": ChipSpec(95 * GIB, 459e12),  # v5p
    "TPU v5p": ChipSpec(95 * GIB, 459e12),
    "TPU v6 lite": ChipSpec(32 * GIB, 918e12),  # v6e
    "TPU v6e": ChipSpec(32 * GIB, 918e12),
}

# Slice names -> topology names (as in Cloud TPU docs / MaxText's table).
_SLICE_DIMS = {8: "2x2x1", 16: "2x2x2", 32: "2x2x4", 64: "2x4x4", 128: "4x4x4", 256: "4x4x8",
               512: "4x8x8", 1024: "8x8x8", 2048: "8x8x16", 4096: "8x16x16"}
_SLICE_2D = {4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16", 256: "16x16"}


def topology_for_slice(slice_name: str) -> str:
  """'v4-256' -> 'v4:4x4x8'; 'v5p-128' -> 'v5:4x4x4'; 'v5e-16' -> 'v5e:4x4'."""
  m = re.fullmatch(r"(v4|v5p|v5e|v6e)-(\d+)", slice_name)
  if not m:
    raise ValueError(f"Unknown slice {slice_name!r} (expected e.g. v4-64, v5p-128, v5e-16, v6e-64)")
  gen, n = m[1], int(m[2])
  if gen in ("v4", "v5p"):
    dims = _SLICE_DIMS.get(n)
    prefix = "v4" if gen == "v4" else "v5"
  else:
    dims = _SLICE_2D.get(n)
    prefix = gen
  if dims is None:
    raise ValueError(f"No topology known for {slice_name}")
  return f"{prefix}:{dims}"


def get_topology(topology: str):
  """TopologyDescription for e.g. 'v4:4x4x8' (needs libtpu; no TPU hardware)."""
  # libtpu guards TPU hardware with a lockfile; a compile-only client on a CPU host
  # must neither take it from, nor wait for, other JAX processes, nor ask for GCE metadata.
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
  # libtpu 0.0.42's convolution cost model recurses deeply on the compiler's fiber stacks
  # and intermittently overflows them (SIGSEGV) for T5.1.1 XL/XXL-sized dots; larger
  # fiber stacks avoid it. Must be set before libtpu initialises.
  flag = "--fibers_default_thread_stack_size="
  if flag not in os.environ.get("LIBTPU_INIT_ARGS", ""):
    os.environ["LIBTPU_INIT_ARGS"] = f"{os.environ.get('LIBTPU_INIT_ARGS', '')} {flag}{32 << 20}".strip()
  gen, _, dims = topology.partition(":")
  shape = [int(x) for x in dims.split("x")]
  megacore = gen in ("v4", "v5")
  if len(shape) == 2:
    shape.append(1)
  wrap = tuple(megacore and min(shape) >= 4 for _ in shape)
  try:
    return topologies.get_topology_desc(
        platform="tpu", topology_name=topology, chip_config_name="megacore" if megacore else "default",
        chips_per_host_bounds=(2, 2, 1), num_slices=1, wrap=wrap)
  except Exception as e:  # noqa: BLE001
    raise RuntimeError(f"Cannot describe TPU topology {topology!r}: {e}. AOT compilation needs libtpu: "
                       "install the `tpu` extra (pip install -e '.[tpu]').") from e


def chip_spec(device) -> ChipSpec:
  kind = device.device_kind
  for name in sorted(CHIPS, key=len, reverse=True):
    if kind.startswith(name):
      return CHIPS[name]
  raise ValueError(f"No HBM/peak figures for device kind {kind!r}")


@dataclasses.dataclass
class AotReport:
  name: str
  topology: str
  devices: int
  device_kind: str
  mesh: dict[str, int]
  global_batch_size: int
  lengths: dict[str, int]
  params: int
  argument_bytes: int
  output_bytes: int
  alias_bytes: int
  temp_bytes: int
  generated_code_bytes: int
  hbm_bytes: int
  step_flops: float
  utilisation: float
  predicted_step_seconds: float
  compile_seconds: float

  @property
  def total_bytes(self) -> int:
    # Donated inputs alias outputs: count them once.
    return self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes

  @property
  def fits(self) -> bool:
    return self.total_bytes <= self.hbm_bytes

  def as_dict(self) -> dict[str, Any]:
    d = dataclasses.asdict(self)
    d.update(total_bytes=self.total_bytes, fits=self.fits)
    return d

  def table(self) -> str:
    g = lambda b: f"{b / GIB:.2f} GiB"  # noqa: E731
    rows = [
        ("run", self.name), ("topology", f"{self.topology} ({self.devices} x {self.device_kind})"),
        ("mesh", " x ".join(f"{k}={v}" for k, v in self.mesh.items())),
        ("batch / lengths", f"{self.global_batch_size} / {self.lengths}"),
        ("parameters", f"{self.params / 1e9:.3f} B"),
        ("per-chip arguments", g(self.argument_bytes)), ("per-chip outputs", g(self.output_bytes)),
        ("  aliased (donated)", g(self.alias_bytes)), ("per-chip temporaries", g(self.temp_bytes)),
        ("per-chip total", f"{g(self.total_bytes)} of {g(self.hbm_bytes)} HBM "
                           f"({100 * self.total_bytes / self.hbm_bytes:.0f}%)"),
        ("FLOPs per step", f"{self.step_flops:.3e} (model FLOPs, all chips)"),
        (f"step time at {self.utilisation:.0%} MFU", f"{self.predicted_step_seconds:.3f} s"),
        ("compile time", f"{self.compile_seconds:.1f} s"),
        ("fits", "yes" if self.fits else "NO"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def _feature_lengths(data: Any) -> dict[str, int]:
  lengths = getattr(data, "feature_lengths", None)
  if not lengths:
    raise ValueError("AOT needs DataConfig.feature_lengths (TASK_FEATURE_LENGTHS) to shape the batch")
  return dict(lengths)


def abstract_batch(mesh, global_batch_size: int, lengths: dict[str, int], *,
                   objective: Any) -> dict[str, jax.ShapeDtypeStruct]:
  """The step's batch as abstract arrays: the features `objective` (an Objective or a registered name)
  reads, sharded on the batch axes."""
  objective = objectives.get(objective)
  sharding = partitioning.batch_sharding(mesh)
  return {name: jax.ShapeDtypeStruct(f.shape(global_batch_size, lengths), jnp.dtype(f.dtype), sharding=sharding)
          for name, f in objective.required_lengths(lengths).items()}


@dataclasses.dataclass
class _OomStats:
  argument_size_in_bytes: int = 0
  output_size_in_bytes: int = 0
  alias_size_in_bytes: int = 0
  temp_size_in_bytes: int = 0
  generated_code_size_in_bytes: int = 0


def _oom_as_memory_stats(message: str) -> _OomStats | None:
  """'... HLO temporaries (89.30G) exceeds available HBM (30.75G)' -> temporaries of 89.30 GiB."""
  if "RESOURCE_EXHAUSTED" not in message:
    return None
  m = re.search(r"required for ([\w ]+?) \(([\d.]+)([KMGT])\)", message)
  if not m:
    return None
  scale = {"K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30, "T": 2 ** 40}[m[3]]
  return _OomStats(temp_size_in_bytes=int(float(m[2]) * scale))


def compile_for_devices(spec, devices, *, name: str, topology: str, utilisation: float = 0.5) -> AotReport:
  """Compiles `spec`'s train step for `devices` (real, or from a topology description)."""
  mesh = partitioning.make_mesh(spec.mesh, devices=devices)
  tc = spec.train_config
  setup = train.build(spec.model, tc, mesh, spec.rules)
  state = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                       setup.abstract_state, setup.state_shardings)
  lengths = _feature_lengths(spec.data)
  batch = abstract_batch(mesh, tc.global_batch_size, lengths, objective=setup.objective)
  start = time.perf_counter()
  chip = chip_spec(devices[0])
  with jax.set_mesh(mesh):
    lowered = setup.step_fn.lower(state, batch)
    try:
      mem = lowered.compile().memory_analysis()
    except jax.errors.JaxRuntimeError as e:
      # The TPU compiler refuses programs that cannot fit; report it like any other misfit.
      mem = _oom_as_memory_stats(str(e))
      if mem is None:
        raise
  compile_seconds = time.perf_counter() - start
  step_flops = setup.objective.step_flops(spec.model, global_batch_size=tc.global_batch_size, lengths=lengths)
  n_params = sum(math.prod(x.shape) for x in jax.tree.leaves(nn.unbox(setup.boxed_params)))
  return AotReport(
      name=name, topology=topology, devices=len(devices), device_kind=devices[0].device_kind,
      mesh=dict(mesh.shape), global_batch_size=tc.global_batch_size, lengths=lengths, params=n_params,
      argument_bytes=mem.argument_size_in_bytes, output_bytes=mem.output_size_in_bytes,
      alias_bytes=mem.alias_size_in_bytes, temp_bytes=mem.temp_size_in_bytes,
      generated_code_bytes=mem.generated_code_size_in_bytes, hbm_bytes=chip.hbm_bytes, step_flops=step_flops,
      utilisation=utilisation,
      predicted_step_seconds=step_flops / len(devices) / (chip.peak_bf16_flops * utilisation),
      compile_seconds=compile_seconds)


def compile_for_topology(spec, *, topology: str | None = None, name: str = "", utilisation: float = 0.5) -> AotReport:
  target = spec.target or {}
  topology = topology or target.get("topology") or (target.get("slice") and topology_for_slice(target["slice"]))
  if not topology:
    raise ValueError("No topology: pass --topology (e.g. v4:4x4x8) or set run.target = {'topology': ...} in gin")
  topo = get_topology(topology)
  return compile_for_devices(spec, list(topo.devices), name=name, topology=topology, utilisation=utilisation)
