"""Retrieval benchmarks: corpus encoding against sentence-transformers, index and search, a v4-8 projection.

    python benchmarks/retrieval_bench.py --json r.json                # all parts (an hour or more on 2 cores)
    python benchmarks/retrieval_bench.py --quick                      # tiny sizes: a smoke run in a few minutes
    python benchmarks/retrieval_bench.py --part index --sizes 100000  # one part, 10^5 vectors only

Figures only, no timed assertions (the one assertion: both encoders' embeddings agree).

encode   The ReQA-SQuAD sentences and WikiQA's candidate sentences (st5_jax.evaluation.retrieval_readers)
         encoded by sentence-transformers' `encode` of the SAME model (--model exported with st5_jax.export to
         a temporary folder, loaded with SentenceTransformer(folder, device="cpu")) and by st5_jax three ways:
         `SentenceEncoder.encode`, `st5 index`'s MeshEncoder and `build_index` over a JSONL of the corpus
         (encode + shard writing; its own encode seconds). Same max length, batch size and float32 on both
         sides. Every encoder runs one untimed pass first (st5_jax compiles one program per length bucket
         there), then the best of --repeats passes is reported.
index    Random unit vectors (float32, fixed seed) at each of --sizes, and a clustered corpus (--clusters
         Gaussian clusters) for contrast: writing the index (retrieval.index.from_embeddings), exact search
         (search.exact_search over the index, one untimed call on the first block compiles), faiss IVF and HNSW
         with ann.py's default parameters (build, queries/s, Recall@k against exact). Each step runs in its own
         subprocess that reports its peak RSS (VmHWM of /proc/self/status at its end) and the peak before the
         step (imports and vectors). Not getrusage: RUSAGE_CHILDREN is a maximum over every child so far, and
         Linux carries a parent's ru_maxrss into a child over fork and exec (each child read 1.3 GiB here, the
         parent's size). Random vectors have no clusters: the hardest case for IVF.
project  Hours to encode 8.8M (MS MARCO) and 21M (DPR Wikipedia) passages on a v4-8. (a) An estimate from
         the encode step's compiled cost: `st5 index`'s jitted tower (bf16, scan_layers=False so that XLA's
         cost analysis counts every layer) compiled with libtpu AOT for v4:2x2x1 (4 chips, one JAX device
         each; no TPU needed), batch split over the chips; per-chip FLOPs and bytes accessed of the compiled
         program; roofline time per batch = max(FLOPs / peak, bytes / HBM bandwidth): a lower bound on the
         time, every passage padded to the length. (b) From the CPU rate measured in `encode`.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import pathlib
import platform
import shutil
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("ST5_DATA_DIR", str(REPO.parent / "shared" / "data"))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

CORPORA = {"MS MARCO passages": 8_841_823, "DPR Wikipedia passages": 21_015_324}
# Google Cloud's TPU v4 page (cloud.google.com/tpu/docs/v4): 275 TFLOP/s bf16 and "32 GiB, 1200 GBps" of HBM2 a
# chip. The peak is aot.CHIPS' (the same figure); the bandwidth is a flag.
V4_HBM_BYTES_PER_S = 1200e9
PROJECT_MODELS = {"t5_base": 768, "t5_mini": 256}  # size -> projection: the paper's ST5 Base, the CPU demo's tower
FULL = dict(limit=0, repeats=2, sizes="100000,1000000", clustered=100_000, clusters=1000, queries=1000,
            hnsw_max=100_000, models="t5_base,t5_mini", lengths="128,256", project_batch=1024)
QUICK = dict(limit=256, repeats=1, sizes="4000", clustered=4000, clusters=40, queries=100, hnsw_max=4000,
             models="t5_mini", lengths="64", project_batch=256)


def environment() -> dict:
  import faiss
  import jax
  import sentence_transformers
  import torch
  cpuinfo = pathlib.Path("/proc/cpuinfo").read_text().splitlines()
  cpu = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), "")
  return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
          "jax": jax.__version__, "torch": torch.__version__,
          "sentence_transformers": sentence_transformers.__version__,
          "faiss": faiss.__version__, "python": platform.python_version(), "cpu": cpu, "cpu_count": os.cpu_count(),
          "cores_usable": len(os.sched_getaffinity(0)), "torch_threads": torch.get_num_threads(),
          "load_average": os.getloadavg()}


# ------------------------------------------------------------------------------------------------ encode


def best_rate(fn, texts, repeats: int, *, warm_up=None):
  """(sentences/s of the best of `repeats` timed passes after one untimed warm-up pass, the last output).

  warm_up: the texts of the warm-up pass (default all: st5_jax compiles one program per length bucket there).
  """
  out = fn(texts if warm_up is None else warm_up)
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    out = fn(texts)
    best = min(best, time.perf_counter() - start)
  return len(texts) / best, out


def encode_part(args, work: pathlib.Path) -> dict:
  import jax
  import numpy as np
  from sentence_transformers import SentenceTransformer

  from st5_jax import paths
  from st5_jax.encoder import SentenceEncoder
  from st5_jax.evaluation import retrieval_readers
  from st5_jax.export import export_model
  from st5_jax.retrieval import index as index_lib

  root = paths.data_dir(None)
  corpora = {"ReQA-SQuAD sentences": retrieval_readers.read_squad(root)[0].corpus,
             "WikiQA candidate sentences": retrieval_readers.read_wikiqa(root).corpus}
  st_dir = work / "st_export"
  export_model(args.model, format="sentence-transformers", out=st_dir, max_length=args.max_length)
  st = SentenceTransformer(str(st_dir), device="cpu")
  if st.max_seq_length != args.max_length:
    raise RuntimeError(f"the exported model's max_seq_length is {st.max_seq_length}, expected {args.max_length}")
  enc = SentenceEncoder.load(args.model, max_length=args.max_length, dtype="float32", batch_size=args.batch_size)
  devices = jax.local_devices()
  per_device = max(1, args.batch_size // len(devices))  # MeshEncoder's batch_size is per device
  mesh_enc = index_lib.MeshEncoder(index_lib.load_model(args.model, max_length=args.max_length, dtype="float32"),
                                   devices=devices, batch_size=per_device)
  print(f"# encode: {args.model} ({enc.config.t5.num_encoder_layers} layers, width {enc.config.t5.emb_dim}, "
        f"{enc.config.pooling}, dim {enc.dim}), max length {args.max_length}, batch {args.batch_size}, float32; "
        f"MeshEncoder {mesh_enc.describe()}; one warm-up pass each (compiles excluded), best of {args.repeats}",
        flush=True)

  runs = itertools.count()  # every build writes a fresh folder: nothing is resumed

  def build(texts, ids):
    """build_index over a JSONL of the texts: (embeddings, its encode seconds, shard writing included)."""
    run = next(runs)
    corpus, out = work / f"corpus-{run}.jsonl", work / f"index-{run}"
    corpus.write_text("".join(json.dumps({"_id": i, "text": t}) + "\n" for i, t in zip(ids, texts)))
    report = index_lib.build_index(args.model, [str(corpus)], str(out), batch_size=per_device,
                                   max_length=args.max_length, ann="none", devices=devices, progress=lambda _: None)
    emb = index_lib.Index.open(str(out)).embeddings()
    shutil.rmtree(out)
    return emb, report.encode_seconds

  rows = []
  for name, corpus in corpora.items():
    ids, texts = list(corpus), list(corpus.values())
    if args.limit:
      ids, texts = ids[:args.limit], texts[:args.limit]
    tokens = float(np.mean([len(r) for r in enc.tokenize(texts)]))
    st_rate, ref = best_rate(lambda t: st.encode(t, batch_size=args.batch_size, convert_to_numpy=True), texts,
                             args.repeats, warm_up=texts[:4 * args.batch_size])  # torch compiles nothing
    row = {"corpus": name, "sentences": len(texts), "mean_tokens": tokens, "sentence_transformers": st_rate}
    ours = {"SentenceEncoder.encode": lambda t: enc.encode(t, batch_size=args.batch_size),
            "MeshEncoder.encode": mesh_enc.encode}
    for label, fn in ours.items():
      rate, emb = best_rate(fn, texts, args.repeats)
      row[label] = {"sentences_per_s": rate, "ratio_to_st": rate / st_rate, "max_abs_diff": float(abs(emb - ref).max())}
    build(texts, ids)  # warm-up
    timed = [build(texts, ids) for _ in range(args.repeats)]
    emb, rate = timed[-1][0], len(texts) / min(seconds for _, seconds in timed)
    row["build_index"] = {"sentences_per_s": rate, "ratio_to_st": rate / st_rate,
                          "max_abs_diff": float(abs(emb - ref).max())}
    print(f"{name:<27} {len(texts):>6} sentences, {tokens:.1f} tokens on average | sentence-transformers "
          f"{st_rate:7.1f}/s", flush=True)
    for label in (*ours, "build_index"):
      r = row[label]
      print(f"  st5_jax {label:<22} {r['sentences_per_s']:7.1f}/s  ratio {r['ratio_to_st']:.2f}  "
            f"max|diff| vs ST {r['max_abs_diff']:.2e}", flush=True)
      assert r["max_abs_diff"] < 1e-3, f"{label} disagrees with sentence-transformers on {name}: {r['max_abs_diff']}"
    rows.append(row)
  total = sum(r["sentences"] for r in rows)
  index_rate = total / sum(r["sentences"] / r["build_index"]["sentences_per_s"] for r in rows)
  mean_tokens = sum(r["mean_tokens"] * r["sentences"] for r in rows) / total
  return {"model": str(args.model), "config": enc.config.to_dict(), "max_length": args.max_length,
          "batch_size": args.batch_size, "rows": rows, "st5_index_rate": index_rate, "mean_tokens": mean_tokens}


# ------------------------------------------------------------------------------------------------ index


def vectors(kind: str, n: int, dim: int, seed: int, *, clusters: int, queries: bool = False):
  """float32 [n, dim] unit vectors: uniform on the sphere, or around `clusters` random unit centres (the
  documents and the queries share the centres; noise of norm ~1, as ann.py's measurements)."""
  import numpy as np
  rng = np.random.default_rng([seed, n, int(queries)])
  x = rng.standard_normal((n, dim), dtype=np.float32)
  if kind == "clustered":
    centres = np.random.default_rng([seed, clusters]).standard_normal((clusters, dim), dtype=np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    x /= np.float32(np.sqrt(dim))
    x += centres[rng.integers(clusters, size=n)]
  x /= np.sqrt(np.einsum("ij,ij->i", x, x))[:, None]  # no [n, dim] temporary
  return x


def child(spec: dict) -> dict:
  """One step of the index part, in this (sub)process: its figures and its peak RSS."""
  import numpy as np

  from st5_jax.retrieval import ann as ann_lib
  from st5_jax.retrieval import index as index_lib
  from st5_jax.retrieval import search

  def peak_mib() -> float:
    """VmHWM: the peak RSS of this process's address space (getrusage's ru_maxrss would carry the parent's
    peak over fork and exec: Linux keeps the larger of the two)."""
    status = pathlib.Path("/proc/self/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:"))) / 1024

  kind, n, k, step, out = spec["kind"], spec["n"], spec["k"], spec["step"], spec["out"]
  make = dict(dim=spec["dim"], seed=spec["seed"], clusters=spec["clusters"])
  result = {}
  if step == "write":
    emb = vectors(kind, n, **make)
    ids = [str(i) for i in range(n)]
    before = peak_mib()
    start = time.perf_counter()
    index_lib.from_embeddings(out, ids, emb, ann="none")
    result["seconds"] = time.perf_counter() - start
    result["bytes"] = sum(f.stat().st_size for f in pathlib.Path(out).iterdir())
  else:
    index = index_lib.Index.open(out)
    q = vectors(kind, spec["queries"], **make, queries=True)
    if step == "exact":
      search.exact_search(q, index.shard(0)[:search.DEFAULT_BLOCK_SIZE], k)  # compiles this call's shapes
      before = peak_mib()
      start = time.perf_counter()
      _, top = search.exact_search(q, index, k)
      result["queries_per_s"] = len(q) / (time.perf_counter() - start)
      np.save(pathlib.Path(out).parent / "exact.npy", top)
    else:
      ann_kind, params = ann_lib.resolve(step, n)
      before = peak_mib()
      start = time.perf_counter()
      ann = ann_lib.build(ann_kind, params, dim=index.dim, n=n,
                          blocks=lambda: (b for _, b in index.iter_blocks(index_lib.DEFAULT_SHARD_SIZE)))
      result["build_seconds"] = time.perf_counter() - start
      ann_lib.search(ann, ann_kind, params, q[:8], k)  # untimed: faiss starts its OpenMP threads here
      start = time.perf_counter()
      _, top = ann_lib.search(ann, ann_kind, params, q, k)
      result["queries_per_s"] = len(q) / (time.perf_counter() - start)
      exact = np.load(pathlib.Path(out).parent / "exact.npy")
      result["recall"] = float(np.mean([len(np.intersect1d(a, e)) / k for a, e in zip(top, exact)]))
      result["params"] = params
      result["bytes"] = len(ann_lib.to_bytes(ann))
  return {**result, "rss_before_mib": before, "peak_rss_mib": peak_mib()}


def index_part(args, work: pathlib.Path) -> list[dict]:
  datasets = [("random", int(s)) for s in args.sizes.split(",") if s]
  if args.clustered:
    datasets.append(("clustered", args.clustered))
  print(f"# index: dim {args.dim} float32 unit vectors, seed {args.seed}, {args.queries} queries, k={args.k}; "
        f"clustered: {args.clusters} centres, noise of norm ~1; every step its own subprocess (peak RSS)", flush=True)
  rows = []
  for kind, n in datasets:
    out = work / f"{kind}-{n}" / "index"
    steps = ["write", "exact", "ivf"] + (["hnsw"] if n <= args.hnsw_max else [])
    for step in steps:
      spec = dict(kind=kind, n=n, step=step, out=str(out), dim=args.dim, seed=args.seed, clusters=args.clusters,
                  queries=args.queries, k=args.k, result=str(work / "child.json"))
      timeout = args.hnsw_timeout if step == "hnsw" else args.step_timeout
      row = {"corpus": kind, "n": n, "step": step, "k": args.k}
      try:
        subprocess.run([sys.executable, __file__, "--_child", json.dumps(spec)], check=True, timeout=timeout)
        row.update(json.loads(pathlib.Path(spec["result"]).read_text()))
      except subprocess.TimeoutExpired:
        row["timeout_s"] = timeout
      rows.append(row)
      print(index_line(row), flush=True)
    shutil.rmtree(out.parent)
  return rows


def index_line(r: dict) -> str:
  head = f"{r['corpus']:<9} N={r['n']:>8,} {r['step']:<5}"
  if "timeout_s" in r:
    return f"{head} not finished within {r['timeout_s']} s (stopped; no figure)"
  mem = f"peak RSS {r['peak_rss_mib']:7.0f} MiB (before the step {r['rss_before_mib']:.0f})"
  if r["step"] == "write":
    return f"{head} from_embeddings {r['seconds']:7.2f} s, {r['bytes'] / 2**20:.0f} MiB on disk | {mem}"
  if r["step"] == "exact":
    return f"{head} exact_search {r['queries_per_s']:9.1f} queries/s | {mem}"
  return (f"{head} {r['params']} build {r['build_seconds']:7.2f} s, {r['queries_per_s']:9.1f} queries/s, "
          f"Recall@{r['k']} vs exact {r['recall']:.3f}, {r['bytes'] / 2**20:.0f} MiB | {mem}")


# ------------------------------------------------------------------------------------------------ project


def project_part(args, encode: dict | None) -> dict:
  import flax.linen as nn
  import jax
  import numpy as np

  from st5_jax import aot, configs, flops, partitioning
  from st5_jax.model.st5 import abstract_params
  from st5_jax.retrieval import index as index_lib

  devices = list(aot.get_topology(args.topology).devices)
  peak = aot.chip_spec(devices[0]).peak_bf16_flops
  mesh = partitioning.make_mesh(partitioning.MeshConfig(data=len(devices)), devices)
  replicated = partitioning.replicated(mesh)  # parameters on every chip, the batch split (as MeshEncoder)
  B = args.project_batch
  print(f"# project (ESTIMATE): {args.topology}, {len(devices)} x {devices[0].device_kind}, batch {B} split over "
        f"them, bf16; roofline per chip with {peak / 1e12:.0f} TFLOP/s bf16 and {args.hbm_gbps:.0f} GB/s HBM (Google "
        "Cloud's TPU v4 page); every passage padded to the length", flush=True)
  rows = []
  for size in args.models.split(","):
    for length in (int(x) for x in args.lengths.split(",")):
      config = configs.ST5Config(t5=configs.t5_size(size, dtype="bfloat16", scan_layers=False, dropout_rate=0.0),
                                 pooling="enc_mean", embedding_dim=PROJECT_MODELS.get(size, 768), max_length=length)
      params = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=replicated),
                            nn.unbox(abstract_params(config)))
      tokens = jax.ShapeDtypeStruct((B, length), np.int32, sharding=partitioning.batch_sharding(mesh))
      start = time.perf_counter()
      encode_fn = index_lib._encode_fn(config, mesh)  # pylint: disable=protected-access  (the tower `st5 index` runs)
      with jax.set_mesh(mesh):
        compiled = encode_fn.lower(params, tokens).compile()
      cost = compiled.cost_analysis()
      cost = cost[0] if isinstance(cost, list) else cost  # per chip: the SPMD-partitioned program
      chip_flops, chip_bytes = float(cost["flops"]), float(cost["bytes accessed"])
      analytic = B * flops.encoder_forward_flops(config, length) / len(devices)
      compute_s, memory_s = chip_flops / peak, chip_bytes / (args.hbm_gbps * 1e9)
      seconds = max(compute_s, memory_s)  # the roofline: a lower bound on the time of one batch
      libtpu = cost.get("optimal_seconds")  # libtpu's own estimate; negative (meaningless) for T5 Base in 0.0.42
      libtpu = libtpu if libtpu is not None and libtpu > 0 else None
      rate = B / seconds
      row = {"model": size, "length": length, "batch": B, "compile_s": time.perf_counter() - start,
             "xla_flops_per_chip": chip_flops, "xla_bytes_per_chip": chip_bytes, "analytic_flops_per_chip": analytic,
             "xla_over_analytic": chip_flops / analytic, "compute_s": compute_s, "memory_s": memory_s,
             "bound": "compute" if compute_s >= memory_s else "memory", "roofline_batch_s": seconds,
             "libtpu_optimal_s": libtpu, "passages_per_s": rate,
             "hours": {c: n / rate / 3600 for c, n in CORPORA.items()}}
      rows.append(row)
      print(f"  {size:<8} L={length:<4} XLA {chip_flops:.3e} FLOPs/chip (analytic {analytic:.3e}, x"
            f"{row['xla_over_analytic']:.3f}), {chip_bytes / 2**30:.2f} GiB accessed/chip -> {row['bound']}-bound "
            f"{seconds * 1e3:.2f} ms/batch (libtpu's own estimate {f'{libtpu * 1e3:.2f} ms' if libtpu else 'n/a'}), "
            f"{rate:,.0f} passages/s: " + ", ".join(f"{c} {h:.3g} h" for c, h in row["hours"].items()), flush=True)
  cpu = []
  if encode:  # (b): the measured `st5 index` rate, as measured and scaled by analytic FLOPs to passage lengths
    demo = configs.ST5Config.from_dict(encode["config"])
    measured = encode["st5_index_rate"]
    per_sentence = flops.encoder_forward_flops(demo, round(encode["mean_tokens"]))
    print(f"# project from this CPU: `st5 index` at {measured:.1f} sentences/s ({encode['mean_tokens']:.1f} tokens on "
          "average), scaled by analytic FLOPs per passage (no padding) at the demo's FLOP/s (Base's larger matmuls "
          "run nearer the CPU's peak: its hours are an upper bound)", flush=True)
    base = configs.ST5Config(t5=configs.t5_size("t5_base"), pooling="enc_mean", embedding_dim=768)
    lengths = [int(x) for x in args.lengths.split(",")]
    targets = [("demo", demo, None)] + [("demo", demo, x) for x in lengths] + [("t5_base", base, x) for x in lengths]
    for label, config, length in targets:
      rate = measured if length is None else measured * per_sentence / flops.encoder_forward_flops(config, length)
      hours = {c: n / rate / 3600 for c, n in CORPORA.items()}
      cpu.append({"model": label, "length": length, "passages_per_s": rate, "hours": hours})
      print(f"  {label:<8} L={length or 'as measured'!s:<11} {rate:9.1f} passages/s: "
            + ", ".join(f"{c} {h:,.0f} h" for c, h in hours.items()), flush=True)
  return {"topology": args.topology, "peak_bf16_flops_per_chip": peak, "hbm_bytes_per_s_per_chip": args.hbm_gbps * 1e9,
          "source": "https://cloud.google.com/tpu/docs/v4", "label": "estimate", "tpu": rows, "cpu": cpu}


# ------------------------------------------------------------------------------------------------ main


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--part", default="all", help="Comma-separated: encode, index, project (default all).")
  p.add_argument("--quick", action="store_true", help="Tiny sizes: a smoke run.")
  p.add_argument("--model", default=str(REPO / "workdirs" / "st5_tiny_cpu"), help="Model for `encode` (a work dir).")
  p.add_argument("--max_length", type=int, default=128, help="Token limit, both encoders (EOS included).")
  p.add_argument("--batch_size", type=int, default=64, help="Sentences a batch, both encoders.")
  p.add_argument("--limit", type=int, default=None, help="Encode the first N sentences of each corpus (0: all).")
  p.add_argument("--repeats", type=int, default=None, help="Timed encode passes after the warm-up (best reported).")
  p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="torch.set_num_threads.")
  p.add_argument("--sizes", default=None, help="Random-vector corpus sizes, comma-separated (10^6 is the slow one).")
  p.add_argument("--clustered", type=int, default=None, help="Size of the clustered corpus (0: none).")
  p.add_argument("--clusters", type=int, default=None, help="Gaussian clusters of the clustered corpus.")
  p.add_argument("--dim", type=int, default=256)
  p.add_argument("--queries", type=int, default=None)
  p.add_argument("--k", type=int, default=100)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--hnsw_max", type=int, default=None, help="HNSW only for corpora up to this size.")
  p.add_argument("--hnsw_timeout", type=int, default=300, help="Seconds an HNSW step may take before it is stopped.")
  p.add_argument("--step_timeout", type=int, default=7200, help="Seconds any other index step may take.")
  p.add_argument("--topology", default="v4:2x2x1", help="TPU topology of the projection (v4-8).")
  p.add_argument("--hbm_gbps", type=float, default=V4_HBM_BYTES_PER_S / 1e9, help="HBM bandwidth a chip, GB/s.")
  p.add_argument("--models", default=None, help="T5 sizes projected (default t5_base,t5_mini).")
  p.add_argument("--lengths", default=None, help="Passage lengths projected (default 128,256).")
  p.add_argument("--project_batch", type=int, default=None, help="Global batch of the projected encode step.")
  p.add_argument("--json", default=None, help="Also write every figure as JSON here.")
  p.add_argument("--_child", default=None, help=argparse.SUPPRESS)
  args = p.parse_args(argv)
  if args._child:  # pylint: disable=protected-access
    spec = json.loads(args._child)  # pylint: disable=protected-access
    pathlib.Path(spec["result"]).write_text(json.dumps(child(spec)))
    return 0
  for key, value in (QUICK if args.quick else FULL).items():
    if getattr(args, key) is None:
      setattr(args, key, value)
  parts = {"encode", "index", "project"} if args.part == "all" else set(args.part.split(","))
  if parts - {"encode", "index", "project"}:
    p.error(f"unknown --part {sorted(parts - {'encode', 'index', 'project'})}; known: encode, index, project, all")
  if "encode" in parts and not pathlib.Path(args.model).is_dir():
    p.error(f"--model {args.model} does not exist: train the demo (`st5 train --gin_file st5_tiny_cpu.gin --workdir "
            "workdirs/st5_tiny_cpu`) or pass another work dir")

  import warnings

  import torch
  import transformers
  torch.set_num_threads(args.threads)
  transformers.utils.logging.disable_progress_bar()
  warnings.filterwarnings("ignore", category=DeprecationWarning)
  env = environment()
  print(f"# {env['date']}  jax {env['jax']}, torch {env['torch']} ({env['torch_threads']} threads), "
        f"sentence-transformers {env['sentence_transformers']}, faiss {env['faiss']}, Python {env['python']}",
        flush=True)
  print(f"# CPU {env['cpu']}: {env['cpu_count']} cores ({env['cores_usable']} usable), load average "
        f"{env['load_average'][0]:.2f} {env['load_average'][1]:.2f} {env['load_average'][2]:.2f}", flush=True)
  figures = {"environment": env, "args": {k: v for k, v in vars(args).items() if k != "_child"}}
  work = pathlib.Path(tempfile.mkdtemp(prefix="st5_retrieval_bench_"))
  try:
    if "encode" in parts:
      figures["encode"] = encode_part(args, work)
    if "index" in parts:
      figures["index"] = index_part(args, work)
    if "project" in parts:
      figures["project"] = project_part(args, figures.get("encode"))
  finally:
    shutil.rmtree(work, ignore_errors=True)
  figures["load_average_after"] = os.getloadavg()
  print(f"# load average after: {figures['load_average_after'][0]:.2f}")
  if args.json:
    pathlib.Path(args.json).write_text(json.dumps(figures, indent=2))
  return 0


if __name__ == "__main__":
  sys.exit(main())
