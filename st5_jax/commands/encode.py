"""`st5 encode --model PATH --input sentences.txt --output emb.npy`.

`--prompt_name NAME` / `--prompt TEXT` prepend one of the model's prompts / a text to every line,
`--truncate_dim D` keeps the first D dimensions (renormalised), `--precision` writes quantized codes
(st5_jax.quantize); int8 / uint8 take their ranges from `--ranges` or `--calibration_embeddings`.
`--side query` / `--side document` encode as `encode_query` / `encode_document`: that side's prompt when no
prompt is given, and that side's tower on a model with asymmetric towers (without `--side`: the default route,
the document tower).
"""

from __future__ import annotations

import argparse
import io
import sys
import time

from st5_jax import paths
from st5_jax.configs import POOLINGS

# st5_jax.quantize.PRECISIONS, not imported: `st5 --help` imports no NumPy.
_PRECISIONS = ("float32", "int8", "uint8", "binary", "ubinary")


def register(sub: argparse._SubParsersAction) -> None:
  p = sub.add_parser("encode", help="Encode sentences (one per line) to an .npy of embeddings.")
  p.add_argument("--model", required=True, help="Work dir, model folder, HF/sentence-transformers folder, "
                 "T5X checkpoint or SavedModel.")
  p.add_argument("--input", required=True, help="Text file, one sentence per line ('-' for stdin).")
  p.add_argument("--output", required=True,
                 help="Where to write the [N, D] .npy array (float32 unless --precision).")
  p.add_argument("--batch_size", type=int, default=64)
  p.add_argument("--max_length", type=int, default=None, help="Token limit (EOS included); default: the model's.")
  p.add_argument("--pooling", choices=list(POOLINGS), default=None,
                 help="Override the pooling (needed for raw T5 checkpoints that do not record one; "
                 "enc_first / enc_mean on a layer_attention model removes its attention head: this project's own "
                 "form, not LayerAttPooler's, which always runs it).")
  p.add_argument("--vocab", default=None, help="SentencePiece model (default: model folder, $ST5_VOCAB, $ST5_DATA_DIR).")
  p.add_argument("--no_progress", action="store_true")
  p.add_argument("--checkpoint", choices=["auto", "latest", "best"], default="auto",
                 help="of a work dir: its latest step, its best evaluated parameters (WORKDIR/best, kept by "
                      "early stopping), or auto (default): best when there is one, else latest")
  p.add_argument("--prompt_name", default=None, help="Prepend the model's prompt of this name to every line "
                 "(default: the model's default prompt, if it names one).")
  p.add_argument("--prompt", default=None, help="Prepend this text to every line (instead of a named prompt).")
  p.add_argument("--side", choices=["query", "document"], default=None,
                 help="Encode as encode_query / encode_document: the side's prompt (when no prompt is given) and, "
                      "for asymmetric towers, the side's tower (default: encode, the document tower).")
  p.add_argument("--truncate_dim", type=int, default=None, help="Keep the first D dimensions, renormalised to "
                 "unit length when the model normalises (default: the model's truncate_dim, else all).")
  p.add_argument("--precision", choices=list(_PRECISIONS), default="float32",
                 help="Write quantized codes: int8 / uint8 (per-dimension ranges), binary / ubinary (packed sign "
                      "bits, [N, ceil(D/8)]); as sentence-transformers' quantize_embeddings.")
  calibration = p.add_mutually_exclusive_group()
  calibration.add_argument("--ranges", default=None, help="int8 / uint8: a [2, D] .npy of each dimension's "
                           "min and max (default: from --calibration_embeddings, else from the lines encoded).")
  calibration.add_argument("--calibration_embeddings", default=None,
                           help="int8 / uint8: a float [M, D] .npy (e.g. an earlier `st5 encode` of a sample of "
                                "the corpus) whose per-dimension min and max are the ranges.")
  p.set_defaults(run=run)


def _load_npy(path: str | None):
  import numpy as np  # pylint: disable=g-import-not-at-top

  return None if path is None else np.load(io.BytesIO(paths.read_bytes(path)), allow_pickle=False)


def run(args: argparse.Namespace) -> int:
  # numpy and the encoder (JAX) here, not at the top: `st5 --help` imports this module.
  import numpy as np  # pylint: disable=g-import-not-at-top

  from st5_jax.cli import UsageError  # pylint: disable=g-import-not-at-top
  from st5_jax.encoder import SentenceEncoder  # pylint: disable=g-import-not-at-top

  if (args.ranges or args.calibration_embeddings) and args.precision not in ("int8", "uint8"):
    raise UsageError(f"--ranges / --calibration_embeddings set int8 and uint8 codes; --precision is {args.precision}")
  ranges, calibration = _load_npy(args.ranges), _load_npy(args.calibration_embeddings)
  if args.input == "-":
    lines = sys.stdin.read().splitlines()
  else:
    lines = paths.read_text(args.input).splitlines()  # local or gs://
  encoder = SentenceEncoder.load(args.model, pooling=args.pooling, vocab=args.vocab, max_length=args.max_length,
                                 checkpoint=args.checkpoint)
  start = time.perf_counter()
  encode = {"query": encoder.encode_query, "document": encoder.encode_document}.get(args.side, encoder.encode)
  emb = encode(lines, batch_size=args.batch_size, show_progress=not args.no_progress,
                       prompt_name=args.prompt_name, prompt=args.prompt, truncate_dim=args.truncate_dim,
                       precision=args.precision, ranges=ranges, calibration_embeddings=calibration)
  elapsed = time.perf_counter() - start
  buf = io.BytesIO()
  np.save(buf, emb)
  output = args.output if args.output.endswith(".npy") else args.output + ".npy"  # as np.save names it
  paths.write_bytes(output, buf.getvalue())
  print(f"encoded {len(lines)} sentences -> {output} {emb.dtype} {emb.shape} in {elapsed:.1f}s "
        f"({len(lines) / max(elapsed, 1e-9):.0f} sentences/s)", file=sys.stderr)
  return 0
