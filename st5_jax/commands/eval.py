"""`st5 eval --model PATH[,PATH...] --tasks sts,transfer,sentglue,geometry --output results.json`.

Writes results.json, results.md (side-by-side table) and results_tasks.png /
results_align_uniform.png / results_retrieval.png. `--compare old.json` adds models from
earlier results files to the table and plots without re-running them. `--tasks retrieval`
(or a retrieval task's name, or `--beir FOLDER`) ranks each set's corpus for its queries;
`--baseline bm25` adds BM25's row on the same sets.
"""

from __future__ import annotations

import argparse
import logging
import pathlib
import sys

from st5_jax import paths
from st5_jax.configs import POOLINGS


DEFAULT_TASKS = "sts,transfer,sentglue,geometry"  # when neither --tasks nor --mteb is given


def register(sub: argparse._SubParsersAction) -> None:
  p = sub.add_parser("eval", help="Evaluate encoders on STS, SentEval transfer, SentGLUE, geometry and retrieval.")
  p.add_argument("--model", default="", help="Model path(s), comma-separated: any format `st5 encode` loads.")
  p.add_argument("--name", default="", help="Display names for --model, comma-separated (default: folder names).")
  p.add_argument("--tasks", default=None,
                 help="Comma-separated tasks or suites: sts, transfer, sentglue, geometry, retrieval, all, dev, or "
                 "task names (default: sts,transfer,sentglue,geometry; none when only --mteb or --beir is given).")
  p.add_argument("--beir", action="append", default=[],
                 help="A BEIR-format folder (corpus.jsonl, queries.jsonl, qrels/SPLIT.tsv), local or gs://, as a "
                      "retrieval task; FOLDER:SPLIT picks another qrels split than test (repeatable).")
  p.add_argument("--baseline", choices=["bm25"], action="append", default=[],
                 help="Also score the retrieval tasks with this baseline (a row of its own; BM25: "
                      "st5_jax/retrieval/bm25.py, k1 1.5, b 0.75).")
  p.add_argument("--query_max_length", type=int, default=None,
                 help="Token limit of retrieval queries (default: the model's max length).")
  p.add_argument("--document_max_length", type=int, default=None,
                 help="Token limit of retrieval documents (default: the model's max length).")
  p.add_argument("--prompt", action="append", default=[], metavar="TASK=NAME",
                 help="The model's prompt (st5_model.prompts) a task or suite encodes with, or 'none': e.g. "
                      "sts=query, STSBenchmark=none, retrieval.query=q, TREC-QA.document=passage (repeatable; a "
                      "task's rule beats its suite's, a suite's beats all's). Default: the model's default prompt, "
                      "and the query / document prompts for retrieval's two sides (docs/evaluation.md).")
  p.add_argument("--mteb", default="",
                 help="Comma-separated MTEB task names (needs the `mteb` extra). STSBenchmark, SICK-R and "
                 "STS12-16 run offline from --data_dir; others are fetched by mteb (or read from the HF "
                 "datasets cache). Results go under \"mteb\" in the results JSON.")
  p.add_argument("--mteb_output", default=None, help="Also keep mteb's own per-task result files here.")
  p.add_argument("--data_dir", default=None,
                 help="Public data folder, as `st5 data prepare --out DIR` writes it (default $ST5_DATA_DIR).")
  p.add_argument("--output", required=True, help="Results JSON; the .md and .png files are written beside it.")
  p.add_argument("--compare", default="", help="Earlier results JSON files to show alongside, comma-separated.")
  p.add_argument("--batch_size", type=int, default=64)
  p.add_argument("--max_length", type=int, default=None, help="Token limit (EOS included); default: the model's.")
  p.add_argument("--pooling", choices=list(POOLINGS), default=None,
                 help="Override the pooling of every --model (enc_first / enc_mean on a layer_attention "
                 "model removes its attention head).")
  p.add_argument("--vocab", default=None,
                 help="SentencePiece model (default: model folder, $ST5_VOCAB, $ST5_DATA_DIR).")
  p.add_argument("--kfold", type=int, default=10, help="Folds of SentEval's cross-validations (SentEval: 10).")
  p.add_argument("--checkpoint", choices=["auto", "latest", "best"], default=None,
                 help="of a work dir: its latest step, its best evaluated parameters (WORKDIR/best, kept by "
                      "early stopping), or auto (default): best when there is one, else latest")
  p.set_defaults(run=run)


def _split(value: str) -> list[str]:
  return [v.strip() for v in value.split(",") if v.strip()]


def _display_names(paths: list[str], names: list[str]) -> list[str]:
  if names and len(names) != len(paths):
    raise SystemExit(f"--name has {len(names)} entries for {len(paths)} models")
  out = []
  for i, p in enumerate(paths):
    name = names[i] if names else (pathlib.Path(p.rstrip("/")).name or p)
    base, n = name, 2
    while name in out:
      name, n = f"{base}#{n}", n + 1
    out.append(name)
  return out


def _load_kwargs(args: argparse.Namespace) -> dict:
  return {k: getattr(args, k) for k in ("pooling", "vocab", "max_length", "checkpoint")
          if getattr(args, k, None) is not None}


def load_sentence_encoder(path: str, args: argparse.Namespace):
  """The SentenceEncoder of a model path (imported only here: `st5 eval --help` stays fast)."""
  from st5_jax.encoder import SentenceEncoder  # pylint: disable=g-import-not-at-top  (JAX)

  return SentenceEncoder.load(path, **_load_kwargs(args))


def side_encoders(enc, args: argparse.Namespace) -> dict:
  """`evaluate`'s encode_query / encode_document for --query_max_length / --document_max_length, and for a
  model with prompts (its `encode_query` / `encode_document`: the query and document prompts)."""
  out = {}
  # A model with prompts or asymmetric towers encodes each retrieval side with its own encode_query / _document.
  prompted = bool(getattr(enc, "prompts", None)) or getattr(getattr(enc, "config", None), "asymmetric", False)
  for side, limit in (("query", args.query_max_length), ("document", args.document_max_length)):
    if limit is None and not prompted:
      continue
    sided = enc
    if limit is not None:
      if not hasattr(enc, "with_max_length"):
        raise SystemExit(f"--{side}_max_length: the max length of {enc.source} is fixed (a SavedModel); re-export "
                         "it with `st5 export --max_length`")
      sided = enc.with_max_length(limit)
    encode_side = getattr(sided, f"encode_{side}", sided.encode)  # an encoder without sides: its plain encode
    out[f"encode_{side}"] = lambda texts, e=encode_side: e(texts, batch_size=args.batch_size)
  return out


def prompted_encoder(enc, args: argparse.Namespace):
  """(prompt text, side) -> encode for `evaluate`'s task_prompts: `enc.encode(prompt=text)`, with the side's
  --query_max_length / --document_max_length on a retrieval side."""

  def make(text: str, side: str):
    limit = {"query": args.query_max_length, "document": args.document_max_length}.get(side)
    sided = enc.with_max_length(limit) if limit is not None and hasattr(enc, "with_max_length") else enc
    if side in ("query", "document") and getattr(getattr(enc, "config", None), "asymmetric", False):
      return lambda texts: sided.encode(texts, batch_size=args.batch_size, prompt=text, task=side)  # its tower
    return lambda texts: sided.encode(texts, batch_size=args.batch_size, prompt=text)

  return make


def load_encoder(path: str, args: argparse.Namespace):
  """`encode(list[str]) -> [N, D]` for a model path."""
  enc = load_sentence_encoder(path, args)
  return lambda texts: enc.encode(texts, batch_size=args.batch_size)


def _run_mteb(enc, path: str, args: argparse.Namespace, names: list[str], data_dir) -> dict:
  from st5_jax import mteb as st5_mteb  # pylint: disable=g-import-not-at-top  (the optional mteb extra)

  model = st5_mteb.wrap(enc, path=path, load_kwargs=_load_kwargs(args), batch_size=args.batch_size)
  return st5_mteb.evaluate(model, names, data_dir=data_dir, batch_size=args.batch_size,
                           output_folder=args.mteb_output)


def run(args: argparse.Namespace) -> int:
  # Not at the top: the harness imports scikit-learn, and `st5 --help` imports this module.
  from st5_jax.evaluation import evaluate, report, resolve_tasks  # pylint: disable=g-import-not-at-top
  from st5_jax.evaluation.harness import evaluate_bm25  # pylint: disable=g-import-not-at-top
  from st5_jax.evaluation import prompts as eval_prompts  # pylint: disable=g-import-not-at-top
  from st5_jax.evaluation.sets import get_set  # pylint: disable=g-import-not-at-top

  logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
  model_paths = _split(args.model)
  compare = _split(args.compare)
  if not model_paths and not compare and not args.baseline:
    raise SystemExit("give --model, --baseline and/or --compare")
  mteb_names = _split(args.mteb)
  default = "retrieval" if args.baseline and not model_paths else DEFAULT_TASKS  # a baseline alone: its sets
  task_arg = args.tasks if args.tasks is not None else ("" if mteb_names or args.beir else default)
  task_arg = ",".join([task_arg, *(f"beir:{folder}" for folder in args.beir)]).strip(",")
  tasks = resolve_tasks(task_arg) if task_arg else []  # fails before any model loads on a typo.
  if args.baseline and not any(get_set(t).kind == "retrieval" for t in tasks):
    raise SystemExit(f"--baseline {args.baseline[0]} scores retrieval sets only, and --tasks {task_arg or '(none)'} "
                     "names none: add retrieval (or a retrieval set's name) to --tasks, or give --beir FOLDER")
  try:
    rules = eval_prompts.parse(args.prompt)
    for r in rules:  # keys and sides checked before any model loads (prompt names: per model, below)
      eval_prompts.plan([eval_prompts.Rule(r.key, r.side, eval_prompts.NONE)], tasks, {})
  except ValueError as e:
    raise SystemExit(str(e)) from e
  data_dir = paths.data_dir(args.data_dir) if model_paths or args.baseline else None
  if mteb_names and model_paths:
    from st5_jax import mteb as st5_mteb  # pylint: disable=g-import-not-at-top  (the optional mteb extra)
    st5_mteb.get_tasks(mteb_names, data_dir=data_dir)  # unknown names fail before any model loads

  models = {}
  for name, path in zip(_display_names(model_paths, _split(args.name)), model_paths):
    enc = load_sentence_encoder(path, args)  # once for both harnesses
    encode = lambda texts, enc=enc: enc.encode(texts, batch_size=args.batch_size)  # noqa: E731
    try:
      task_prompts = eval_prompts.plan(rules, tasks, dict(getattr(enc, "prompts", None) or {}))
    except ValueError as e:
      raise SystemExit(f"{name}: {e}") from e
    result = (evaluate(encode, tasks, data_dir, kfold=args.kfold, task_prompts=task_prompts,
                       prompted=prompted_encoder(enc, args), **side_encoders(enc, args)) if tasks
              else {"tasks": {}, "meta": {}})
    if mteb_names:
      result["mteb"] = _run_mteb(enc, path, args, mteb_names, data_dir)
    result["source"] = path
    models[name] = result
  for baseline in args.baseline:
    models[baseline.upper()] = {**evaluate_bm25(tasks, data_dir), "source": baseline}
  for path in compare:
    for name, result in report.load_results(path).items():
      models[name if name not in models else f"{name} ({path})"] = result

  written = report.write_all(models, args.output, extra={"command": " ".join(sys.argv)})
  print(report.markdown(models))
  for kind, path in written.items():
    print(f"wrote {kind}: {path}", file=sys.stderr)
  return 0
