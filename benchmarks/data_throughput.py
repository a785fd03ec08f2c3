"""Input-pipeline throughput: examples/s and tokens/s of the st5 training iterators.

    python benchmarks/data_throughput.py                      # the preset table
    python benchmarks/data_throughput.py --task st5_snli_devtest_triples --batch_size 512 --length 128

Reads $ST5_DATA_DIR (../shared/data by default) and $ST5_VOCAB. Tokens are the
non-padding token ids produced (all features). The first batches (start-up,
in-memory build of public tasks) are timed separately from the steady state; each
configuration runs --repeats times and the best run is shown (shared machines are noisy).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("ST5_DATA_DIR", str(REPO.parent / "shared" / "data"))
os.environ.setdefault("ST5_VOCAB", str(REPO.parent / "shared" / "data" / "t5_spiece" / "spiece.model"))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")


def measure(*, task: str, batch_size: int, length: int, batches: int, dedup: bool, mesh_devices: int,
            prefetch: int, warmup: int = 3) -> dict:
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from st5_jax.data import pipeline  # pylint: disable=g-import-not-at-top

  lengths = {"inputs": length, "targets": length}
  t0 = time.perf_counter()
  if mesh_devices:
    mesh = jax.make_mesh((mesh_devices,), ("data",), devices=jax.devices()[:mesh_devices])
    it = pipeline.make_train_iterator(task=task, feature_lengths=lengths, global_batch_size=batch_size, mesh=mesh,
                                      dedup=dedup, prefetch=prefetch)
  else:
    it = pipeline.make_local_iterator(task=task, feature_lengths=lengths, batch_size=batch_size, dedup=dedup,
                                      prefetch=prefetch)
  for _ in range(warmup):
    jax.block_until_ready(next(it))
  startup = time.perf_counter() - t0
  tokens = 0
  t1 = time.perf_counter()
  for _ in range(batches):
    batch = next(it)
    jax.block_until_ready(batch)
    tokens += sum(int(np.count_nonzero(np.asarray(v))) for v in batch.values())
  elapsed = time.perf_counter() - t1
  it.close()
  return {"task": task, "batch": batch_size, "length": length, "dedup": dedup, "mesh": mesh_devices,
          "prefetch": prefetch, "startup_s": startup, "examples_per_s": batches * batch_size / elapsed,
          "tokens_per_s": tokens / elapsed}


def measure_resume(*, rows: int, step: int, batch_size: int, num_readers: int = 1) -> dict:
  """Cost of set_state at `step` on a SimCSE-format CSV of `rows` triples (the paper's 275K)."""
  import csv  # pylint: disable=g-import-not-at-top
  import tempfile  # pylint: disable=g-import-not-at-top
  from st5_jax.data import pipeline, registry  # pylint: disable=g-import-not-at-top

  tmp = tempfile.mkdtemp(prefix="st5-resume-")
  path = os.path.join(tmp, "nli_for_simcse.csv")
  with open(pathlib.Path(os.environ["ST5_DATA_DIR"]) / "nli" / "snli_devtest_triples_derived.csv",
            newline="", encoding="utf-8") as f:
    base = list(csv.DictReader(f))
  with open(path, "w", newline="", encoding="utf-8") as f:
    w = csv.writer(f)
    w.writerow(["sent0", "sent1", "hard_neg"])
    for i in range(rows):
      r = base[i % len(base)]
      w.writerow([f"{r['sent0']} ({i})", r["sent1"], r["hard_neg"]])
  registry.register_user_task("bench_resume", file_pattern=path,
                              columns={"inputs": "sent0", "targets": "sent1", "negative_targets": "hard_neg"})
  kw = dict(task="bench_resume", feature_lengths={"inputs": 64, "targets": 64}, batch_size=batch_size,
            num_readers=num_readers)
  it = pipeline.make_local_iterator(**kw)
  next(it)
  state = it.get_state()
  it.close()
  state = {**state, "step": step, "block_start_step": step, "positions": {"bench_resume": step * batch_size}}
  out = {"rows": rows, "step": step, "batch": batch_size, "readers": num_readers}
  for label, hints in (("no_hint_s", {}), ("hint_s", None)):
    it = pipeline.make_local_iterator(**kw)
    if hints is None:  # what a state saved by this reader carries
      n = it._streams[0].count()  # pylint: disable=protected-access
      hints = {"bench_resume": {"0": n}}
    t0 = time.perf_counter()
    it.set_state({**state, "epoch_sizes": hints})
    next(it)
    out[label] = time.perf_counter() - t0
    out["epoch"] = it.stats["tasks"]["bench_resume"]["epoch"]
    it.close()
  return out


PRESETS = [
    dict(task="st5_stage1_public_qa", batch_size=512, length=64, dedup=False, mesh_devices=0, prefetch=2),
    dict(task="st5_stage1_public_qa", batch_size=512, length=128, dedup=False, mesh_devices=0, prefetch=2),
    dict(task="st5_stage1_public_qa", batch_size=512, length=64, dedup=True, mesh_devices=0, prefetch=2),
    dict(task="st5_snli_devtest_triples", batch_size=512, length=64, dedup=False, mesh_devices=0, prefetch=2),
    dict(task="st5_snli_devtest_triples", batch_size=512, length=64, dedup=True, mesh_devices=0, prefetch=2),
    dict(task="st5_snli_devtest_triples", batch_size=512, length=64, dedup=False, mesh_devices=8, prefetch=2),
    dict(task="st5_snli_devtest_triples", batch_size=512, length=64, dedup=False, mesh_devices=0, prefetch=0),
]


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--task", help="task or mixture (default: the preset table)")
  parser.add_argument("--batch_size", type=int, default=512)
  parser.add_argument("--length", type=int, default=64, help="inputs and targets length")
  parser.add_argument("--batches", type=int, default=40)
  parser.add_argument("--dedup", action="store_true")
  parser.add_argument("--mesh_devices", type=int, default=0, help="make global jax.Arrays on this many devices")
  parser.add_argument("--prefetch", type=int, default=2)
  parser.add_argument("--repeats", type=int, default=2, help="runs per configuration; the best is shown")
  parser.add_argument("--resume_rows", type=int, default=275_601, help="0 skips the resume measurement")
  parser.add_argument("--resume_step", type=int, default=10_000)
  args = parser.parse_args(argv)
  if args.mesh_devices or any(p["mesh_devices"] for p in PRESETS):
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
  runs = [dict(task=args.task, batch_size=args.batch_size, length=args.length, dedup=args.dedup,
               mesh_devices=args.mesh_devices, prefetch=args.prefetch)] if args.task else PRESETS
  print(f"{os.cpu_count()} CPU cores; data {os.environ['ST5_DATA_DIR']}")
  print(f"{'task':26} {'batch':>5} {'len':>4} {'dedup':>5} {'mesh':>4} {'pref':>4} {'startup s':>9} "
        f"{'examples/s':>10} {'tokens/s':>10}")
  for run in runs:
    r = max((measure(batches=args.batches, **run) for _ in range(args.repeats)), key=lambda x: x["examples_per_s"])
    print(f"{r['task']:26} {r['batch']:>5} {r['length']:>4} {str(r['dedup']):>5} {r['mesh']:>4} {r['prefetch']:>4} "
          f"{r['startup_s']:>9.1f} {r['examples_per_s']:>10.0f} {r['tokens_per_s']:>10.0f}")
  if args.resume_rows:
    print(f"\nResume cost (set_state + first batch) on a {args.resume_rows}-row SimCSE CSV:")
    print(f"{'step':>6} {'batch':>5} {'readers':>7} {'epoch':>5} {'no size hint s':>14} {'with hint s':>11}")
    for readers in (1, 8):
      r = measure_resume(rows=args.resume_rows, step=args.resume_step, batch_size=512 // readers,
                         num_readers=readers)
      print(f"{r['step']:>6} {r['batch']:>5} {r['readers']:>7} {r['epoch']:>5} {r['no_hint_s']:>14.1f} "
            f"{r['hint_s']:>11.1f}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
