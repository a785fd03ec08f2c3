"""`st5 encode --model PATH --input sentences.txt --output emb.npy`."""

from __future__ import annotations

import argparse
import io
import sys
import time

from st5_jax import paths
from st5_jax.configs import POOLINGS


def register(sub: argparse._SubParsersAction) -> None:
  p = sub.add_parser("encode", help="Encode sentences (one per line) to an .npy of embeddings.")
  p.add_argument("--model", required=True, help="Work dir, model folder, HF/sentence-transformers folder, "
                 "T5X checkpoint or SavedModel.")
  p.add_argument("--input", required=True, help="Text file, one sentence per line ('-' for stdin).")
  p.add_argument("--output", required=True, help="Where to write the float32 [N, D] .npy array.")
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
  p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
  # numpy and the encoder (JAX) here, not at the top: `st5 --help` imports this module.
  import numpy as np  # pylint: disable=g-import-not-at-top

  from st5_jax.encoder import SentenceEncoder  # pylint: disable=g-import-not-at-top

  if args.input == "-":
    lines = sys.stdin.read().splitlines()
  else:
    lines = paths.read_text(args.input).splitlines()  # local or gs://
  encoder = SentenceEncoder.load(args.model, pooling=args.pooling, vocab=args.vocab, max_length=args.max_length,
                                 checkpoint=args.checkpoint)
  start = time.perf_counter()
  emb = encoder.encode(lines, batch_size=args.batch_size, show_progress=not args.no_progress)
  elapsed = time.perf_counter() - start
  buf = io.BytesIO()
  np.save(buf, emb)
  output = args.output if args.output.endswith(".npy") else args.output + ".npy"  # as np.save names it
  paths.write_bytes(output, buf.getvalue())
  print(f"encoded {len(lines)} sentences -> {output} {emb.shape} in {elapsed:.1f}s "
        f"({len(lines) / max(elapsed, 1e-9):.0f} sentences/s)", file=sys.stderr)
  return 0
