"""`st5 index --model M --corpus FILES|TASK --out DIR`: encode a corpus into a sharded, resumable index.

TASK: a retrieval evaluation set by name (`st5 eval --tasks retrieval` lists them: WikiQA, ReQA-SQuAD, ...,
or `beir:FOLDER`), alone: its corpus is written to DIR/task_NAME_corpus.jsonl (the same bytes every time) and
indexed, after checking that DIR holds no index of another corpus (nothing is written into such a DIR).

Every process of a multi-host run runs the same command (launch/tpu_run.sh); shard s is encoded by process
s % P on its own devices. Rerun the same command after a kill or preemption: finished shards are kept.
See st5_jax/retrieval/index.py for the folder's layout and st5_jax/retrieval/corpus_files.py for the formats.
"""

from __future__ import annotations

import argparse
import re
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
                      "retrieval evaluation set's name (WikiQA, ReQA-SQuAD, beir:FOLDER, ...), alone: its corpus.")
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
  p.add_argument("--precision", choices=["float32", "int8", "uint8", "binary", "ubinary"], default="float32",
                 help="Also write the corpus as quantized codes (quantized.npy) for `st5 search --precision`: int8 / "
                      "uint8 (ranges: each dimension's min and max over the corpus), binary / ubinary (packed sign "
                      "bits, 32x smaller than float32); float32 (default): none.")
  p.set_defaults(run=run)


def ann_overrides(args: argparse.Namespace) -> dict:
  """The ANN parameters given on the command line (faiss's names), for st5_jax.retrieval.ann.resolve."""
  return {"nlist": args.nlist, "nprobe": args.nprobe, "M": args.hnsw_m, "efConstruction": args.ef_construction,
          "efSearch": args.ef_search}


def task_files(specs: list[str], out: str, *, data_dir: str | None) -> list[str]:
  """`specs` (the --corpus values, comma-separated), or when they name a retrieval evaluation set: the JSON-lines
  file of its corpus under `out` (the lead writes it; every process reads it after a barrier).

  A set is indexed alone (no other set or file): its index is what `st5 search --queries TASK` scores against the
  set's qrels, and two sets' ids may collide (TREC-QA's and SemEval2016-B's are both d0, d1, ...). `out` holding
  an index of another corpus is refused before anything is written (IndexMismatchError).
  """
  from st5_jax import multihost, paths  # pylint: disable=g-import-not-at-top
  from st5_jax.cli import UsageError  # pylint: disable=g-import-not-at-top
  from st5_jax.evaluation import sets  # pylint: disable=g-import-not-at-top

  specs = [s.strip() for entry in specs for s in entry.split(",") if s.strip()]
  tasks = [s for s in specs if not paths.exists(s) and not any(c in s for c in "*?[") and is_task(s)]
  if not tasks:
    return specs
  if len(specs) > 1:
    raise UsageError(f"--corpus {','.join(specs)}: a retrieval set's corpus is indexed alone (no other set or file), "
                     f"so that `st5 search --queries TASK` scores it as `st5 eval` does; build one index per set: "
                     f"`st5 index --corpus {tasks[0]} --out DIR ...`")
  name = sets.resolve_tasks(tasks[0])[0]
  data = sets.get_set(name).read(paths.data_dir(data_dir))[1]
  content = task_corpus_bytes(data.corpus)
  _refuse_another_corpus(out, corpus_fingerprint(content), name)
  target = paths.join(out, task_corpus_name(name))
  # Unchanged bytes are not rewritten: a rerun (a resume) leaves the file and its mtime as they were.
  if multihost.is_lead() and not (paths.exists(target) and paths.read_bytes(target) == content):
    paths.write_bytes(target, content)
  multihost.barrier("st5_task_corpus")
  return [target]


def safe_name(name: str) -> str:
  """A set's name as part of a file name: runs of other characters than letters, digits, . and - become _
  (beir:/data/scifact -> beir_data_scifact), at most 100 characters."""
  return re.sub(r"[^A-Za-z0-9.-]+", "_", name).strip("._")[:100]


def task_corpus_name(name: str) -> str:
  """The file name of set `name`'s corpus in its index folder."""
  return f"task_{safe_name(name)}_corpus.jsonl"


def task_corpus_bytes(corpus: dict[str, str]) -> bytes:
  """What `st5 index --corpus TASK` indexes: a JSON line {"_id", "text"} per document, in the set's order."""
  import json  # pylint: disable=g-import-not-at-top

  return "".join(json.dumps({"_id": i, "text": t}) + "\n" for i, t in corpus.items()).encode()


def corpus_fingerprint(content: bytes) -> str:
  """An index manifest's corpus fingerprint for one JSON-lines file holding `content` (as corpus_files.scan's)."""
  import hashlib  # pylint: disable=g-import-not-at-top

  from st5_jax.retrieval import corpus_files  # pylint: disable=g-import-not-at-top

  info = corpus_files.FileInfo(path="", format="jsonl", rows=0, sha256=hashlib.sha256(content).hexdigest())
  return corpus_files.CorpusScan(files=(info,), layouts=()).fingerprint


def _refuse_another_corpus(out: str, fingerprint: str, name: str) -> None:
  """IndexMismatchError when `out` holds (part of) an index of a corpus other than `fingerprint`'s.

  build_index checks the model and shard size too, but only after the corpus file is written; this runs first so
  that a refused run leaves `out` as it was.
  """
  import json  # pylint: disable=g-import-not-at-top

  from st5_jax import paths  # pylint: disable=g-import-not-at-top
  from st5_jax.retrieval import index as index_lib  # pylint: disable=g-import-not-at-top

  for path in [paths.join(out, index_lib.MANIFEST)] + paths.glob(paths.join(out, "shard-*.json")):
    try:
      meta = json.loads(paths.read_text(path))
    except (OSError, ValueError):
      continue  # absent or unreadable: build_index's own check and resume deal with it
    if "corpus" in meta:  # the manifest
      found, files = meta["corpus"]["fingerprint"], [f["path"] for f in meta["corpus"]["files"]] or ["(embeddings)"]
    else:  # a shard's JSON
      found, files = meta.get("corpus_fingerprint"), meta.get("corpus_files") or []
    if found != fingerprint:
      raise index_lib.IndexMismatchError(
          f"{out} holds an index of another corpus ({path.rsplit('/', 1)[-1]}: {','.join(files)}, fingerprint "
          f"{str(found)[:12]}); this run: {name}'s corpus (fingerprint {fingerprint[:12]}). Pass another --out, or "
          f"delete {out} to rebuild it")


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
  corpus = task_files(args.corpus, args.out, data_dir=args.data_dir)
  report = index_lib.build_index(
      args.model, corpus, args.out, shard_size=args.shard_size, batch_size=args.batch_size,
      max_length=args.max_length, pooling=args.pooling, vocab=args.vocab, checkpoint=args.checkpoint,
      param_sharding=args.param_sharding, ann=args.ann, ann_params=ann_overrides(args), corpus_format=args.format,
      precision=args.precision, progress=lambda line: print(line, file=sys.stderr, flush=True))
  rate = report.encoded_documents / max(report.encode_seconds, 1e-9)
  where = f"process {report.process} of {report.processes}: " if report.processes > 1 else ""
  print(f"st5 index: {where}encoded {len(report.encoded)} shards ({report.encoded_documents} documents, "
        f"{rate:.0f}/s{', ' + report.layout if report.layout else ''}), skipped {len(report.skipped)} finished "
        f"shards; {report.documents} documents in {report.shards} shards -> {args.out}"
        + (f" (ann: {report.ann['kind']})" if report.ann else ""), file=sys.stderr, flush=True)
  return 0
