"""Ahead-of-time fit check: compile the real train step for a TPU topology on this host.

With libtpu installed (the `tpu` extra), `jax.experimental.topologies` describes a TPU
slice without owning one; the trainer's own `build()` (same gin, same shardings, same
step) is lowered with abstract inputs and compiled for it. Nothing is allocated.
XLA's memory analysis gives per-chip bytes. The batch is what the objective declares it
reads (`Objective.features`).

The step time is an ESTIMATE, a roofline of the compiled program (`Roofline`):
max(compiled FLOPs / peak, bytes accessed / HBM bandwidth) + collective bytes / ICI bandwidth,
per chip, with the chip figures of `CHIPS`. FLOPs and bytes are XLA's cost analysis of the
compiled program, which counts a while loop's body once; the scanned layers run it once per
layer, so the loop iterations it leaves out are added from a walk of the compiled HLO
(`hlo_costs`), which also sums the collectives. Model FLOPs (`Objective.step_flops`, no
rematerialisation) over that time is the MFU the estimate implies. No TPU has measured it.
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
  """One JAX device: a chip (v4 and v5p run their two TensorCores as one megacore device)."""

  generation: str  # 'v4', 'v5e', 'v5p', 'v6e'
  hbm_bytes: int
  peak_bf16_flops: float  # FLOP/s
  hbm_bytes_per_s: float
  ici_bytes_per_s: float  # what one chip can send over all its ICI links at once (one direction)


# Public per-chip figures, the one place they live (Google Cloud TPU docs, cloud.google.com/tpu/docs/
# v4, v5e, v5p, v6e):
#   v4:  275 TFLOP/s bf16, 32 GiB HBM at 1,200 GB/s; ICI 6 links x 50 GB/s each way (the TPU v4
#        paper, Jouppi et al., ISCA 2023: 400 Gb/s per link and direction) = 300 GB/s out.
#   v5e: 197 TFLOP/s, 16 GB at 819 GB/s; ICI 1,600 Gb/s = 200 GB/s out (4 ports; the docs'
#        "400 GB/s bidirectional" counts both directions).
#   v5p: 459 TFLOP/s, 95 GiB at 2,765 GB/s; ICI 4,800 Gb/s = 600 GB/s out (6 ports; "1,200 GB/s
#        bidirectional").
#   v6e: 918 TFLOP/s, 32 GB at 1,640 GB/s; ICI 3,584 Gb/s = 448 GB/s out (4 ports; "800 GB/s
#        bidirectional").
# HBM is taken as GiB throughout (the TPU compiler refuses a program over its own, slightly lower,
# limit: "available HBM (30.75G)" on a v4). Keys are JAX's device_kind (a compile-only v5p is
# "TPU v5", v5e "TPU v5 lite", v6e "TPU v6 lite").
_V4 = ChipSpec("v4", 32 * GIB, 275e12, 1.2e12, 300e9)
_V5E = ChipSpec("v5e", 16 * GIB, 197e12, 819e9, 200e9)
_V5P = ChipSpec("v5p", 95 * GIB, 459e12, 2.765e12, 600e9)
_V6E = ChipSpec("v6e", 32 * GIB, 918e12, 1.64e12, 448e9)
CHIPS = {
    "TPU v4": _V4,
    "TPU v5 lite": _V5E, "TPU v5e": _V5E,
    "TPU v5": _V5P, "TPU v5p": _V5P,
    "TPU v6 lite": _V6E, "TPU v6e": _V6E,
}

# Slice names -> topology names (Cloud TPU docs). v4-N and v5p-N count TensorCores (2 per chip,
# 3D shapes); v5e-N and v6e-N count chips (2D shapes, at most a 16x16 pod).
_SLICE_DIMS = {8: "2x2x1", 16: "2x2x2", 32: "2x2x4", 64: "2x4x4", 128: "4x4x4", 256: "4x4x8",
               512: "4x8x8", 1024: "8x8x8", 2048: "8x8x16", 4096: "8x16x16"}
_SLICE_2D = {1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16", 256: "16x16"}
# Topology name prefix -> generation.
_PREFIX = {"v4": "v4", "v5": "v5p", "v5p": "v5p", "v5e": "v5e", "v6e": "v6e"}


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


def _parse_topology(topology: str) -> tuple[str, list[int]]:
  prefix, _, dims = topology.partition(":")
  if prefix not in _PREFIX or not re.fullmatch(r"\d+(x\d+){1,2}", dims):
    raise ValueError(f"Unknown TPU topology {topology!r} (expected e.g. v4:4x4x8, v5:2x2x2, v5e:4x4, v6e:16x16)")
  return _PREFIX[prefix], [int(x) for x in dims.split("x")]


def host_bounds(topology: str) -> tuple[int, int, int]:
  """Chips per host (x, y, z) of a slice, as Cloud TPU builds it.

  v4 and v5p: a host is a 2x2x1 tray of 4 chips. v5e and v6e: a slice of up to 8 chips is one
  host (v5e-8 / v6e-8: 2x4 on one VM); larger slices are made of 4-chip VMs, 2x2 each
  (ct5lp-hightpu-4t, ct6e-standard-4t: a v6e 4x4 is 4 VMs).
  """
  gen, shape = _parse_topology(topology)
  if gen in ("v5e", "v6e") and math.prod(shape) <= 8:
    return (*shape, 1)[:3] if len(shape) == 2 else tuple(shape)
  return (2, 2, 1)


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
  gen, shape = _parse_topology(topology)
  megacore = gen in ("v4", "v5p")
  if len(shape) == 2:
    shape.append(1)
  if megacore:  # 3D: wraparound links (a torus) when every side is a multiple of a 4x4x4 cube's
    wrap = tuple(min(shape) >= 4 for _ in shape)
  else:  # 2D: wraparound along a full 16-chip side of the pod only
    wrap = tuple(s == 16 for s in shape)
  try:
    return topologies.get_topology_desc(
        platform="tpu", topology_name=topology, chip_config_name="megacore" if megacore else "default",
        chips_per_host_bounds=host_bounds(topology), num_slices=1, wrap=wrap)
  except Exception as e:  # noqa: BLE001
    raise RuntimeError(f"Cannot describe TPU topology {topology!r}: {e}. AOT compilation needs libtpu: "
                       "install the `tpu` extra (pip install -e '.[tpu]').") from e


def chip_spec(device) -> ChipSpec:
  kind = device.device_kind
  for name in sorted(CHIPS, key=len, reverse=True):
    if kind.startswith(name):
      return CHIPS[name]
  raise ValueError(f"No HBM/peak/bandwidth figures for device kind {kind!r} (known: {', '.join(CHIPS)})")


# --- The roofline ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Roofline:
  """Per-chip step time ESTIMATE: max(compute, HBM traffic) + collectives over ICI.

  A lower bound on compute and memory (peak rates, perfect overlap of the two) and no overlap
  of collectives with either (every collective waits); collectives use every ICI link of the
  chip at once. Not a measurement.
  """

  compute_seconds: float
  memory_seconds: float
  collective_seconds: float

  @property
  def seconds(self) -> float:
    return max(self.compute_seconds, self.memory_seconds) + self.collective_seconds

  @property
  def bound(self) -> str:
    return "compute" if self.compute_seconds >= self.memory_seconds else "HBM bandwidth"


def roofline(*, flops: float, bytes_accessed: float, collective_bytes: float, chip: ChipSpec) -> Roofline:
  """The estimate for one chip's share of a step (all arguments per chip)."""
  return Roofline(compute_seconds=flops / chip.peak_bf16_flops,
                  memory_seconds=bytes_accessed / chip.hbm_bytes_per_s,
                  collective_seconds=collective_bytes / chip.ici_bytes_per_s)


def implied_mfu(model_flops: float, seconds: float, *, chips: int, peak_flops: float) -> float:
  """Model FLOPs of the whole step / (step time x chips x peak FLOP/s per chip): the MFU a step time means."""
  return model_flops / (seconds * chips * peak_flops)


# --- Costs of the compiled HLO ----------------------------------------------------------------

_DTYPE_BYTES = {"pred": 1, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2,
                "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}
_ARRAY = re.compile(r"\b([a-z][a-z0-9]*)\[([^\]]*)\]")
_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s+\(.*\)\s*->\s*.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s+(ROOT\s+)?%?([\w.\-]+)\s+=\s+(.*)$")
# Instructions that move no data of their own (bytes are counted where the data is used).
_NO_TRAFFIC = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "while", "call", "conditional",
               "after-all", "partition-id", "replica-id", "opt-barrier", "iota"}
_SLICES = ("slice", "dynamic-slice")
# Bytes one chip sends for a collective of `operand` bytes per chip over a group of n chips
# (bandwidth-optimal ring algorithms).
_COLLECTIVES = {
    "all-reduce": lambda b, n: 2 * b * (n - 1) / n,  # reduce-scatter + all-gather
    "all-gather": lambda b, n: b * (n - 1),  # the operand is one chip's piece of the result
    "reduce-scatter": lambda b, n: b * (n - 1) / n,
    "all-to-all": lambda b, n: b * (n - 1) / n,
    "collective-permute": lambda b, n: b,
}


def _shape_bytes(shape: str) -> float:
  total = 0.0
  for dtype, dims in _ARRAY.findall(shape):
    size = _DTYPE_BYTES.get(dtype, 1 if dtype.startswith("f8") else 0)
    total += size * math.prod(int(d.strip().lstrip("<=")) for d in dims.split(",") if d.strip())
  return total


def _dims(shape: str) -> list[int]:
  m = _ARRAY.search(shape)
  return [int(d.strip().lstrip("<=")) for d in m[2].split(",") if d.strip()] if m else []


def _closing(text: str, start: int) -> int:
  """Index of the bracket closing the one at `start`."""
  pairs = {"(": ")", "{": "}", "[": "]"}
  depth, opener = 0, text[start]
  for i in range(start, len(text)):
    if text[i] == opener:
      depth += 1
    elif text[i] == pairs[opener]:
      depth -= 1
      if depth == 0:
        return i
  return len(text) - 1


@dataclasses.dataclass
class _Instr:
  name: str
  shape: str
  opcode: str
  args: str  # the text between the opcode's parentheses
  operands: list[str]
  attrs: str
  root: bool = False


def _parse_instruction(line: str) -> _Instr | None:
  m = _INSTRUCTION.match(line)
  if not m:
    return None
  name, rest = m[2], m[3]
  if rest.startswith("("):
    end = _closing(rest, 0)
    shape, rest = rest[:end + 1], rest[end + 1:].lstrip()
  else:
    shape, _, rest = rest.partition(" ")
  op = re.match(r"([\w\-]+)\(", rest)
  if not op:
    return None
  end = _closing(rest, op.end() - 1)
  args = rest[op.end():end]
  return _Instr(name, shape, op[1], args, re.findall(r"%([\w.\-]+)", args), rest[end + 1:], root=bool(m[1]))


def _parse_module(text: str) -> tuple[dict[str, list[_Instr]], str]:
  """Computations of an HLO module's text (name -> instructions) and the entry's name."""
  computations: dict[str, list[_Instr]] = {}
  entry, current = "", None
  for line in text.splitlines():
    if current is None:
      m = _COMPUTATION.match(line)
      if m:
        current = computations.setdefault(m[1], [])
        if line.startswith("ENTRY"):
          entry = m[1]
    elif line.startswith("}"):
      current = None
    else:
      instr = _parse_instruction(line)
      if instr is not None:
        current.append(instr)
  return computations, entry


def _group_size(attrs: str, num_devices: int) -> int:
  """Chips in each replica group of a collective (all of them when the groups are not given)."""
  m = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", attrs)
  if m:  # mesh['axis_0'=4,'axis_1'=2] {'axis_0'}
    sizes = {k: int(v) for k, v in re.findall(r"'([^']+)'=(\d+)", m[1])}
    return math.prod(sizes.get(a, 1) for a in re.findall(r"'([^']+)'", m[2])) or 1
  m = re.search(r"replica_groups=\[([\d,]+)\]<=", attrs)
  if m:  # iota groups [num_groups,group_size]<=[...]
    return int(m[1].split(",")[-1])
  m = re.search(r"replica_groups=\{\{([^}]*)\}", attrs)
  if m:  # {{0,1,2,3},{4,5,6,7}}
    return len(m[1].split(","))
  return num_devices


def _constant(instr: _Instr | None) -> int | None:
  if instr is not None and instr.opcode == "constant" and re.fullmatch(r"-?\d+", instr.args):
    return int(instr.args)
  return None


def _tuple_index(instr: _Instr | None) -> int | None:
  m = re.search(r"index=(\d+)", instr.attrs) if instr is not None and instr.opcode == "get-tuple-element" else None
  return int(m[1]) if m else None


def _trip_count(instr: _Instr, computations: dict[str, list[_Instr]], by_name: dict[str, _Instr]) -> int | None:
  """A while loop's trip count: XLA's known_trip_count, else its counter's `for (i = a; i < n; i += s)`:
  the condition's `i < n`, the body's `i + s` (the compiler unrolls windowed matmul loops by 2)
  and the initial tuple's `a`."""
  m = re.search(r'"known_trip_count":\{"n":"(\d+)"', instr.attrs)
  if m:
    return int(m[1])
  cond, body = (re.search(key + r"=%?([\w.\-]+)", instr.attrs) for key in ("condition", "body"))
  if not cond or not body:
    return None
  for compare in computations.get(cond[1], []):
    if compare.opcode != "compare" or "direction=LT" not in compare.attrs or len(compare.operands) != 2:
      continue
    counter, bound = (by_name.get(o) for o in compare.operands)
    index, n = _tuple_index(counter), _constant(bound)
    if index is None or n is None:
      continue
    root = next((i for i in computations.get(body[1], []) if i.root), None)
    step = 1
    if root is not None and root.opcode == "tuple" and index < len(root.operands):
      update = by_name.get(root.operands[index])
      if update is not None and update.opcode == "add" and len(update.operands) == 2:
        steps = [_constant(by_name.get(o)) for o in update.operands]
        step = next((c for c in steps if c), 1)
    init = by_name.get(instr.operands[0]) if instr.operands else None
    start = 0
    if init is not None and init.opcode == "tuple" and index < len(init.operands):
      start = _constant(by_name.get(init.operands[index])) or 0
    return max(0, -(-(n - start) // step))
  # A fused condition: the loop bound is its one integer constant.
  insts = list(computations.get(cond[1], []))
  for called in re.findall(r"calls=%?([\w.\-]+)", " ".join(i.attrs for i in insts)):
    insts += computations.get(called, [])
  bounds = [c for c in (_constant(i) for i in insts if re.match(r"[su]\d+\[\]", i.shape)) if c is not None]
  less_than = any(i.opcode == "compare" and "direction=LT" in i.attrs for i in insts)
  return bounds[0] if less_than and len(bounds) == 1 else None


@dataclasses.dataclass
class HloCosts:
  """Per-chip costs of a compiled (SPMD-partitioned) HLO module, from its text.

  `*_once` count every computation once per call site, as XLA's cost analysis does; the others
  run each while body as many times as its trip count says.
  """

  flops: float  # dots and convolutions
  flops_once: float
  bytes: float  # operands + results of every executed (non-fused) instruction
  bytes_once: float
  collective_bytes: float  # what the chip sends: _COLLECTIVES of each collective's operands
  loops: list[int | None]  # trip counts of the while loops (None: not found, counted once)


def _instr_flops(instr: _Instr, shapes: dict[str, str]) -> float:
  if instr.opcode == "dot":
    lhs = _dims(shapes.get(instr.operands[0], ""))
    m = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", instr.attrs)
    contracted = math.prod(lhs[int(d)] for d in m[1].split(",") if d) if m and lhs else 1
    return 2.0 * math.prod(_dims(instr.shape)) * contracted
  if instr.opcode == "convolution":
    return _convolution_flops(instr, shapes)
  return 0.0


def _convolution_flops(instr: _Instr, shapes: dict[str, str]) -> float:
  """2 x multiply-adds, counting only taps that land on input (not on padding or dilation holes):
  the TPU compiler writes batched matmuls as convolutions with base dilation."""
  lhs, rhs, out = (_dims(shapes.get(instr.operands[0], "")), _dims(shapes.get(instr.operands[1], "")),
                   _dims(instr.shape))
  m = re.search(r"dim_labels=(\w+)_(\w+)->(\w+)", instr.attrs)
  if not m or (len(m[1]), len(m[2]), len(m[3])) != (len(lhs), len(rhs), len(out)):
    return 0.0
  lhs_labels, rhs_labels, out_labels = m[1], m[2], m[3]
  window = re.search(r"window=\{([^}]*)\}", instr.attrs)
  fields = dict(kv.split("=", 1) for kv in window[1].split()) if window else {}

  def field(key: str, d: int, default: int) -> int:
    return int(fields[key].split("x")[d].split("_")[0]) if key in fields else default

  taps = 1
  for d in range(sum(c.isdigit() for c in rhs_labels)):
    size, k, n_out = lhs[lhs_labels.index(str(d))], rhs[rhs_labels.index(str(d))], out[out_labels.index(str(d))]
    stride, base, dilation, pad = (field("stride", d, 1), field("lhs_dilate", d, 1), field("rhs_dilate", d, 1),
                                   field("pad", d, 0))
    extent = (size - 1) * base + 1
    taps *= sum(1 for o in range(n_out) for t in range(k)
                if 0 <= o * stride + t * dilation - pad < extent and (o * stride + t * dilation - pad) % base == 0)
  batch = math.prod(n for n, label in zip(out, out_labels) if not label.isdigit())
  return 2.0 * batch * taps * rhs[rhs_labels.index("i")]


def _traffic(instr: _Instr, computations: dict[str, list[_Instr]], shapes: dict[str, str]) -> float:
  """HBM bytes an executed instruction reads and writes. As XLA's cost analysis counts them: a
  (dynamic-)slice reads only its slice, a dynamic-update-slice writes only its update in place
  (a scan reads and writes one layer of its stacked arrays per iteration, not the whole stack)."""
  size = lambda name: _shape_bytes(shapes.get(name, ""))  # noqa: E731
  if instr.opcode in _SLICES:
    return 2 * _shape_bytes(instr.shape)
  if instr.opcode == "dynamic-update-slice":
    return 2 * size(instr.operands[1])
  if instr.opcode.endswith("-start"):  # async: the result tuple repeats the operands (and a context)
    operands = sum(size(o) for o in instr.operands)
    result = max(_shape_bytes(instr.shape) - operands, 0.0)
    return 2 * result if instr.opcode == "slice-start" else operands + result
  fused = re.search(r"calls=%?([\w.\-]+)", instr.attrs) if instr.opcode == "fusion" else None
  if not fused or fused[1] not in computations:
    return _shape_bytes(instr.shape) + sum(size(o) for o in instr.operands)
  body = computations[fused[1]]
  by_name = {i.name: i for i in body}
  params = {int(i.args): i.name for i in body if i.opcode == "parameter" and i.args.isdigit()}
  root = next((i for i in body if i.root), None)
  outputs = [by_name.get(o) for o in root.operands] if root is not None and root.opcode == "tuple" else [root]
  written = sum(size(o.operands[1]) if o is not None and o.opcode == "dynamic-update-slice" else
                _shape_bytes(o.shape) if o is not None else 0.0 for o in outputs)
  in_place = {o.operands[0] for o in outputs if o is not None and o.opcode == "dynamic-update-slice"}
  read = 0.0
  for k, operand in enumerate(instr.operands):
    param = params.get(k)
    users = [i for i in body if param in i.operands]
    if param in in_place and all(u.opcode == "dynamic-update-slice" and u.operands[0] == param for u in users):
      continue  # the buffer updated in place: not read
    if users and all(u.opcode in _SLICES and u.operands[0] == param for u in users):
      read += sum(_shape_bytes(u.shape) for u in users)
    else:
      read += size(operand)
  return read + written


def hlo_costs(text: str, *, num_devices: int) -> HloCosts:
  """FLOPs, HBM bytes and collective bytes of one chip's program (`compiled.as_text()`)."""
  computations, entry = _parse_module(text)
  by_name = {i.name: i for instrs in computations.values() for i in instrs}
  shapes = {name: i.shape for name, i in by_name.items()}
  totals = {"flops": 0.0, "flops_once": 0.0, "bytes": 0.0, "bytes_once": 0.0, "collective_bytes": 0.0}
  loops: list[int | None] = []

  def visit(name: str, times: float, once: float, executed: bool, depth: int = 0) -> None:
    if depth > 64:
      raise ValueError(f"HLO call graph too deep at {name}")
    for instr in computations.get(name, []):
      flops = _instr_flops(instr, shapes)
      totals["flops"] += times * flops
      totals["flops_once"] += once * flops
      op = instr.opcode.removesuffix("-start")
      if executed and instr.opcode not in _NO_TRAFFIC and not instr.opcode.endswith("-done"):
        traffic = _traffic(instr, computations, shapes)
        totals["bytes"] += times * traffic
        totals["bytes_once"] += once * traffic
      if op in _COLLECTIVES:
        operand = sum(_shape_bytes(shapes.get(o, "")) for o in instr.operands)
        n = _group_size(instr.attrs, num_devices)
        if n > 1 or op == "collective-permute":
          totals["collective_bytes"] += times * _COLLECTIVES[op](operand, max(n, 1))
      if instr.opcode == "while":
        trips = _trip_count(instr, computations, by_name)
        loops.append(trips)
        for key in ("body", "condition"):
          callee = re.search(key + r"=%?([\w.\-]+)", instr.attrs)
          if callee:
            visit(callee[1], times * (trips or 1), once, True, depth + 1)
      elif instr.opcode in ("call", "conditional"):
        for callee in re.findall(r"(?:to_apply|true_computation|false_computation)=%?([\w.\-]+)", instr.attrs):
          visit(callee, times, once, True, depth + 1)
        branches = re.search(r"branch_computations=\{([^}]*)\}", instr.attrs)
        for callee in re.findall(r"%?([\w.\-]+)", branches[1]) if branches else []:
          visit(callee, times, once, True, depth + 1)
      else:  # fusions (and async wrappers): their insides compute, their traffic is the caller's
        for callee in re.findall(r"calls=%?([\w.\-]+)", instr.attrs):
          visit(callee, times, once, False, depth + 1)

  visit(entry, 1.0, 1.0, True)
  return HloCosts(loops=loops, **totals)


# --- The report -------------------------------------------------------------------------------


@dataclasses.dataclass
class AotReport:
  name: str
  topology: str
  devices: int
  hosts: int
  device_kind: str
  mesh: dict[str, int]
  global_batch_size: int
  lengths: dict[str, int]
  params: int
  scan_layers: bool
  remat_policy: str
  grad_cache_chunks: int
  # Per chip, from XLA's memory analysis.
  argument_bytes: int
  output_bytes: int
  alias_bytes: int
  temp_bytes: int
  generated_code_bytes: int
  # Per chip, from the shardings: parameters + optimizer state (+ step), and the batch.
  state_bytes: int
  batch_bytes: int
  hbm_bytes: int
  step_flops: float  # model FLOPs of the whole step, all chips (Objective.step_flops)
  compiled: bool  # False: the TPU compiler refused the program (out of memory)
  # Per chip, from the compiled program (None when it did not compile): XLA's cost analysis (each
  # while body counted once), and with the loop iterations it leaves out added.
  xla_cost_flops: float | None
  xla_cost_bytes: float | None
  compiled_flops: float | None
  bytes_accessed: float | None
  collective_bytes: float | None
  loop_trip_counts: list[int | None]
  peak_bf16_flops: float
  hbm_bytes_per_s: float
  ici_bytes_per_s: float
  roofline_compute_seconds: float | None
  roofline_memory_seconds: float | None
  roofline_collective_seconds: float | None
  compile_seconds: float

  @property
  def total_bytes(self) -> int:
    # Donated inputs alias outputs: count them once.
    return self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes

  @property
  def fits(self) -> bool:
    return self.compiled and self.total_bytes <= self.hbm_bytes

  @property
  def roofline(self) -> Roofline | None:
    if self.roofline_compute_seconds is None:
      return None
    return Roofline(self.roofline_compute_seconds, self.roofline_memory_seconds, self.roofline_collective_seconds)

  @property
  def roofline_step_seconds(self) -> float | None:
    return self.roofline.seconds if self.roofline else None

  @property
  def implied_mfu(self) -> float | None:
    if not self.roofline:
      return None
    return implied_mfu(self.step_flops, self.roofline.seconds, chips=self.devices, peak_flops=self.peak_bf16_flops)

  def as_dict(self) -> dict[str, Any]:
    d = dataclasses.asdict(self)
    d.update(total_bytes=self.total_bytes, fits=self.fits, roofline_step_seconds=self.roofline_step_seconds,
             implied_mfu=self.implied_mfu)
    return d

  def _mesh(self) -> str:
    return " x ".join(f"{k}={v}" for k, v in self.mesh.items())

  def table(self) -> str:
    g = lambda b: f"{b / GIB:.2f} GiB"  # noqa: E731
    rows = [
        ("run", self.name),
        ("topology", f"{self.topology} ({self.devices} x {self.device_kind}, {self.hosts} "
                     f"host{'s' if self.hosts > 1 else ''})"),
        ("mesh", self._mesh()),
        ("batch / lengths", f"{self.global_batch_size} / {self.lengths}"),
        ("parameters", f"{self.params / 1e9:.3f} B"),
        ("per-chip arguments", f"{g(self.argument_bytes) if self.compiled else 'not reported'} (parameters + "
                               f"optimizer state {g(self.state_bytes)}, batch {g(self.batch_bytes)})"),
        ("per-chip outputs", g(self.output_bytes)),
        ("  aliased (donated)", g(self.alias_bytes)),
        ("per-chip temporaries", f"{g(self.temp_bytes)} (activations, gradients, compiler scratch)"),
        ("per-chip total", f"{g(self.total_bytes)} of {g(self.hbm_bytes)} HBM "
                           f"({100 * self.total_bytes / self.hbm_bytes:.0f}%)"),
        ("model FLOPs per step", f"{self.step_flops:.3e} (all chips, no remat)"),
    ]
    r = self.roofline
    if r is None:
      rows.append(("step time (estimate)", "n/a: the TPU compiler refused the program (out of memory)"))
    else:
      rows += [
          ("compiled FLOPs per chip", f"{self.compiled_flops:.3e} (with remat; while loops x trip count)"),
          ("HBM bytes per chip", f"{self.bytes_accessed:.3e}"),
          ("ICI bytes sent per chip", f"{self.collective_bytes:.3e}"),
          ("step time (estimate)", f"{r.seconds:.3f} s roofline = max(compute {r.compute_seconds:.3f} s, "
                                   f"HBM {r.memory_seconds:.3f} s) + collectives {r.collective_seconds:.3f} s; "
                                   f"not measured"),
          ("implied MFU (estimate)", f"{self.implied_mfu:.0%} (model FLOPs / (estimate x chips x "
                                     f"{self.peak_bf16_flops / 1e12:.0f} TFLOP/s))"),
      ]
    rows += [("compile time", f"{self.compile_seconds:.1f} s"), ("fits", "yes" if self.fits else "NO")]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)

  def misfit(self) -> str:
    """Why the step does not fit, and what would make it fit (empty when it fits)."""
    if self.fits:
      return ""
    g = lambda b: f"{b / GIB:.2f} GiB"  # noqa: E731
    hbm, state, temps = self.hbm_bytes, self.state_bytes, self.temp_bytes
    lines = [f"{self.name} does NOT fit on {self.topology}: "
             + (f"{g(self.total_bytes)} per chip > {g(hbm)} HBM" if self.compiled else
                f"the TPU compiler refused it (out of memory: {g(temps)} of temporaries)"),
             f"  parameters + optimizer state: {g(state)} per chip (mesh {self._mesh()}); "
             f"temporaries (activations, gradients, scratch): {g(temps)}; batch: {g(self.batch_bytes)}"]
    chips = self.devices
    fsdp = self.mesh.get("fsdp", 1) * self.mesh.get("model", 1)
    if state > hbm / 2 and fsdp < chips:
      lines.append(f"  - shard the state over more chips: MeshConfig.data = 1 and MeshConfig.fsdp = -1 "
                   f"(-> about {g(state * fsdp / chips)} per chip), or a larger slice")
    elif state > hbm / 2:
      lines.append(f"  - the state alone needs about {g(state * chips)} in all: a slice of more than "
                   f"{math.ceil(state * chips / (hbm / 2))} chips")
    if not (self.scan_layers and self.remat_policy == "full"):
      lines.append("  - scan the layers and rematerialise them in full (st5_model.scan_layers = True, "
                   "st5_model.remat_policy = 'full': targets/tpu.gin)")
    if temps > hbm - state:
      room = max(hbm - state - self.batch_bytes, hbm / 8)
      chunks = 2 ** math.ceil(math.log2(max(2.0, temps / room)))
      lines.append(f"  - GradCache: TrainConfig.grad_cache_chunks = {chunks} holds one chunk's activations at a "
                   f"time (about {g(temps / chunks)} instead of {g(temps)}), same batch, same loss")
      lines.append("  - or spread the batch over more chips (a larger slice)")
    return "\n".join(lines)


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


def per_chip_bytes(tree: Any) -> int:
  """Bytes of one chip's shards of a tree of sharded ShapeDtypeStructs (the largest shard)."""
  return sum(math.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(tree))


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


def _cost_analysis(compiled) -> dict[str, float]:
  cost = compiled.cost_analysis()
  if isinstance(cost, (list, tuple)):  # older JAX: one dict per program
    cost = cost[0]
  return dict(cost or {})


def compile_for_devices(spec, devices, *, name: str, topology: str) -> AotReport:
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
  compiled = None
  with jax.set_mesh(mesh):
    lowered = setup.step_fn.lower(state, batch)
    try:
      compiled = lowered.compile()
      mem = compiled.memory_analysis()
    except jax.errors.JaxRuntimeError as e:
      # The TPU compiler refuses programs that cannot fit; report it like any other misfit.
      mem = _oom_as_memory_stats(str(e))
      if mem is None:
        raise
  compile_seconds = time.perf_counter() - start
  step_flops = setup.objective.step_flops(spec.model, global_batch_size=tc.global_batch_size, lengths=lengths)
  n_params = sum(math.prod(x.shape) for x in jax.tree.leaves(nn.unbox(setup.boxed_params)))
  flops = bytes_accessed = collective = cost = None
  loops: list[int | None] = []
  r = None
  if compiled is not None:
    cost = _cost_analysis(compiled)
    hlo = hlo_costs(compiled.as_text(), num_devices=len(devices))
    # XLA's cost analysis counts each while body once: add the iterations it leaves out.
    flops = cost.get("flops", 0.0) + hlo.flops - hlo.flops_once
    bytes_accessed = cost.get("bytes accessed", 0.0) + hlo.bytes - hlo.bytes_once
    collective, loops = hlo.collective_bytes, hlo.loops
    r = roofline(flops=flops, bytes_accessed=bytes_accessed, collective_bytes=collective, chip=chip)
  t5 = spec.model.t5
  return AotReport(
      name=name, topology=topology, devices=len(devices),
      hosts=len({getattr(d, "process_index", 0) for d in devices}), device_kind=devices[0].device_kind,
      mesh=dict(mesh.shape), global_batch_size=tc.global_batch_size, lengths=lengths, params=n_params,
      scan_layers=bool(t5.scan_layers), remat_policy=str(t5.remat_policy),
      grad_cache_chunks=int(getattr(tc, "grad_cache_chunks", 0) or 0),
      argument_bytes=mem.argument_size_in_bytes, output_bytes=mem.output_size_in_bytes,
      alias_bytes=mem.alias_size_in_bytes, temp_bytes=mem.temp_size_in_bytes,
      generated_code_bytes=mem.generated_code_size_in_bytes, state_bytes=per_chip_bytes(state),
      batch_bytes=per_chip_bytes(batch), hbm_bytes=chip.hbm_bytes, step_flops=step_flops,
      compiled=compiled is not None, xla_cost_flops=cost and cost.get("flops", 0.0),
      xla_cost_bytes=cost and cost.get("bytes accessed", 0.0), compiled_flops=flops, bytes_accessed=bytes_accessed,
      collective_bytes=collective, loop_trip_counts=loops, peak_bf16_flops=chip.peak_bf16_flops,
      hbm_bytes_per_s=chip.hbm_bytes_per_s, ici_bytes_per_s=chip.ici_bytes_per_s,
      roofline_compute_seconds=r and r.compute_seconds, roofline_memory_seconds=r and r.memory_seconds,
      roofline_collective_seconds=r and r.collective_seconds, compile_seconds=compile_seconds)


def compile_for_topology(spec, *, topology: str | None = None, name: str = "") -> AotReport:
  target = spec.target or {}
  topology = topology or target.get("topology") or (target.get("slice") and topology_for_slice(target["slice"]))
  if not topology:
    raise ValueError("No topology: pass --topology (e.g. v4:4x4x8) or set run.target = {'topology': ...} in gin")
  topo = get_topology(topology)
  return compile_for_devices(spec, list(topo.devices), name=name, topology=topology)
