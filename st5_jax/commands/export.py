"""`st5 export --model PATH --format savedmodel|sentence-transformers --out DIR`."""

from __future__ import annotations

import argparse
import json
import logging
import os

from st5_jax.cli import UsageError
from st5_jax.configs import POOLINGS
from st5_jax.export import export_model


def register(sub: argparse._SubParsersAction) -> None:
  p = sub.add_parser("export", help="Export a model as a TF SavedModel (strings in, embeddings out) or a "
                                    "sentence-transformers folder, with a model card.")
  p.add_argument("--model", required=True, help="Work dir, model folder, HF/sentence-transformers folder, "
                 "T5X checkpoint or SavedModel (anything `st5 encode` loads).")
  p.add_argument("--format", required=True, choices=["savedmodel", "sentence-transformers"])
  p.add_argument("--out", required=True, help="Directory to create.")
  p.add_argument("--vocab", default=None, help="SentencePiece model (default: model folder, $ST5_VOCAB, "
                 "$ST5_DATA_DIR); copied into the export.")
  p.add_argument("--pooling", choices=list(POOLINGS), default=None,
                 help="Override the pooling (needed for raw T5 checkpoints that do not record one; "
                 "enc_first / enc_mean on a layer_attention model removes its attention head: this project's own "
                 "form, not LayerAttPooler's, which always runs it).")
  p.add_argument("--max_length", type=int, default=None,
                 help="Token limit (EOS included) baked into the export; default: the model's.")
  p.add_argument("--prompt", action="append", default=[], metavar="NAME=TEXT",
                 help="Add (or replace) a prompt of the export, e.g. --prompt 'query=query: ' (repeatable); the "
                      "model's own prompts (st5_model.prompts) are exported too.")
  p.add_argument("--default_prompt_name", default=None,
                 help="The prompt `encode` uses when given none (default: the model's, if any).")
  p.add_argument("--truncate_dim", type=int, default=None,
                 help="Export embeddings of the first D dimensions, renormalised when the model normalises "
                      "(sentence-transformers: its truncate_dim config; SavedModel: in the graph).")
  p.add_argument("--platforms", default="cpu,cuda,tpu",
                 help="SavedModel only: comma-separated lowering platforms of the forward pass.")
  p.add_argument("--eval_results", action="append", default=[],
                 help="`st5 eval` results JSON to quote in the model card (repeatable).")
  p.add_argument("--contamination_report", default=None, metavar="REPORT.json",
                 help="A `st5 data overlap --out` report: the model card's Contamination section, copied as "
                      "contamination.json; its contaminated MTEB tasks join training_data.json's "
                      "mteb_training_datasets (st5_jax.mteb's ModelMeta.training_datasets).")
  p.add_argument("--overwrite", action="store_true", help="Replace --out if it exists.")
  p.add_argument("--checkpoint", choices=["auto", "latest", "best"], default="auto",
                 help="of a work dir: its latest step, its best evaluated parameters (WORKDIR/best, kept by "
                      "early stopping), or auto (default): best when there is one, else latest")
  p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
  # Exporting only traces and lowers: never claim an accelerator someone else may be using.
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
  for noisy in ("absl", "orbax", "tensorflow"):
    logging.getLogger(noisy).setLevel(logging.WARNING)

  # Here, not at the top: it imports numpy and the checkpoint code, and `st5 --help` imports this module.
  from st5_jax.export.sentence_transformers import UnsupportedExportError  # pylint: disable=g-import-not-at-top

  platforms = tuple(p.strip() for p in args.platforms.split(",") if p.strip())
  prompts = {}
  for entry in args.prompt:
    name, sep, text = entry.partition("=")
    if not sep or not name:
      raise UsageError(f"--prompt {entry!r}: write NAME=TEXT, e.g. --prompt 'query=query: '")
    prompts[name] = text
  try:
    summary = export_model(args.model, format=args.format, out=args.out, vocab=args.vocab, pooling=args.pooling,
                           max_length=args.max_length, platforms=platforms, eval_results=args.eval_results,
                           overwrite=args.overwrite, checkpoint=args.checkpoint, prompts=prompts,
                           default_prompt_name=args.default_prompt_name, truncate_dim=args.truncate_dim,
                           contamination_report=args.contamination_report)
  except (UnsupportedExportError, FileExistsError) as e:
    raise UsageError(str(e)) from e
  print(json.dumps(summary, indent=1))
  return 0
