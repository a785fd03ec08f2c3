"""`st5 eval --model PATH[,PATH...] --tasks sts,transfer,sentglue,geometry --output results.json`.

Writes results.json, results.md (side-by-side table) and results_tasks.png /
results_align_uniform.png. `--compare old.json` adds models from earlier results files
to the table and plots without re-running them.
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
  p = sub.add_parser("eval", help="Evaluate encoders on STS, SentEval transfer, SentGLUE and geometry.")
  p.add_argument("--model", default="", help="Model path(s), comma-separated: any format `st5 encode` loads.")
  p.add_argument("--name", default="", help="Display names for --model, comma-separated (default: folder names).")
  p.add_argument("--tasks", default=None,
                 help="Comma-separated tasks or suites: sts, transfer, sentglue, geometry, all, dev, or task names "
                 "(default: sts,transfer,sentglue,geometry; none when only --mteb is given).")
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

  logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
  model_paths = _split(args.model)
  compare = _split(args.compare)
  if not model_paths and not compare:
    raise SystemExit("give --model and/or --compare")
  mteb_names = _split(args.mteb)
  task_arg = args.tasks if args.tasks is not None else ("" if mteb_names else DEFAULT_TASKS)
  tasks = resolve_tasks(task_arg) if task_arg else []  # fails before any model loads on a typo.
  data_dir = paths.data_dir(args.data_dir) if model_paths else None
  if mteb_names and model_paths:
    from st5_jax import mteb as st5_mteb  # pylint: disable=g-import-not-at-top  (the optional mteb extra)
    st5_mteb.get_tasks(mteb_names, data_dir=data_dir)  # unknown names fail before any model loads

  models = {}
  for name, path in zip(_display_names(model_paths, _split(args.name)), model_paths):
    enc = load_sentence_encoder(path, args)  # once for both harnesses
    encode = lambda texts, enc=enc: enc.encode(texts, batch_size=args.batch_size)  # noqa: E731
    result = evaluate(encode, tasks, data_dir, kfold=args.kfold) if tasks else {"tasks": {}, "meta": {}}
    if mteb_names:
      result["mteb"] = _run_mteb(enc, path, args, mteb_names, data_dir)
    result["source"] = path
    models[name] = result
  for path in compare:
    for name, result in report.load_results(path).items():
      models[name if name not in models else f"{name} ({path})"] = result

  written = report.write_all(models, args.output, extra={"command": " ".join(sys.argv)})
  print(report.markdown(models))
  for kind, path in written.items():
    print(f"wrote {kind}: {path}", file=sys.stderr)
  return 0
