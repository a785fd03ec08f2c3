"""The roofline estimate of `st5 aot` against a measured step time, on this machine's backend.

    python benchmarks/roofline_vs_measured.py                                   # t5_mini and t5_small, CPU
    python benchmarks/roofline_vs_measured.py --sizes t5_1_1_base --batch 256 --length 128   # e.g. on a GPU

`st5 aot` estimates a TPU step as max(FLOPs / peak, HBM bytes / bandwidth) + ICI bytes / ICI bandwidth, from
the compiled program (st5_jax/aot.py: XLA's cost analysis plus the loop iterations it counts once). No TPU
runs here, so this checks the same estimate where a step can be timed: the real train step
(st5_jax.train.build, as `st5 bench`) is compiled for the local device, its FLOPs and bytes are read by the
same code (`aot.hlo_costs`, `aot.roofline`), the device's peak is measured (the best of an n x n matmul)
and so is its memory bandwidth (the best of a large elementwise pass: bytes read + written), and the step
is timed (median of --steps). One device, so no collective term. Prints one markdown table; figures, no
assertions.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def bandwidth(mib: int = 512, repeats: int = 10) -> float:
  """Bytes/s of a jitted x * 2 + 1 over `mib` MiB of float32 (reads once, writes once; best of `repeats`)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  from st5_jax.commands.bench import best_seconds  # pylint: disable=g-import-not-at-top
  x = jnp.ones((mib * 2 ** 20 // 4,), jnp.float32)
  f = jax.jit(lambda v: v * 2.0 + 1.0)
  return 2 * x.nbytes / best_seconds(lambda: f(x).block_until_ready(), repeats)


def measure(size: str, *, batch: int, length: int, steps: int, dtype: str, peak: float, bw: float) -> dict:
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  from st5_jax import aot, configs, objectives, partitioning, train  # pylint: disable=g-import-not-at-top
  from st5_jax.commands.bench import token_batch  # pylint: disable=g-import-not-at-top

  model = configs.ST5Config(t5=configs.t5_size(size, dtype=dtype, dropout_rate=0.0), pooling="enc_mean",
                            embedding_dim=256, max_length=length)
  tc = train.TrainConfig(num_train_steps=steps + 10, global_batch_size=batch,
                         objective=objectives.Contrastive(num_negatives=1))
  mesh = partitioning.make_mesh(partitioning.MeshConfig(), devices=jax.devices()[:1])
  setup = train.build(model, tc, mesh)
  lengths = {"inputs": length, "targets": length, "negative_targets": length}
  host = token_batch(batch, length, list(setup.objective.required_lengths(lengths)), np.random.default_rng(0))
  data = {k: jax.device_put(v, partitioning.batch_sharding(mesh)) for k, v in host.items()}
  with jax.set_mesh(mesh):
    state = train.init_state(setup, model, seed=0)
    compiled = setup.step_fn.lower(state, data).compile()
    cost = aot._cost_analysis(compiled)  # pylint: disable=protected-access
    hlo = aot.hlo_costs(compiled.as_text(), num_devices=1)
    flops = cost.get("flops", 0.0) + hlo.flops - hlo.flops_once
    nbytes = cost.get("bytes accessed", 0.0) + hlo.bytes - hlo.bytes_once
    chip = aot.ChipSpec(jax.devices()[0].device_kind, 0, peak, bw, 1.0)
    r = aot.roofline(flops=flops, bytes_accessed=nbytes, collective_bytes=0.0, chip=chip)
    state, m = compiled(state, data)
    jax.block_until_ready(m)
    times = []
    for _ in range(steps):
      t = time.perf_counter()
      state, m = compiled(state, data)
      jax.block_until_ready(m)
      times.append(time.perf_counter() - t)
  measured = statistics.median(times)
  model_flops = setup.objective.step_flops(model, global_batch_size=batch, lengths=lengths)
  return {"size": size, "batch": batch, "length": length, "dtype": dtype, "compiled_flops": flops,
          "model_flops": model_flops, "bytes_accessed": nbytes, "roofline_compute_s": r.compute_seconds,
          "roofline_memory_s": r.memory_seconds, "roofline_s": r.seconds, "bound": r.bound,
          "measured_s": measured, "measured_min_s": min(times), "measured_max_s": max(times),
          "measured_over_roofline": measured / r.seconds,
          "implied_mfu_roofline": aot.implied_mfu(model_flops, r.seconds, chips=1, peak_flops=peak),
          "mfu_measured": aot.implied_mfu(model_flops, measured, chips=1, peak_flops=peak)}


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--sizes", default="t5_mini,t5_small")
  ap.add_argument("--batch", type=int, default=64)
  ap.add_argument("--length", type=int, default=32)
  ap.add_argument("--steps", type=int, default=10)
  ap.add_argument("--dtype", default="float32")
  ap.add_argument("--json")
  args = ap.parse_args()
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  from st5_jax.commands.bench import matmul_peak  # pylint: disable=g-import-not-at-top
  peak = matmul_peak(jnp.dtype(args.dtype))
  bw = bandwidth()
  load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
  print(f"{jax.devices()[0].device_kind} ({jax.default_backend()}, {os.cpu_count()} CPUs, load {load:.1f}): "
        f"measured peak {peak / 1e9:.1f} GFLOP/s ({args.dtype} matmul), bandwidth {bw / 1e9:.1f} GB/s")
  rows = [measure(s, batch=args.batch, length=args.length, steps=args.steps, dtype=args.dtype, peak=peak, bw=bw)
          for s in args.sizes.split(",")]
  print("\n| size | batch x length | compiled GFLOP | bytes (GB) | roofline: compute / memory = ESTIMATE | "
        "measured (median, min-max) | measured / estimate | MFU: estimate / measured |")
  print("|---|---|---:|---:|---|---|---:|---|")
  for r in rows:
    print(f"| {r['size']} | {r['batch']} x {r['length']} | {r['compiled_flops'] / 1e9:.1f} | "
          f"{r['bytes_accessed'] / 1e9:.2f} | {r['roofline_compute_s'] * 1e3:.1f} / {r['roofline_memory_s'] * 1e3:.1f} "
          f"= **{r['roofline_s'] * 1e3:.1f} ms** ({r['bound']}) | {r['measured_s'] * 1e3:.1f} ms "
          f"({r['measured_min_s'] * 1e3:.1f}-{r['measured_max_s'] * 1e3:.1f}) | {r['measured_over_roofline']:.2f} | "
          f"{100 * r['implied_mfu_roofline']:.0f}% / {100 * r['mfu_measured']:.0f}% |")
  if args.json:
    pathlib.Path(args.json).write_text(json.dumps({"peak_flops": peak, "bandwidth": bw, "load": load, "rows": rows},
                                                  indent=1))


if __name__ == "__main__":
  main()
