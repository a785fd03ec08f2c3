"""`st5 distill-cache --teacher PATH --task NAME --out DIR`: a teacher's vectors of a task's texts, once.

The training side reads the folder through st5_jax.objectives.distill.tasks (gin/distill_tiny_cpu.gin).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from st5_jax.cli import UsageError


def register(subparsers) -> None:
  p = subparsers.add_parser(
      "distill-cache", help="Encode a task's decontaminated training texts with a teacher, for distillation.",
      description="Read a task's examples (inputs, targets, hard negatives), drop those sharing a text with an "
                  "evaluation set, encode their distinct texts with the teacher (any model `st5 encode` reads, or "
                  "any sentence-transformers folder) and write the vectors in parts with manifest.json. Rerunning "
                  "resumes. Train from it with gin/distill_tiny_cpu.gin (ST5_DISTILL_CACHE=DIR); docs/architecture.md.")
  p.add_argument("--teacher", required=True, help="the teacher: a work dir, an exported or Hugging Face T5 folder, a "
                                                  "T5X checkpoint, a SavedModel or a sentence-transformers folder")
  p.add_argument("--teacher_backend", choices=["auto", "st5", "sentence-transformers"], default="auto",
                 help="st5: st5_jax's SentenceEncoder; sentence-transformers: SentenceTransformer(PATH); auto "
                      "(default): st5 unless a sentence-transformers folder is not a T5 tower")
  p.add_argument("--task", required=True, help="a registered task or mixture of this project's sources, e.g. "
                                               "st5_snli_devtest_triples or st5_user_nli_triples")
  p.add_argument("--split", default="train", help="split of --task (default train)")
  p.add_argument("--out", required=True, help="output folder, local or gs://; rerunning into it resumes")
  p.add_argument("--batch_size", type=int, default=64, help="texts the teacher encodes at a time (default 64)")
  p.add_argument("--max_length", type=int, default=None, help="the teacher's token limit (default: its own)")
  p.add_argument("--checkpoint", choices=["auto", "latest", "best"], default="auto",
                 help="a work dir teacher: its latest step, its best, or auto (best when there is one)")
  p.add_argument("--device", default=None, help="a sentence-transformers teacher's torch device (default: its choice)")
  p.add_argument("--shard_size", type=int, default=10_000, help="texts a part file (default 10000)")
  p.add_argument("--module", action="append", default=[],
                 help="Python module to import first, registering your tasks (repeatable)")
  p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
  from st5_jax.objectives.distill import cache as cache_lib  # pylint: disable=g-import-not-at-top
  from st5_jax.objectives.distill import teacher as teacher_lib  # pylint: disable=g-import-not-at-top

  for module in args.module:
    importlib.import_module(module)
  if args.shard_size < 1 or args.batch_size < 1:
    raise UsageError(f"--shard_size and --batch_size must be >= 1, got {args.shard_size} and {args.batch_size}")
  examples = cache_lib.task_examples(args.task, args.split)
  teacher = teacher_lib.load_teacher(args.teacher, backend=args.teacher_backend, batch_size=args.batch_size,
                                     max_length=args.max_length, checkpoint=args.checkpoint, device=args.device)
  report = cache_lib.build_cache(examples, teacher, args.out, shard_size=args.shard_size,
                                 progress=lambda line: print(line, file=sys.stderr, flush=True))
  m = report.manifest
  c = m["counts"]
  dropped = sum(c["dropped_contaminated"].values()) + sum(c.get("dropped_contaminated_by_task", {}).values())
  print(f"st5 distill-cache: encoded {len(report.encoded)} parts ({report.seconds:.1f}s), kept {len(report.kept)} "
        f"finished parts -> {args.out}", file=sys.stderr)
  print(f"{c['examples']} examples ({dropped} dropped for a text in an evaluation set), "
        f"{c['texts']} texts, teacher {m['teacher']['backend']} {m['dim']}-d; train with ST5_DISTILL_CACHE={args.out} "
        f"and TEACHER_DIM = {m['dim']}, NUM_NEGATIVES = {m['num_negatives']} (gin/distill_tiny_cpu.gin)",
        file=sys.stderr)
  return 0
