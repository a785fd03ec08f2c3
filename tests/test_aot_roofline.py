"""`st5 aot`'s step-time estimate: the roofline's arithmetic, the walk of the compiled HLO that
counts loop iterations and collectives, and the report's wording (estimate, not prediction).

The hand-written HLO module and the chip figures here are made up so that every number is a
hand computation, not the default tables.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src import config as jax_config
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from st5_jax import aot

# A scan of 3 iterations: each reads one [16, 32] layer of a stacked [3, 16, 32] weight
# (dynamic-slice inside a fusion), multiplies [8, 16] by it and all-reduces the [8, 32] result
# over groups of 4 chips; after the loop, an all-gather over 4 chips.
HLO = """HloModule scan3, entry_computation_layout={(bf16[8,16]{1,0}, bf16[3,16,32]{2,1,0})->bf16[32,16]{1,0}}

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %sum = f32[] add(%x, %y)
}

%fused_dot (p0: bf16[8,16], p1: bf16[3,16,32], p2: s32[]) -> bf16[8,32] {
  %p0 = bf16[8,16]{1,0} parameter(0)
  %p1 = bf16[3,16,32]{2,1,0} parameter(1)
  %p2 = s32[] parameter(2)
  %zero = s32[] constant(0)
  %w = bf16[1,16,32]{2,1,0} dynamic-slice(%p1, %p2, %zero, %zero), dynamic_slice_sizes={1,16,32}
  %w2 = bf16[16,32]{1,0} bitcast(%w)
  ROOT %d = bf16[8,32]{1,0} dot(%p0, %w2), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%body (state: (s32[], bf16[8,16], bf16[3,16,32])) -> (s32[], bf16[8,16], bf16[3,16,32]) {
  %state = (s32[], bf16[8,16]{1,0}, /*index=2*/bf16[3,16,32]{2,1,0}) parameter(0)
  %i = s32[] get-tuple-element(%state), index=0
  %h = bf16[8,16]{1,0} get-tuple-element(%state), index=1
  %ws = bf16[3,16,32]{2,1,0} get-tuple-element(%state), index=2
  %y = bf16[8,32]{1,0} fusion(%h, %ws, %i), kind=kOutput, calls=%fused_dot
  %r = bf16[8,32]{1,0} all-reduce(%y), channel_id=1, replica_groups={{0,1,2,3}}, to_apply=%add
  %h2 = bf16[8,16]{1,0} slice(%r), slice={[0:8], [0:16]}
  %one = s32[] constant(1)
  %i2 = s32[] add(%i, %one)
  ROOT %out = (s32[], bf16[8,16]{1,0}, bf16[3,16,32]{2,1,0}) tuple(%i2, %h2, %ws)
}

%cond (state.1: (s32[], bf16[8,16], bf16[3,16,32])) -> pred[] {
  %state.1 = (s32[], bf16[8,16]{1,0}, bf16[3,16,32]{2,1,0}) parameter(0)
  %i.1 = s32[] get-tuple-element(%state.1), index=0
  %n = s32[] constant(3)
  ROOT %lt = pred[] compare(%i.1, %n), direction=LT
}

ENTRY %main (a: bf16[8,16], wp: bf16[3,16,32]) -> bf16[32,16] {
  %a = bf16[8,16]{1,0} parameter(0)
  %wp = bf16[3,16,32]{2,1,0} parameter(1)
  %zero.1 = s32[] constant(0)
  %init = (s32[], bf16[8,16]{1,0}, bf16[3,16,32]{2,1,0}) tuple(%zero.1, %a, %wp)
  %loop = (s32[], bf16[8,16]{1,0}, bf16[3,16,32]{2,1,0}) while(%init), condition=%cond, body=%body
  %res = bf16[8,16]{1,0} get-tuple-element(%loop), index=1
  ROOT %g = bf16[32,16]{1,0} all-gather(%res), channel_id=2, replica_groups=[1,4]<=[4], dimensions={0}
}
"""


def test_the_hlo_walk_counts_each_loop_iteration_by_hand():
  costs = aot.hlo_costs(HLO, num_devices=4)
  assert costs.loops == [3]
  dot = 2 * 8 * 32 * 16  # 2 x multiply-adds of [8,16] @ [16,32]
  assert (costs.flops, costs.flops_once) == (3 * dot, dot)
  # Per iteration: the fusion reads h (8*16*2), ONE layer of ws (16*32*2, not the stack), i (4) and
  # writes y (8*32*2); the all-reduce reads and writes y; the slice reads and writes h2 (2 x 8*16*2);
  # the counter's add 3 x 4. The condition's compare: 4 + 4 + 1 (pred). After the loop, the
  # all-gather reads 8*16*2 and writes 32*16*2. Parameters, tuples and get-tuple-elements move nothing.
  body = (256 + 1024 + 4 + 512) + (512 + 512) + 2 * 256 + 12
  cond = 9
  after = 256 + 1024
  assert costs.bytes == 3 * (body + cond) + after
  assert costs.bytes_once == body + cond + after
  # Sent per chip: an all-reduce of 512 bytes over 4 chips sends 2 x 512 x 3/4 per iteration; an
  # all-gather of a 256-byte piece over 4 chips sends it to the 3 others.
  assert costs.collective_bytes == 3 * (2 * 512 * 3 / 4) + 256 * 3


def test_a_loop_counting_by_two_runs_half_as_often():
  # `for (i = 0; i < 6; i += 2)`: what the TPU compiler's windowed matmul loops look like.
  by_two = HLO.replace("%one = s32[] constant(1)", "%one = s32[] constant(2)").replace(
      "%n = s32[] constant(3)", "%n = s32[] constant(6)")
  assert by_two != HLO
  costs = aot.hlo_costs(by_two, num_devices=4)
  assert costs.loops == [3] and costs.flops == 3 * costs.flops_once
  # ... and one starting at 4 runs (6 - 4) / 2 = once.
  from_four = by_two.replace("%zero.1 = s32[] constant(0)", "%zero.1 = s32[] constant(4)")
  assert aot.hlo_costs(from_four, num_devices=4).loops == [1]


@pytest.mark.parametrize("attrs,size", [
    ("replica_groups=mesh['axis_0'=4,'axis_1'=2,'axis_2'=1] {'axis_0','axis_2'}, dimensions={0}", 4),
    ("replica_groups=mesh['axis_0'=4,'axis_1'=2] {'axis_0','axis_1'}", 8),
    ("replica_groups=[4,2]<=[8], dimensions={0}", 2),
    ("replica_groups={{0,2,4},{1,3,5}}, to_apply=%add", 3),
    ("channel_id=3, to_apply=%add", 16),  # no groups: every chip
])
def test_collective_group_sizes(attrs, size):
  assert aot._group_size(attrs, 16) == size  # pylint: disable=protected-access


def test_the_chip_table_holds_the_public_figures():
  # Google's Cloud TPU docs (and the TPU v4 paper for v4's ICI): bf16 peak, HBM, HBM bandwidth, and
  # what a chip sends over all its ICI links in one direction.
  public = {"TPU v4": ("v4", 32, 275e12, 1.2e12, 300e9), "TPU v5 lite": ("v5e", 16, 197e12, 819e9, 200e9),
            "TPU v5": ("v5p", 95, 459e12, 2.765e12, 600e9), "TPU v6 lite": ("v6e", 32, 918e12, 1.64e12, 448e9)}
  for kind, (gen, gib, peak, hbm, ici) in public.items():
    assert aot.CHIPS[kind] == aot.ChipSpec(gen, gib * aot.GIB, peak, hbm, ici), kind
  assert aot.CHIPS["TPU v5e"] == aot.CHIPS["TPU v5 lite"] and aot.CHIPS["TPU v6e"] == aot.CHIPS["TPU v6 lite"]


# Made-up chip: 100 TFLOP/s, 1 TB/s HBM, 50 GB/s ICI.
CHIP = aot.ChipSpec("test", 10 * aot.GIB, 100e12, 1e12, 50e9)


def test_roofline_by_hand():
  # Compute-bound: 3e12 FLOPs / 100e12 = 0.03 s > 2e10 B / 1e12 = 0.02 s; + 1e9 B / 50e9 = 0.02 s.
  r = aot.roofline(flops=3e12, bytes_accessed=2e10, collective_bytes=1e9, chip=CHIP)
  assert (r.compute_seconds, r.memory_seconds, r.collective_seconds) == pytest.approx((0.03, 0.02, 0.02))
  assert r.seconds == pytest.approx(0.05) and r.bound == "compute"
  # HBM-bound: 5e10 B / 1e12 = 0.05 s > 0.03 s.
  r = aot.roofline(flops=3e12, bytes_accessed=5e10, collective_bytes=1e9, chip=CHIP)
  assert r.seconds == pytest.approx(0.07) and r.bound == "HBM bandwidth"
  # 8e12 model FLOPs on 4 chips in 0.05 s of a 100 TFLOP/s chip: 8e12 / (0.05 x 4 x 1e14) = 40%.
  assert aot.implied_mfu(8e12, 0.05, chips=4, peak_flops=CHIP.peak_bf16_flops) == pytest.approx(0.40)


def _report(**overrides):
  fields = dict(
      name="run.gin", topology="v5e:4x4", devices=4, hosts=1, device_kind="TPU v5 lite",
      mesh={"data": 4, "fsdp": 1, "model": 1}, global_batch_size=64, lengths={"inputs": 8}, params=10 ** 9,
      scan_layers=True, remat_policy="full", grad_cache_chunks=0, argument_bytes=2 * aot.GIB,
      output_bytes=2 * aot.GIB, alias_bytes=2 * aot.GIB, temp_bytes=3 * aot.GIB, generated_code_bytes=0,
      state_bytes=2 * aot.GIB - 1024, batch_bytes=1024, hbm_bytes=CHIP.hbm_bytes, step_flops=8e12, compiled=True,
      xla_cost_flops=1e12, xla_cost_bytes=1e10, compiled_flops=3e12, bytes_accessed=2e10, collective_bytes=1e9,
      loop_trip_counts=[24],
      peak_bf16_flops=CHIP.peak_bf16_flops, hbm_bytes_per_s=CHIP.hbm_bytes_per_s, ici_bytes_per_s=CHIP.ici_bytes_per_s,
      roofline_compute_seconds=0.03, roofline_memory_seconds=0.02, roofline_collective_seconds=0.02,
      compile_seconds=1.0)
  fields.update(overrides)
  return aot.AotReport(**fields)


def test_the_report_labels_the_step_time_an_estimate():
  report = _report()
  assert report.fits and report.roofline_step_seconds == pytest.approx(0.05)
  assert report.implied_mfu == pytest.approx(0.40)
  d = report.as_dict()
  assert d["roofline_step_seconds"] == pytest.approx(0.05) and d["implied_mfu"] == pytest.approx(0.40)
  assert "predicted_step_seconds" not in d and "utilisation" not in d
  table = report.table()
  assert "step time (estimate)" in table and "implied MFU (estimate)" in table and "40%" in table
  assert "predict" not in table.lower() and "50% MFU" not in table


def test_a_misfit_says_why_and_what_would_fit():
  # Temporaries dominate: GradCache with enough chunks to bring them under what the state leaves.
  temps = _report(temp_bytes=30 * aot.GIB)
  assert not temps.fits
  why = temps.misfit()
  assert "does NOT fit" in why and "temporaries" in why and "30.00 GiB" in why
  # 10 GiB - 2 GiB of state leaves 8 GiB: 30 / 8 -> 4 chunks.
  assert "TrainConfig.grad_cache_chunks = 4" in why and "MeshConfig.fsdp" not in why
  # The state dominates on a data-parallel mesh: shard it.
  state = _report(argument_bytes=9 * aot.GIB, output_bytes=9 * aot.GIB, alias_bytes=9 * aot.GIB,
                  state_bytes=9 * aot.GIB, temp_bytes=2 * aot.GIB)
  assert "MeshConfig.fsdp = -1" in state.misfit() and "2.25 GiB" in state.misfit()
  # Not scanned and rematerialised: say so.
  assert "remat_policy = 'full'" in _report(temp_bytes=30 * aot.GIB, remat_policy="none").misfit()
  # Refused by the compiler: no step time, still a reason.
  refused = _report(compiled=False, roofline_compute_seconds=None, roofline_memory_seconds=None,
                    roofline_collective_seconds=None, compiled_flops=None, xla_cost_flops=None, temp_bytes=40 * aot.GIB)
  assert refused.roofline_step_seconds is None and refused.implied_mfu is None
  assert "refused" in refused.misfit() and "n/a" in refused.table()
  assert _report().misfit() == ""


def test_a_compiled_scan_counts_every_layer_that_cost_analysis_counts_once():
  """The reason for the walk: XLA's cost analysis of a TPU program runs a scan's body once. The body is
  attention-like: its batched matmuls compile to convolutions with base dilation (mostly holes)."""
  devices = list(aot.get_topology("v4:2x2x1").devices)
  mesh = Mesh(np.array(devices), ("x",))
  layers, batch, length, width = 6, 128, 64, 128

  def f(h, ws):
    def layer(h, w):
      scores = jnp.einsum("bld,bmd->blm", h, h)
      return jnp.tanh(jnp.einsum("blm,bmd->bld", scores, h) @ w), None
    return jax.lax.scan(layer, h, ws)[0]

  h = jax.ShapeDtypeStruct((batch, length, width), jnp.bfloat16, sharding=NamedSharding(mesh, P("x")))
  ws = jax.ShapeDtypeStruct((layers, width, width), jnp.bfloat16, sharding=NamedSharding(mesh, P()))
  with jax_config.enable_compilation_cache(False):  # a compile-only TPU executable cannot be read back
    compiled = jax.jit(f).lower(h, ws).compile()
  text = compiled.as_text()
  assert "lhs_dilate" in text  # the case the convolution count must get right
  b = batch // 4  # one chip's share
  per_layer = 2 * b * length * length * width * 2 + 2 * b * length * width * width
  costs = aot.hlo_costs(text, num_devices=4)
  assert costs.loops == [layers]
  assert (costs.flops, costs.flops_once) == (layers * per_layer, per_layer)
  xla = aot._cost_analysis(compiled)["flops"]  # pylint: disable=protected-access
  assert per_layer <= xla < 1.1 * per_layer  # one layer's matmuls (+ tanh), not six
  # What st5 aot reports: XLA's figure plus the iterations it leaves out.
  assert xla + costs.flops - costs.flops_once == pytest.approx(layers * per_layer, rel=0.01)
