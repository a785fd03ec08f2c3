"""`st5 index --model M --corpus FILES|TASK --out DIR`: encode a corpus into a sharded, resumable index.

TASK: a retrieval evaluation set by name (`st5 eval --tasks retrieval` lists them: WikiQA, ReQA-SQuAD, ...,
or `beir:FOLDER`); its corpus is written to DIR/task_corpus.jsonl (the same bytes every time) and indexed.

Every process of a multi-host run runs the same command (launch/tpu_run.sh); shard s is encoded by process
s % P on its own devices. Rerun the same command after a kill or preemption: finished shards are kept.
See st5_jax/retrieval/index.py for the folder's layout and st5_jax/retrieval/corpus_files.py for the formats.
"""

from __future__ import annotations

import argparse
import sys

from st5_jax.configs import POOLINGS

# st5_jax.retrieval.ann.CHOICES, not imported: `st5 --help` stays light (tests/test_retrieval_search.py checks).
_ANN_CHOICES = ("auto", "none", "ivf", "hnsw", "flat")


def register(sub: argparse._SubParsersAction) -> None:
  p = sub.add_parser("index", help="Encode a corpus (BEIR corpus.jsonl, JSON lines, TSV or text) into an index "
                     "folder: embedding shards, ids, a manifest, optionally a faiss ANN index.")
  p.add_argument("--model", required=True, help="Work dir, model folder, HF/sentence-transformers folder or T5X "
                 "checkpoint (any format `st5 encode` loads but a SavedModel).")
  p.add_argument("--corpus", required=True, action="append",
                 help="Corpus file(s), local or gs://: repeat the flag or separate with commas; globs expand; a "
                      "BEIR folder means its corpus.jsonl. Formats: .jsonl (BEIR _id/title/text, or id/text), "
                      ".tsv (id<TAB>text), .txt (a document a line, id = line number from 0); .gz read too. Or a "
                      "retrieval evaluation set's name (WikiQA, ReQA-SQuAD, beir:FOLDER, ...): its corpus.")
  p.add_argument("--data_dir", default=None, help="Public data folder for a TASK corpus (default $ST5_DATA_DIR).")
  p.add_argument("--out", required=True, help="Index folder (local or gs://); rerunning into it resumes.")
  p.add_argument("--shard_size", type=int, default=65536, help="Documents a shard (default 65536).")
  p.add_argument("--batch_size", type=int, default=64, help="Documents a device encodes per step (default 64).")
  p.add_argument("--max_length", type=int, default=None, help="Document token limit (EOS included); default: "
                 "the model's.")
  p.add_argument("--pooling", choices=list(POOLINGS), default=None, help="Override the model's pooling.")
  p.add_argument("--vocab", default=None, help="SentencePiece model (default: model folder, $ST5_VOCAB, "
                 "$ST5_DATA_DIR).")
  p.add_argument("--checkpoint", choices=["auto", "latest", "best"], default="auto",
                 help="of a work dir: its latest step, its best (WORKDIR/best), or auto (best when there is one)")
  p.add_argument("--format", choices=["jsonl", "tsv", "text"], default=None,
                 help="Corpus format for every file (default: by extension, else by the first line).")
  p.add_argument("--param_sharding", choices=["auto", "replicated", "fsdp"], default="auto",
                 help="Parameters over a process's devices: replicated (batch split, no per-layer communication), "
                      "fsdp (split, for models too big for one device), auto (fsdp when the float32 parameters "
                      "exceed a quarter of a device's memory).")
  p.add_argument("--ann", choices=_ANN_CHOICES, default="auto",
                 help="ANN index built at the end (faiss, inner product): ivf, hnsw, flat, none; auto: none below "
                      "100,000 documents, else ivf.")
  p.add_argument("--nlist", type=int, default=None, help="IVF lists (default: the power of two nearest 4*sqrt(N)).")
  p.add_argument("--nprobe", type=int, default=None, help="IVF lists searched by default (default: nlist/16, >= 8).")
  p.add_argument("--hnsw_m", type=int, default=None, help="HNSW links a node (default 32).")
  p.add_argument("--ef_construction", type=int, default=None, help="HNSW build breadth (default 200).")
  p.add_argument("--ef_search", type=int, default=None, help="HNSW search breadth (default 128, never below k).")
  p.set_defaults(run=run)


def ann_overrides(args: argparse.Namespace) -> dict:
  """The ANN parameters given on the command line (faiss's names), for st5_jax.retrieval.ann.resolve."""
  return {"nlist": args.nlist, "nprobe": args.nprobe, "M": args.hnsw_m, "efConstruction": args.ef_construction,
          "efSearch": args.ef_search}


def task_files(specs: list[str], out: str, *, data_dir: str | None, part: str) -> list[str]:
  """`specs`, with each retrieval evaluation set named among them replaced by a JSON-lines file of its `part`
  ("corpus" or "queries") written under `out` (the lead writes; every process reads it after a barrier)."""
  import json  # pylint: disable=g-import-not-at-top

  from st5_jax import multihost, paths  # pylint: disable=g-import-not-at-top
  from st5_jax.evaluation import sets  # pylint: disable=g-import-not-at-top

  files = []
  for spec in (s.strip() for entry in specs for s in entry.split(",") if s.strip()):
    if paths.exists(spec) or any(c in spec for c in "*?[") or not is_task(spec):
      files.append(spec)
      continue
    data = sets.get_set(sets.resolve_tasks(spec)[0]).read(paths.data_dir(data_dir))[1]
    target = paths.join(out, f"task_{part}.jsonl")
    if multihost.is_lead():
      texts = data.corpus if part == "corpus" else data.queries
      paths.write_text(target, "".join(json.dumps({"_id": i, "text": t}) + "\n" for i, t in texts.items()))
    multihost.barrier(f"st5_task_{part}")
    files.append(target)
  return files


def is_task(spec: str) -> bool:
  """A retrieval evaluation set's name (or beir:FOLDER), not a file."""
  from st5_jax.evaluation import sets  # pylint: disable=g-import-not-at-top

  try:
    names = sets.resolve_tasks(spec)
  except ValueError:
    return False
  return len(names) == 1 and sets.get_set(names[0]).kind == "retrieval"


def run(args: argparse.Namespace) -> int:
  # JAX and faiss here, not at the top: `st5 --help` imports this module.
  import logging  # pylint: disable=g-import-not-at-top

  from st5_jax import multihost  # pylint: disable=g-import-not-at-top
  from st5_jax.retrieval import index as index_lib  # pylint: disable=g-import-not-at-top

  logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
  for noisy in ("absl", "jax._src.xla_bridge", "orbax"):
    logging.getLogger(noisy).setLevel(logging.WARNING)
  multihost.maybe_initialize()
  corpus = task_files(args.corpus, args.out, data_dir=args.data_dir, part="corpus")
  report = index_lib.build_index(
      args.model, corpus, args.out, shard_size=args.shard_size, batch_size=args.batch_size,
      max_length=args.max_length, pooling=args.pooling, vocab=args.vocab, checkpoint=args.checkpoint,
      param_sharding=args.param_sharding, ann=args.ann, ann_params=ann_overrides(args), corpus_format=args.format,
      progress=lambda line: print(line, file=sys.stderr, flush=True))
  rate = report.encoded_documents / max(report.encode_seconds, 1e-9)
  where = f"process {report.process} of {report.processes}: " if report.processes > 1 else ""
  print(f"st5 index: {where}encoded {len(report.encoded)} shards ({report.encoded_documents} documents, "
        f"{rate:.0f}/s{', ' + report.layout if report.layout else ''}), skipped {len(report.skipped)} finished "
        f"shards; {report.documents} documents in {report.shards} shards -> {args.out}"
        + (f" (ann: {report.ann['kind']})" if report.ann else ""), file=sys.stderr, flush=True)
  return 0
