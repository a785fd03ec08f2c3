"""Input-pipeline throughput of both data paths: examples/s and tokens/s, and the cost of resuming.

    python benchmarks/data_throughput.py                      # the preset table, both paths
    python benchmarks/data_throughput.py --task st5_snli_devtest_triples --path seqio --batch_size 512

Paths: `numpy` (this project's sources, rows shuffled and tokenised in blocks from Python)
and `seqio` (the same tasks through seqio.get_dataset + DualEncoderFeatureConverter, as
any user's seqio Task runs; `make_train_iterator(numpy_path=False)`). Reads $ST5_DATA_DIR
(../shared/data by default) and $ST5_VOCAB. Tokens are the non-padding token ids produced
(all features). Start-up (first batches) is timed apart from the steady state; each
configuration runs --repeats times and the best run is shown (shared machines are noisy).

Resuming is measured on the paper's stage 2 size: a 275,601-row NLI triples file, state
at step 10,000 of batch 512 (epoch 18, offset 159,182): the NumPy path on the CSV
(users' FileSource task), the seqio path on the same rows as a TSV read by a
TextLineDataSource task with a parsing preprocessor (a typical t5x user task).
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


def measure(*, task: str, path: str, batch_size: int, length: int, batches: int, dedup: bool, mesh_devices: int,
            prefetch: int, warmup: int = 3) -> dict:
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from st5_jax.data import iterator  # pylint: disable=g-import-not-at-top

  lengths = {"inputs": length, "targets": length}
  name = f"bench_resume_{path}" if task == LARGE else task
  kw = dict(task=name, feature_lengths=lengths, dedup=dedup, prefetch=prefetch, numpy_path=(path == "numpy"))
  t0 = time.perf_counter()
  if mesh_devices:
    mesh = jax.make_mesh((mesh_devices,), ("data",), devices=jax.devices()[:mesh_devices])
    it = iterator.make_train_iterator(global_batch_size=batch_size, mesh=mesh, **kw)
  else:
    it = iterator.make_local_iterator(batch_size=batch_size, **kw)
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
  return {"task": task, "path": path, "batch": batch_size, "length": length, "dedup": dedup, "mesh": mesh_devices,
          "prefetch": prefetch, "startup_s": startup, "examples_per_s": batches * batch_size / elapsed,
          "tokens_per_s": tokens / elapsed}


def _write_rows(rows: int, tmp: str) -> tuple[str, str]:
  """The shipped triples repeated (made distinct) to `rows` rows, as SimCSE's CSV and as a TSV."""
  import csv  # pylint: disable=g-import-not-at-top
  with open(pathlib.Path(os.environ["ST5_DATA_DIR"]) / "nli" / "snli_devtest_triples_derived.csv",
            newline="", encoding="utf-8") as f:
    base = list(csv.DictReader(f))
  csv_path, tsv_path = os.path.join(tmp, "nli_for_simcse.csv"), os.path.join(tmp, "nli.tsv")
  with open(csv_path, "w", newline="", encoding="utf-8") as f, open(tsv_path, "w", encoding="utf-8") as g:
    w = csv.writer(f)
    w.writerow(["sent0", "sent1", "hard_neg"])
    for i in range(rows):
      r = base[i % len(base)]
      w.writerow([f"{r['sent0']} ({i})", r["sent1"], r["hard_neg"]])
      g.write(f"{r['sent0']} ({i})\t{r['sent1']}\t{r['hard_neg']}\n")
  return csv_path, tsv_path


def _register_resume_tasks(csv_path: str, tsv_path: str) -> None:
  import seqio  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from st5_jax.data import registry, vocabulary  # pylint: disable=g-import-not-at-top
  registry.register_user_task("bench_resume_numpy", file_pattern=csv_path,
                              columns={"inputs": "sent0", "targets": "sent1", "negative_targets": "hard_neg"})

  @seqio.map_over_dataset
  def parse(line):
    a, b, c = tf.io.decode_csv(line, record_defaults=["", "", ""], field_delim="\t", use_quote_delim=False)
    return {"inputs": a, "targets": b, "negative_targets": c}

  seqio.TaskRegistry.remove("bench_resume_seqio")
  seqio.TaskRegistry.add("bench_resume_seqio", source=seqio.TextLineDataSource({"train": tsv_path}),
                         preprocessors=[parse, seqio.preprocessors.tokenize, seqio.preprocessors.append_eos_after_trim],
                         output_features={k: seqio.Feature(vocabulary=vocabulary.get_vocabulary(), add_eos=True)
                                          for k in ("inputs", "targets", "negative_targets")})


def _shard_size(rows: int, reader: int, readers: int) -> int:
  return len(range(reader, rows, readers))  # one file: seqio and the NumPy path both shard records i mod n


def measure_resume(*, path: str, rows: int, step: int, batch_size: int, num_readers: int = 1) -> dict:
  """set_state at `step` plus the first batch: with this reader's cursor, and without (counted)."""
  from st5_jax.data import iterator  # pylint: disable=g-import-not-at-top
  task = f"bench_resume_{path}"
  kw = dict(task=task, feature_lengths={"inputs": 64, "targets": 64}, batch_size=batch_size,
            num_readers=num_readers, numpy_path=(path == "numpy"))
  it = iterator.make_local_iterator(**kw)
  state = it.get_state()
  it.close()
  position = step * batch_size
  cursor = list(divmod(position, _shard_size(rows, 0, num_readers)))
  state = {**state, "step": step, "block_start_step": step, "positions": {task: position}}
  out = {"path": path, "rows": rows, "step": step, "batch": batch_size, "readers": num_readers, "epoch": cursor[0],
         "offset": cursor[1]}
  for label, cursors in (("cursor_s", {"0": {task: cursor}}), ("no_cursor_s", {})):
    it = iterator.make_local_iterator(**kw)
    t0 = time.perf_counter()
    it.set_state({**state, "cursors": cursors})
    next(it)
    out[label] = time.perf_counter() - t0
    assert it.stats["tasks"][task]["epoch"] == cursor[0], it.stats["tasks"][task]
    it.close()
  return out


# "nli_275k": the resume file below, one long epoch (the NumPy path reads the CSV, seqio the TSV).
LARGE = "nli_275k"
PRESETS = [
    dict(task=LARGE, batch_size=512, length=64, dedup=False, mesh_devices=0, prefetch=2),
    dict(task="st5_stage1_public_qa", batch_size=512, length=64, dedup=False, mesh_devices=0, prefetch=2),
    dict(task="st5_snli_devtest_triples", batch_size=512, length=64, dedup=False, mesh_devices=0, prefetch=2),
    dict(task="st5_snli_devtest_triples", batch_size=512, length=64, dedup=True, mesh_devices=0, prefetch=2),
    dict(task="st5_snli_devtest_triples", batch_size=512, length=64, dedup=False, mesh_devices=8, prefetch=2),
]


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--task", help=f"task or mixture, or {LARGE!r} (default: the preset table)")
  parser.add_argument("--path", choices=("numpy", "seqio", "both"), default="both")
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
  if args.mesh_devices or (not args.task and any(p["mesh_devices"] for p in PRESETS)):
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
  paths = ("numpy", "seqio") if args.path == "both" else (args.path,)
  runs = [dict(task=args.task, batch_size=args.batch_size, length=args.length, dedup=args.dedup,
               mesh_devices=args.mesh_devices, prefetch=args.prefetch)] if args.task else PRESETS
  print(f"{os.cpu_count()} CPU cores, load average {os.getloadavg()[0]:.1f}; data {os.environ['ST5_DATA_DIR']}")
  if args.resume_rows:
    import tempfile  # pylint: disable=g-import-not-at-top
    _register_resume_tasks(*_write_rows(args.resume_rows, tempfile.mkdtemp(prefix="st5-resume-")))
  else:
    runs = [r for r in runs if r["task"] != LARGE]
  print(f"{'task':26} {'path':>5} {'batch':>5} {'len':>4} {'dedup':>5} {'mesh':>4} {'startup s':>9} "
        f"{'examples/s':>10} {'tokens/s':>10}")
  for run in runs:
    for path in paths:
      r = max((measure(batches=args.batches, path=path, **run) for _ in range(args.repeats)),
              key=lambda x: x["examples_per_s"])
      print(f"{r['task']:26} {r['path']:>5} {r['batch']:>5} {r['length']:>4} {str(r['dedup']):>5} {r['mesh']:>4} "
            f"{r['startup_s']:>9.1f} {r['examples_per_s']:>10.0f} {r['tokens_per_s']:>10.0f}", flush=True)
  if args.resume_rows:
    print(f"\nResume cost (set_state + first batch) on {args.resume_rows} NLI triples, batch 512 over the readers:")
    print(f"{'path':>5} {'step':>6} {'batch':>5} {'readers':>7} {'epoch':>5} {'offset':>7} {'with cursor s':>13} "
          f"{'counted s':>9}")
    for path in paths:
      for readers in (1, 8):
        r = measure_resume(path=path, rows=args.resume_rows, step=args.resume_step, batch_size=512 // readers,
                           num_readers=readers)
        print(f"{r['path']:>5} {r['step']:>6} {r['batch']:>5} {r['readers']:>7} {r['epoch']:>5} {r['offset']:>7} "
              f"{r['cursor_s']:>13.1f} {r['no_cursor_s']:>9.1f}", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
