"""Token caches at scale on this machine: Beam build rate, host read rate, resume time and memory vs corpus size.

    python benchmarks/cache_scale.py --out /tmp/st5_cache_scale --sizes 1000000  # ~490K-record shards, 128/128
    python benchmarks/cache_scale.py --out /tmp/x --sizes 100000 --beam_rows 20000 --shard_rows 50000  # a quick look

1. Build rate: a synthetic text corpus (`--beam_rows` question/answer pairs of words drawn
   from the T5 vocabulary, 1% repeated, in 32 JSON-lines files) is cached by the Beam
   pipeline (st5_jax.data.offline.beam_cache) on the DirectRunner, one worker and then
   `--direct_num_workers` processes, and by the in-memory writer; rows/s per worker.
2. Read side at sizes `--sizes` (default 1M and 10M pairs): caches of the same format
   (manifest, TFRecord shards of tf.Examples, ~`--shard_rows` records per shard: 490,000 by
   default, the size docs/data.md plans for 2B pairs) written straight from random token ids with the pure functions of st5_jax.data.offline.cache_writer --
   tokenising 10M texts through Beam's DirectRunner would take hours on 2 cores and measures nothing
   the build-rate step does not. Per size, in a fresh process each: the training
   iterator's steady read rate (batch 512, `--lengths` 128/128 by default, shuffled), its RSS
   before the iterator exists (imports, manifest) and at its peak, and resume time (new iterator + set_state + first batch) at 1%, 50% and 99% of an epoch,
   with the records read to resume.

Prints one table and writes OUT/results.json.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import pathlib
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("ST5_DATA_DIR", str(REPO.parent / "shared" / "data"))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

TASK = "synthetic_scale_qa"
BATCH = 512


def register(text_dir: str):
  from st5_jax.data import registry  # pylint: disable=g-import-not-at-top
  return registry.register_user_task(TASK, file_pattern=f"{text_dir}/part-*.jsonl",
                                     columns={"inputs": "q", "targets": "a"})


def _words():
  from st5_jax.data import tasks  # pylint: disable=g-import-not-at-top
  sp = tasks.get_vocabulary().tokenizer
  return [p[1:] for p in (sp.id_to_piece(i) for i in range(sp.get_piece_size()))
          if p.startswith("\u2581") and p[1:].isalpha() and len(p) > 3]


def write_text_corpus(text_dir: str, rows: int, files: int = 32, seed: int = 0) -> None:
  import numpy as np  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(seed)
  words = np.asarray(_words())
  os.makedirs(text_dir, exist_ok=True)
  per = -(-rows // files)
  made = []
  for f in range(files):
    if f * per >= rows:  # no empty files: a reader refuses them
      break
    with open(os.path.join(text_dir, f"part-{f:05d}.jsonl"), "w") as out:
      for _ in range(min(per, rows - f * per)):
        if made and rng.random() < 0.01:
          q, a = made[int(rng.integers(len(made)))]
        else:
          q = " ".join(rng.choice(words, int(rng.integers(6, 20)))) + "?"
          a = " ".join(rng.choice(words, int(rng.integers(10, 50)))) + "."
          if len(made) < 10000:
            made.append((q, a))
        out.write(json.dumps({"q": q, "a": a}) + "\n")


def _write_token_shards(args):
  """Shards [lo, hi) of a cache of random token ids; returns their manifest entries."""
  folder, lo, hi, num_shards, rows_per_shard, seed, (qmax, amax) = args
  import numpy as np  # pylint: disable=g-import-not-at-top
  from st5_jax.data import cache  # pylint: disable=g-import-not-at-top
  from st5_jax.data.offline import cache_writer  # pylint: disable=g-import-not-at-top
  entries = []
  for j in range(lo, hi):
    rng = np.random.default_rng([seed, j])
    n = rows_per_shard[j]
    heads = rng.integers(0, 1 << 62, n, dtype=np.int64)
    heads = heads - heads % num_shards + j  # a key whose shard is j, as shard_of computes it
    records = []
    qlen = rng.integers(qmax // 8, qmax * 5 // 8, n)  # 8-40 and 16-64 tokens at lengths 64/64
    alen = rng.integers(amax // 4, amax, n)
    ids = rng.integers(5, 32000, (n, max(qmax, amax)))
    for i in range(n):
      key = int(heads[i]).to_bytes(8, "big") + rng.bytes(8)
      q = ids[i, :qlen[i] - 1].tolist() + [1]
      a = ids[i, :alen[i] - 1][::-1].tolist() + [1]
      records.append((key, cache_writer.encode_example({"inputs": q, "targets": a})))
    data = cache_writer.encode_shard(records)
    with open(os.path.join(folder, cache.shard_name(j, num_shards)), "wb") as f:
      f.write(data)
    entries.append(cache_writer.shard_entry(j, num_shards, data, n))
  return entries


def write_token_cache(root: str, text_dir: str, rows: int, shard_rows: int, workers: int, lengths: dict) -> str:
  from st5_jax.data import cache  # pylint: disable=g-import-not-at-top
  from st5_jax.data.offline import cache_writer  # pylint: disable=g-import-not-at-top
  task, layout = cache_writer.resolve_task(TASK, "train", lengths)
  folder = cache.task_dir(root, TASK, "train")
  os.makedirs(folder, exist_ok=True)
  num_shards = max(1, round(rows / shard_rows))
  counts = [rows // num_shards + (1 if j < rows % num_shards else 0) for j in range(num_shards)]
  bounds = [(folder, j * num_shards // workers, (j + 1) * num_shards // workers, num_shards, counts, 0,
             (lengths["inputs"], lengths["targets"])) for j in range(workers)]
  with multiprocessing.get_context("spawn").Pool(workers) as pool:
    entries = [e for part in pool.map(_write_token_shards, bounds) for e in part]
  manifest = cache_writer.make_manifest(
      task=TASK, split="train", features=cache_writer.feature_specs(task, layout),
      vocabulary_sha256=cache.vocabulary_sha256(task, layout), shards=entries,
      stats={"synthetic": "random token ids (benchmarks/cache_scale.py)", "examples": rows}, pipeline="synthetic",
      dedup=False, decontaminated=None)
  with open(os.path.join(folder, cache.MANIFEST), "wb") as f:
    f.write(cache_writer.manifest_bytes(manifest))
  return folder


# ----------------------------------------------------------------------------- measurements (child processes)


def _iterator(root: str, lengths: dict):
  from st5_jax.data.iterator import make_local_iterator  # pylint: disable=g-import-not-at-top
  return make_local_iterator(task=TASK, feature_lengths=lengths, batch_size=BATCH, seed=3, cache_dir=root)


def _rss_mib() -> float:
  with open("/proc/self/status") as f:
    return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def measure_read(root: str, text_dir: str, batches: int, lengths: dict) -> dict:
  import resource  # pylint: disable=g-import-not-at-top
  from st5_jax.data import cache, cache_stream  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  register(text_dir)
  cache.CacheReader(cache_folder(root))  # the manifest
  before = _rss_mib()  # imports (TF, JAX, seqio) and the manifest; no iterator, no reader thread yet
  it = _iterator(root, lengths)
  for _ in range(5):
    next(it)
  start = time.perf_counter()
  for _ in range(batches):
    next(it)
  secs = time.perf_counter() - start
  it.close()
  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
  return {"rows_per_s": batches * BATCH / secs, "rss_before_mib": before, "peak_rss_mib": peak,
          "stream_mib": peak - before}


def measure_resume(root: str, text_dir: str, fraction: float, check: bool, lengths: dict) -> dict:
  import numpy as np  # pylint: disable=g-import-not-at-top
  register(text_dir)
  probe = _iterator(root, lengths)
  state = probe.get_state()
  probe.close()
  from st5_jax.data import cache  # pylint: disable=g-import-not-at-top
  epoch = cache.CacheReader(cache.task_dir(root, TASK, "train")).manifest["num_examples"]
  step = int(fraction * epoch) // BATCH
  state.update(step=step, block_start_step=step)
  state["positions"][TASK] = step * BATCH
  state["cursors"]["0"][TASK] = [0, step * BATCH]
  start = time.perf_counter()
  it = _iterator(root, lengths)
  it.set_state(state)
  batch = next(it)
  secs = time.perf_counter() - start
  stream = it._streams[0]  # pylint: disable=protected-access
  out = {"fraction": fraction, "step": step, "seconds": secs, "records_read": stream.resume_records_read,
         "position": list(stream.position())}
  it.close()
  if check:  # the crafted state resumes where reading from the start gets to
    ref = _iterator(root, lengths)
    for _ in range(step):
      next(ref)
    want = next(ref)
    out["same_as_reading_through"] = all(np.array_equal(np.asarray(batch[k]), np.asarray(want[k])) for k in want)
    ref.close()
  return out


def _child(kind: str, **kw) -> dict:
  code = (f"import json, sys; sys.path.insert(0, {str(REPO / 'benchmarks')!r}); import cache_scale as c; "
          f"print('RESULT ' + json.dumps(c.{kind}(**{kw!r})))")
  out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
  return json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[7:])


# ----------------------------------------------------------------------------- build rate


def measure_build(out: str, text_dir: str, rows: int, workers: int, shards: int, lengths: dict) -> dict:
  """Seconds per writer; the Beam rate per worker from two corpus sizes (fixed start-up cancels)."""
  from st5_jax.data.offline import beam_cache, cache_writer  # pylint: disable=g-import-not-at-top
  t = time.perf_counter()
  cache_writer.contamination_index(True)  # built once per run on the driver; timed apart
  res = {"rows": rows, "evaluation_index_s": time.perf_counter() - t}
  small = os.path.join(out, "text_small")
  if not os.path.exists(small):
    write_text_corpus(small, rows // 10)
  rows, small_rows = _lines(text_dir), _lines(small)  # as written (a corpus left by an earlier run may differ)
  res["rows"], res["small_rows"] = rows, small_rows
  runs = {}
  for corpus, n in ((small, small_rows), (text_dir, rows)):
    register(corpus)
    t = time.perf_counter()
    m = cache_writer.write_cache(TASK, "train", os.path.join(out, f"mem_{n}"), shards, lengths)
    runs[("in_memory", n)] = time.perf_counter() - t
    for name, extra in (("beam_1_worker", ["--direct_num_workers=1"]),
                        (f"beam_{workers}_workers", [f"--direct_num_workers={workers}",
                                                     "--direct_running_mode=multi_processing"])):
      if n != rows and name != "beam_1_worker":
        continue
      t = time.perf_counter()
      mb = beam_cache.write_cache_beam(TASK, "train", os.path.join(out, f"{name}_{n}"), shards, lengths,
                                       pipeline_args=["--runner=DirectRunner", *extra])
      runs[(name, n)] = time.perf_counter() - t
      assert [s["sha256"] for s in mb["shards"]] == [s["sha256"] for s in m["shards"]], name
  res["seconds"] = {f"{k} {n}": v for (k, n), v in runs.items()}
  for name in ("in_memory", "beam_1_worker"):
    res[f"{name}_rows_per_s"] = (rows - small_rows) / (runs[(name, rows)] - runs[(name, small_rows)])
  res["examples"] = m["num_examples"]
  res["dropped_duplicates"] = m["stats"]["dropped_duplicates"]
  res["shard_bytes"] = sum(s["bytes"] for s in m["shards"])
  return res


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--out", required=True)
  ap.add_argument("--sizes", default="1000000,10000000")
  ap.add_argument("--beam_rows", type=int, default=100000)
  ap.add_argument("--shard_rows", type=int, default=490000)
  ap.add_argument("--lengths", default="128,128", help="inputs,targets token lengths")
  ap.add_argument("--workers", type=int, default=2)
  ap.add_argument("--read_batches", type=int, default=300)
  ap.add_argument("--skip_build", action="store_true")
  ap.add_argument("--write_only", action="store_true", help="write the corpora and caches, measure nothing")
  args = ap.parse_args()
  out = os.path.abspath(args.out)
  text_dir = os.path.join(out, "text")
  qlen, alen = (int(x) for x in args.lengths.split(","))
  lengths = {"inputs": qlen, "targets": alen}
  results = {"machine": f"{os.cpu_count()} CPUs", "batch": BATCH, "lengths": lengths,
             "shard_rows": args.shard_rows, "load_average_at_start": os.getloadavg()}
  if not os.path.exists(os.path.join(text_dir, "part-00000.jsonl")):
    write_text_corpus(text_dir, args.beam_rows)
  register(text_dir)
  if not args.skip_build and not args.write_only:
    results["build"] = _child("measure_build", out=os.path.join(out, "build"), text_dir=text_dir,
                              rows=args.beam_rows, workers=args.workers, shards=16, lengths=lengths)
    print(json.dumps(results["build"]), flush=True)
  results["sizes"] = {}
  for size in (int(s) for s in args.sizes.split(",")):
    root = os.path.join(out, f"cache_{size}_{args.shard_rows}_{qlen}x{alen}")
    if not os.path.exists(os.path.join(cache_folder(root), "manifest.json")):
      t = time.perf_counter()
      write_token_cache(root, text_dir, size, args.shard_rows, args.workers, lengths)
      print(f"wrote {size} rows in {time.perf_counter() - t:.0f} s", flush=True)
    if args.write_only:
      continue
    r = {"read": _child("measure_read", root=root, text_dir=text_dir, batches=args.read_batches, lengths=lengths),
         "resume": [_child("measure_resume", root=root, text_dir=text_dir, fraction=f, check=(f == 0.01),
                           lengths=lengths) for f in (0.01, 0.5, 0.99)]}
    r["shards"] = len([n for n in os.listdir(cache_folder(root)) if n != "manifest.json"])
    r["bytes"] = sum(os.path.getsize(os.path.join(cache_folder(root), n)) for n in os.listdir(cache_folder(root)))
    results["sizes"][size] = r
    print(size, json.dumps(r), flush=True)
  if args.write_only:
    return
  results["load_average_at_end"] = os.getloadavg()
  with open(os.path.join(out, "results.json"), "w") as f:
    json.dump(results, f, indent=1)
  print_table(results)


def _lines(folder: str) -> int:
  return sum(1 for name in os.listdir(folder) for _ in open(os.path.join(folder, name)))


def cache_folder(root: str) -> str:
  return os.path.join(root, TASK, "train")


def print_table(results: dict) -> None:
  b = results.get("build")
  if b:
    print(f"\nBuild ({b['rows']:,} pairs -> {b['examples']:,} examples, {b['shard_bytes'] / 2**20:.1f} MiB; "
          f"evaluation index {b['evaluation_index_s']:.1f} s once):")
    for k, v in b["seconds"].items():
      print(f"  {k:>24}: {v:7.1f} s")
    print(f"  per worker, without start-up: in memory {b['in_memory_rows_per_s']:,.0f} rows/s, "
          f"Beam DirectRunner {b['beam_1_worker_rows_per_s']:,.0f} rows/s")
  print(f"\nlengths {results['lengths']}, ~{results['shard_rows']:,} records a shard; load average "
        f"{results['load_average_at_start']} at the start, {results.get('load_average_at_end')} at the end")
  print("\n| pairs | cache | read rows/s | RSS before / peak | resume 1% | resume 50% | resume 99% | "
        "records read to resume |")
  print("|---|---|---|---|---|---|---|---|")
  for size, r in results["sizes"].items():
    res, rd = r["resume"], r["read"]
    print(f"| {int(size):,} ({r.get('shards', '?')} shards) | {r['bytes'] / 2**30:.2f} GiB | {rd['rows_per_s']:,.0f} | "
          f"{rd['rss_before_mib']:.0f} / {rd['peak_rss_mib']:.0f} MiB | " +
          " | ".join(f"{x['seconds']:.2f} s" for x in res) + " | " +
          " / ".join(f"{x['records_read']:,}" for x in res) + " |")


if __name__ == "__main__":
  main()
