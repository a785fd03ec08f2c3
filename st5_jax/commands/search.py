"""`st5 search --index DIR --queries FILE --k 100 --out RUN`: the top k documents of each query, as a TREC run.

Queries are encoded with the index's own model (the folder it was built from; `--model` overrides it) and
searched exactly on the devices (blocked matmul + top-k; `--approx`: TPU's approximate top-k) or with the
index's ANN index (`--ann`). Writes `qid Q0 docid rank score tag` lines, and JSON lines with --jsonl.
`--precision binary|ubinary|int8|uint8` searches the index's quantized copy (`st5 index --precision`) exactly on
the host, the top k * `--rescore_multiplier` (default 4; 0: none) rescored with the float queries.
A model with prompts encodes the queries with `encode_query`'s prompt.
`--queries TASK` (a retrieval evaluation set, as `st5 index --corpus TASK`) takes the set's queries and
prints its measures against the set's qrels (`--metrics FILE` also writes them as JSON); the index must hold
exactly the set's corpus (else exit 2, naming the command that builds it), so the measures are `st5 eval`'s.
"""

from __future__ import annotations

import argparse
import sys
import time

from st5_jax.configs import POOLINGS


def register(sub: argparse._SubParsersAction) -> None:
  p = sub.add_parser("search", help="Search an `st5 index` folder with queries; write a TREC run file.")
  p.add_argument("--index", required=True, help="Index folder written by `st5 index` (local or gs://).")
  p.add_argument("--queries", required=True, action="append",
                 help="Query file(s): BEIR queries.jsonl (or a BEIR folder), JSON lines id/text, TSV id<TAB>text, "
                      "or text (a query a line, id = line number from 0); repeat or comma-separate. Or a retrieval "
                      "evaluation set's name (WikiQA, beir:FOLDER, ...): its queries, scored against its qrels.")
  p.add_argument("--data_dir", default=None, help="Public data folder for a TASK (default $ST5_DATA_DIR).")
  p.add_argument("--metrics", default=None, help="With --queries TASK: also write the measures as JSON here.")
  p.add_argument("--k", type=int, default=100, help="Documents per query (default 100).")
  p.add_argument("--out", required=True, help="TREC run file to write (local or gs://).")
  p.add_argument("--jsonl", default=None, help="Also write the run as JSON lines here.")
  p.add_argument("--tag", default="st5", help="The run tag, last column of the TREC file (default st5).")
  p.add_argument("--model", default=None, help="Encode the queries with this model instead of the index's.")
  p.add_argument("--query_max_length", type=int, default=None,
                 help="Query token limit (EOS included); default: the model's own max_length.")
  p.add_argument("--pooling", choices=list(POOLINGS), default=None, help="Override the query model's pooling.")
  p.add_argument("--vocab", default=None, help="SentencePiece model (default: model folder, $ST5_VOCAB).")
  p.add_argument("--checkpoint", choices=["auto", "latest", "best"], default="auto",
                 help="of a --model work dir: latest, best or auto (best when there is one)")
  p.add_argument("--format", choices=["jsonl", "tsv", "text"], default=None,
                 help="Query file format (default: by extension, else by the first line).")
  p.add_argument("--batch_size", type=int, default=64, help="Queries a device encodes per step.")
  how = p.add_mutually_exclusive_group()
  how.add_argument("--approx", action="store_true",
                   help="jax.lax.approx_max_k for each block's top-k (TPU's approximate top-k; exact on CPU/GPU).")
  how.add_argument("--ann", action="store_true", help="Search the index's ANN index (built by `st5 index --ann`).")
  p.add_argument("--nprobe", type=int, default=None, help="--ann on an IVF index: lists to scan (default: "
                 "the index's).")
  p.add_argument("--ef_search", type=int, default=None, help="--ann on an HNSW index: search breadth.")
  p.add_argument("--block_size", type=int, default=65536, help="Documents scored at once per exact-search step.")
  p.add_argument("--precision", choices=["float32", "int8", "uint8", "binary", "ubinary"], default="float32",
                 help="Search the index's quantized copy of this precision (built by `st5 index --precision`): "
                      "Hamming distance for binary / ubinary, the codes' dot product for int8 / uint8.")
  p.add_argument("--rescore_multiplier", type=int, default=None,
                 help="With --precision: rescore the top k * N by the float queries against the candidates' bits "
                      "or dequantized values (default 4; 0: keep the quantized scores).")
  p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
  # JAX and faiss here, not at the top: `st5 --help` imports this module.
  from st5_jax.cli import UsageError  # pylint: disable=g-import-not-at-top
  from st5_jax.retrieval import corpus_files, metrics, runs  # pylint: disable=g-import-not-at-top
  from st5_jax.retrieval import index as index_lib  # pylint: disable=g-import-not-at-top
  from st5_jax.retrieval import search as search_lib  # pylint: disable=g-import-not-at-top

  if args.k < 1:
    raise UsageError(f"--k must be >= 1, got {args.k}")
  if not args.ann and (args.nprobe is not None or args.ef_search is not None):
    raise UsageError("--nprobe / --ef_search set the ANN index's search; add --ann")
  if args.precision != "float32" and (args.ann or args.approx):
    raise UsageError(f"--precision {args.precision} searches the quantized codes exactly; drop --ann / --approx")
  if args.rescore_multiplier is not None and args.precision == "float32":
    raise UsageError("--rescore_multiplier rescores a search over quantized codes; add --precision")
  from st5_jax.commands.index import is_task  # pylint: disable=g-import-not-at-top

  index = index_lib.Index.open(args.index)
  if args.precision != "float32":
    index.load_quantized(args.precision)  # before encoding: an index without that copy is refused at once
  task = args.queries[0] if len(args.queries) == 1 and is_task(args.queries[0]) else None
  if task is not None:
    from st5_jax import paths  # pylint: disable=g-import-not-at-top
    from st5_jax.evaluation import sets  # pylint: disable=g-import-not-at-top
    name = sets.resolve_tasks(task)[0]
    data = sets.get_set(name).read(paths.data_dir(args.data_dir))[1]
    _check_task_corpus(index, name, data.corpus, args.data_dir)
    query_ids, texts = list(data.queries), list(data.queries.values())
  else:
    if args.metrics:
      raise UsageError("--metrics needs --queries TASK (a retrieval set with qrels)")
    query_ids, texts = corpus_files.read_all(corpus_files.expand(args.queries), fmt=args.format)
  if not query_ids:
    raise UsageError(f"no queries in {', '.join(args.queries)} (every line is blank)")
  model = search_lib.query_model(index, model=args.model, max_length=args.query_max_length, vocab=args.vocab,
                                 checkpoint=args.checkpoint, pooling=args.pooling)
  start = time.perf_counter()
  queries_QxD = index_lib.MeshEncoder(model, batch_size=args.batch_size).encode(
      texts, prompt=index_lib.side_prompt(model, "query"), side="query")
  encoded = time.perf_counter()
  method = "ann" if args.ann else "approx" if args.approx else "exact"
  scores, indices = search_lib.search_index(index, queries_QxD, args.k, method=method,
                                            ann_params={"nprobe": args.nprobe, "efSearch": args.ef_search},
                                            block_size=args.block_size, precision=args.precision,
                                            rescore_multiplier=args.rescore_multiplier)
  searched = time.perf_counter()
  run_dict = metrics.run_from_topk(query_ids, index.ids, scores, indices)
  runs.write_trec(args.out, run_dict, tag=args.tag)
  if args.jsonl:
    runs.write_jsonl(args.jsonl, run_dict)
  measures = ""
  if task is not None:
    import json  # pylint: disable=g-import-not-at-top
    scored = metrics.evaluate(run_dict, data.qrels)
    measures = "; " + ", ".join(f"{m} {scored['mean'][m]:.4f}" for m in ("MRR@10", "nDCG@10", "Recall@100"))
    if args.metrics:
      from st5_jax import paths  # pylint: disable=g-import-not-at-top
      paths.write_text(args.metrics, json.dumps({"task": task, **scored["mean"], "n_queries": scored["n_queries"]},
                                                indent=1) + "\n")
  how = f"{method}" + (f" {index.ann_info['kind']}" if method == "ann" else "")
  if args.precision != "float32":
    multiplier = 4 if args.rescore_multiplier is None else args.rescore_multiplier
    how += f" {args.precision}" + (f", rescored top {multiplier}k" if multiplier else ", not rescored")
  print(f"st5 search: {len(query_ids)} queries x {len(index)} documents, top {min(args.k, len(index))} ({how}): "
        f"encoded in {encoded - start:.1f}s, searched in {searched - encoded:.2f}s "
        f"({len(query_ids) / max(searched - encoded, 1e-9):.0f} queries/s) -> {args.out}"
        + (f", {args.jsonl}" if args.jsonl else "") + measures, file=sys.stderr)
  return 0


def _check_task_corpus(index, name: str, corpus: dict[str, str], data_dir: str | None) -> None:
  """UsageError unless `index` holds exactly set `name`'s corpus: qrels scored against another corpus (or a bigger
  one) give measures that are not `st5 eval`'s, silently.

  Fast path: the manifest's corpus fingerprint is that of the file `st5 index --corpus TASK` writes. Otherwise
  (a BEIR folder indexed by its path, the corpus exported to TSV): the index's corpus files, unchanged since they
  were indexed (same fingerprint), must hold the same ids and texts.
  """
  from st5_jax import paths  # pylint: disable=g-import-not-at-top
  from st5_jax.cli import UsageError  # pylint: disable=g-import-not-at-top
  from st5_jax.commands import index as index_command  # pylint: disable=g-import-not-at-top
  from st5_jax.retrieval import corpus_files  # pylint: disable=g-import-not-at-top

  held = index.manifest["corpus"]
  if held["fingerprint"] == index_command.corpus_fingerprint(index_command.task_corpus_bytes(corpus)):
    return
  files = [f["path"] for f in held["files"]]
  if len(index) == len(corpus) and files and all(paths.exists(f) for f in files):
    formats = {f["format"] for f in held["files"]}
    fmt = formats.pop() if len(formats) == 1 else None
    if corpus_files.scan(files, fmt=fmt).fingerprint == held["fingerprint"]:
      ids, texts = corpus_files.read_all(files, fmt=fmt)
      if all(corpus.get(i) == t for i, t in zip(ids, texts)):  # same count, unique ids: the same mapping
        return
  model = (index.manifest.get("model") or {}).get("path") or "MODEL"
  out = f"{index.directory.rstrip('/')}_{index_command.safe_name(name)}"
  build = f"st5 index --model {model} --corpus {name} --out {out}" + (f" --data_dir {data_dir}" if data_dir else "")
  raise UsageError(f"{index.directory} holds another corpus than {name}'s ({', '.join(files) or '(embeddings)'}: "
                   f"{len(index)} documents; {name}'s has {len(corpus)}), so its measures would not be `st5 eval`'s; "
                   f"build {name}'s index with `{build}` and search that")
