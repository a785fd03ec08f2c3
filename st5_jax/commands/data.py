"""`st5 data ...`: prepare datasets, list what is known, build NLI triples, check evaluation overlap, cache tokens."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys

from st5_jax import paths
from st5_jax.cli import UsageError


def register(subparsers) -> None:
  parser = subparsers.add_parser("data", help="Prepare and inspect training/evaluation data.",
                                 description="Prepare and inspect the data the seqio tasks read.")
  sub = parser.add_subparsers(dest="data_command", required=True, metavar="SUBCOMMAND")

  p = sub.add_parser("prepare", help="Get every known dataset (local copy or download) and write what tasks read.",
                     description="Copy datasets from a local data folder (--source, or "
                                 "$ST5_DATA_DIR) or download them from their canonical URLs (or --base-url), derive "
                                 "the derived ones from their sources, verify every sha256, and write "
                                 "OUT/prepared/<task>/<split>.jsonl. From an empty OUT this gets every file `st5 train "
                                 "--gin_file st5_tiny_cpu.gin` and `st5 eval` read. Safe to rerun.")
  p.add_argument("--source", help="local data folder holding the files at the paths docs/data.md lists "
                                  "(stsb/, glue/, ...; default: $ST5_DATA_DIR)")
  p.add_argument("--out", help="output data folder (default: $ST5_DATA_DIR); use it as ST5_DATA_DIR afterwards")
  p.add_argument("--base-url", help="download from this mirror (same relative paths as a data folder) instead of the "
                                    "canonical URLs")
  p.add_argument("--datasets", help="comma-separated dataset names (default: all core datasets, plus optional "
                                    "ones found locally); see `st5 data list`")
  p.add_argument("--offline", action="store_true", help="never download; only copy from --source")
  p.add_argument("--trust-unverified", action="store_true",
                 help="download files whose sha256 is not known here and record the checksum that arrives")
  p.add_argument("--strict", action="store_true", help="stop at the first bad row instead of skipping it")
  p.add_argument("--no-progress", action="store_true", help="no progress bars")
  p.add_argument("--timeout", type=float, default=60.0, help="seconds per download request")
  p.add_argument("--tfds", action="store_true",
                 help="also write the prepared tasks as TFDS datasets under OUT/tfds (st5_qa_pairs/*, "
                      "st5_nli_triples/*), for tfds.load(..., data_dir=OUT/tfds) and seqio's TfdsDataSource")
  p.set_defaults(run=run)

  p = sub.add_parser("list", help="List known datasets and registered st5 tasks.")
  p.add_argument("--json", action="store_true", help="machine-readable output")
  p.set_defaults(run=run)

  p = sub.add_parser("nli-triples", help="Build SimCSE-format triples (sent0,sent1,hard_neg) from raw NLI files.",
                     description="Reads SNLI/MultiNLI *.jsonl, SentEval SNLI s1.<split> files or SICK_*.txt and "
                                 "writes premise,entailment,contradiction triples as SimCSE's nli_for_simcse.csv.")
  p.add_argument("--input", action="append", required=True, help="raw NLI file (repeatable)")
  p.add_argument("--out", required=True, help="output CSV (e.g. DATA_DIR/nli/nli_for_simcse.csv)")
  p.add_argument("--mode", choices=("per_entailment", "per_premise"), default="per_entailment",
                 help="per_entailment: one triple per entailment (nli/snli_devtest_triples_derived.csv row for row; "
                      "`st5 data prepare` derives that file itself); "
                      "per_premise: one per premise (about SimCSE's 275K on SNLI+MNLI train)")
  p.add_argument("--strict", action="store_true", help="stop at the first bad row")
  p.set_defaults(run=run)

  p = sub.add_parser("overlap", help="Report texts shared by training data and evaluation or public test sets.",
                     description="Normalised-text overlap (NFKC, lower case, letters and digits only) between "
                                 "the texts of training tasks or mixtures and every text the evaluation sets "
                                 "encode. With any of --beir, --mteb_task, --jsonl, --cache (or the settings "
                                 "below): the contamination check, exact and near-duplicate (MinHash LSH, verified "
                                 "by exact Jaccard) matches of training texts with the queries, documents and "
                                 "relevant documents of BEIR folders and MTEB tasks (and --eval sets), counted by "
                                 "test set and side (docs/data.md). Exit status 1 when there is any.")
  p.add_argument("--tasks", default=None, help="comma-separated task or mixture names (mixtures are expanded)")
  p.add_argument("--eval", default=None,
                 help="evaluation sets: 'all' (the default, but for the contamination check when --beir or "
                      "--mteb_task name its test sets), suites (sts, transfer, sentglue, dev) or task names as in "
                      "`st5 eval --tasks`")
  p.add_argument("--split", default="train", help="split of the training tasks (default train)")
  p.add_argument("--data_dir", help="data folder with the evaluation sets (default: $ST5_DATA_DIR)")
  p.add_argument("--module", action="append", default=[],
                 help="Python module to import first, registering your tasks (repeatable)")
  p.add_argument("--show", type=int, default=3, help="example texts shown per overlap (per side and kind)")
  p.add_argument("--json", action="store_true", help="machine-readable output")
  p.add_argument("--beir", action="append", default=[], metavar="FOLDER[:SPLIT]",
                 help="a BEIR folder (corpus.jsonl, queries.jsonl, qrels/SPLIT.tsv) to check against: its SPLIT's "
                      "judged queries (default test), every document, the relevant ones (repeatable)")
  p.add_argument("--mteb_task", action="append", default=[], metavar="[NAME=]PATH",
                 help="an MTEB task from a local copy of its Hugging Face dataset (huggingface-cli download "
                      "mteb/scifact --repo-type dataset --local-dir PATH, or its Hugging Face cache snapshot); NAME "
                      "is the mteb task name (default: the task of that dataset) (repeatable)")
  p.add_argument("--jsonl", action="append", default=[],
                 help="training JSON-lines file or glob: every string (or list of strings) field of each line, or "
                      "--jsonl_fields (repeatable)")
  p.add_argument("--jsonl_fields", default=None, help="comma-separated fields of --jsonl lines to check (default: all)")
  p.add_argument("--cache", action="append", default=[],
                 help="a token cache `st5 data cache` wrote (a task split's folder, or the --out root): its token "
                      "ids decoded back to text (repeatable)")
  p.add_argument("--vocab", default=None, help="SentencePiece model the --cache was written with (default: the "
                                               "tasks' vocabulary, $ST5_VOCAB)")
  p.add_argument("--near_threshold", type=float, default=None,
                 help="Jaccard of the character-shingle sets at and above which a pair is a near duplicate "
                      "(default 0.8)")
  p.add_argument("--num_perm", type=int, default=None, help="MinHash permutations (default 128)")
  p.add_argument("--shingle", type=int, default=None, help="characters per shingle of the normalised text (default 5)")
  p.add_argument("--runner", default=None,
                 help="run the contamination check as an Apache Beam pipeline on this runner (DirectRunner, "
                      "DataflowRunner, ...); further Beam flags follow, e.g. --project P --region R --temp_location "
                      "gs://B/tmp. Default: in memory, in this process")
  p.add_argument("--out", default=None, help="write the contamination report (JSON) here, e.g. for `st5 export "
                                             "--contamination_report`")
  p.set_defaults(run=run, accepts_extra=True)

  p = sub.add_parser("cache", help="Write a task's tokenised, de-duplicated examples as sharded TFRecords.",
                     description="Tokenise a task split (mixtures: each of its tasks) through its usual path, "
                                 "drop duplicates by normalised text and evaluation texts, and write "
                                 "OUT/<task>/<split>/: N TFRecord shards and manifest.json. Train from it with gin "
                                 "DataConfig.cache_dir = 'OUT'. With --gin_file, the run's own DataConfig "
                                 "(task, feature lengths, split, cache_dir as OUT, prompts) and task bindings are "
                                 "used.")
  p.add_argument("--gin_file", action="append", default=[],
                 help="the run's gin file(s): DataConfig gives --task, --feature_lengths, --split and --out unless "
                      "given; --gin.KEY=VALUE bindings apply too (repeatable)")
  p.add_argument("--task", help="task or mixture name (default: the gin file's DataConfig.task)")
  p.add_argument("--out", help="cache root folder, local or gs:// (default: the gin file's DataConfig.cache_dir)")
  p.add_argument("--split", default=None, help="split (default: the gin file's DataConfig.split, else train)")
  p.add_argument("--num_shards", type=int, default=None,
                 help="shards per task split (default: the split's input rows / --records_per_shard, rounded up to a "
                      "multiple of --num_readers); given, it is still checked against --worker_memory_gb")
  p.add_argument("--records_per_shard", type=int, default=500_000,
                 help="records a shard holds when --num_shards is derived (default 500000: 2B pairs -> 4,000 shards; "
                      "resuming a run reads at most one shard)")
  p.add_argument("--num_readers", type=int, default=None,
                 help="data readers (hosts) of the runs that train from the cache; a derived --num_shards is a "
                      "multiple of it (default 1, with a note: a run on more hosts needs at least one shard each)")
  p.add_argument("--worker_memory_gb", type=float, default=4.0,
                 help="with --runner: memory of one Beam worker process (default 4: an n2-standard-8 over its 8 "
                      "processes); a shard whose writer would hold more than half of it is refused")
  p.add_argument("--range_mb", type=int, default=64,
                 help="with --runner: uncompressed JSON-lines/TSV files larger than this are read in ranges of this "
                      "many MiB by different workers (default 64)")
  p.add_argument("--feature_lengths", default=None,
                 help="token length per feature, e.g. inputs=64,targets=64 (negative_targets defaults to "
                      "targets); default: the gin file's DataConfig.feature_lengths, else inputs=64,targets=64")
  p.add_argument("--prompts", default=None,
                 help="text prepended to features before tokenising, as JSON in DataConfig.prompts' forms, e.g. "
                      "'{\"query\": \"query: \", \"document\": \"passage: \"}' (default: the gin file's "
                      "DataConfig.prompts, else none); recorded in the manifest, and a run reading the cache must "
                      "train with the same")
  p.add_argument("--keep_duplicates", action="store_true", help="do not drop examples with the same normalised text")
  p.add_argument("--no_decontaminate", action="store_true",
                 help="keep examples that share a text with an evaluation set (default: drop and count them)")
  p.add_argument("--runner", default=None,
                 help="build with an Apache Beam pipeline on this runner (DirectRunner, DataflowRunner, ...); any "
                      "further Beam flags follow, e.g. --project P --region R --temp_location gs://B/tmp "
                      "(docs/data.md). Default: in memory, in this process")
  p.add_argument("--module", action="append", default=[],
                 help="Python module to import first, registering your tasks (repeatable)")
  p.set_defaults(run=run, accepts_extra=True)

  p = sub.add_parser("mine", help="Mine K hard negatives per query (BM25 or a dense model) into training JSON lines.",
                     description="Retrieve each query's best documents with BM25 or a dense model, drop false "
                                 "negatives (top ranks, margins to the positive's score, texts equal to a positive "
                                 "after normalisation) and write {query, pos, neg} JSON lines (FlagEmbedding's and "
                                 "Tevatron's format) in parts, with manifest.json. Every process of a multi-host run "
                                 "runs the same command and mines its parts; rerunning resumes. Train the result with "
                                 "gin/mined_tiny_cpu.gin's task (st5_jax.data.hard_negatives_task). docs/data.md.")
  p.add_argument("--pairs", action="append", default=[],
                 help="(query, positive) files: JSON lines {query, pos} (pos a string or a list), TSV or CSV "
                      "(columns 0 and 1 unless --columns); repeat or separate with commas; globs expand")
  p.add_argument("--pairs_task", help="or a registered pair task or mixture of this project's sources (e.g. "
                                      "st5_stage1_public_qa)")
  p.add_argument("--split", default="train", help="split of --pairs_task (default train)")
  p.add_argument("--columns", help="the pairs' keys or columns, e.g. query=question,pos=answer (indices for "
                                   "headerless TSV/CSV)")
  p.add_argument("--pairs_format", choices=["jsonl", "tsv", "csv", "tfrecord"], default=None,
                 help="format of --pairs (default: by extension)")
  p.add_argument("--corpus", action="append", default=[],
                 help="candidate documents as `st5 index` reads them (BEIR corpus.jsonl, id/text JSON lines, "
                      "id<TAB>text, one a line); default: the distinct positives of the pairs")
  p.add_argument("--corpus_format", choices=["jsonl", "tsv", "text"], default=None, help="format of --corpus")
  p.add_argument("--out", required=True, help="output folder, local or gs://; rerunning into it resumes")
  p.add_argument("--method", choices=["bm25", "dense"], default="bm25", help="retrieval (default bm25)")
  p.add_argument("--k1", type=float, default=1.5, help="BM25 term-frequency saturation (default 1.5)")
  p.add_argument("--b", type=float, default=0.75, help="BM25 length normalisation (default 0.75)")
  p.add_argument("--model", help="dense: the model encoding queries and positives (and the corpus unless --index)")
  p.add_argument("--index", help="dense: an `st5 index` folder of --corpus, searched instead of building one under "
                                 "OUT/index")
  p.add_argument("--batch_size", type=int, default=64, help="dense: texts a device encodes per step (default 64)")
  p.add_argument("--max_length", type=int, default=None, help="dense: token limit (default: the model's)")
  p.add_argument("--checkpoint", choices=["auto", "latest", "best"], default="auto",
                 help="dense: of a work dir, its latest step, its best, or auto (best when there is one)")
  p.add_argument("--num_negatives", type=int, default=15, help="negatives kept per query (default 15; training "
                                                               "draws its K of them every epoch)")
  p.add_argument("--range_min", type=int, default=0, help="skip candidates ranked below this (0-based, default 0)")
  p.add_argument("--range_max", type=int, default=100, help="candidates retrieved per query (default 100)")
  p.add_argument("--margin", type=float, default=None,
                 help="drop candidates scoring above (lowest positive score - margin)")
  p.add_argument("--relative_margin", type=float, default=None,
                 help="drop candidates scoring above p - |p| * relative_margin, p the lowest positive score")
  p.add_argument("--keep_equal_to_positive", action="store_true",
                 help="keep candidates that equal a positive after normalisation (NFKC, lower case, letters and "
                      "digits; default: drop them)")
  p.add_argument("--sampling", choices=["top", "random"], default="top",
                 help="which survivors are kept: the best, or a seeded random draw (default top)")
  p.add_argument("--seed", type=int, default=0, help="seed of --sampling random (default 0)")
  p.add_argument("--shard_size", type=int, default=10_000, help="queries a part file (default 10000)")
  p.add_argument("--with_ids", action="store_true", help="also write neg_ids (corpus ids)")
  p.add_argument("--with_scores", action="store_true", help="also write pos_scores and neg_scores")
  p.add_argument("--strict", action="store_true", help="stop at the first bad pair row")
  p.add_argument("--module", action="append", default=[],
                 help="Python module to import first, registering your tasks (repeatable)")
  p.set_defaults(run=run)


def split_extra(extra: list[str]) -> tuple[list[str], list[str]]:
  """(--gin.KEY=VALUE arguments, everything else) of a command's extra arguments."""
  gin_args, other, i = [], [], 0
  while i < len(extra):
    arg = extra[i]
    if arg.startswith("--gin."):
      gin_args.append(arg)
      if "=" not in arg and i + 1 < len(extra):
        gin_args.append(extra[i + 1])
        i += 1
    else:
      other.append(arg)
    i += 1
  return gin_args, other


def run(args: argparse.Namespace) -> int:
  command = args.data_command
  if command == "prepare":
    return _prepare(args)
  if command == "list":
    return _list(args)
  if command == "nli-triples":
    return _nli_triples(args)
  if command == "overlap":
    return _overlap(args)
  if command == "cache":
    return _cache(args)
  if command == "mine":
    return _mine(args)
  raise ValueError(command)


def _prepare(args) -> int:
  from st5_jax.data.offline import prepare as prepare_lib  # pylint: disable=g-import-not-at-top
  from st5_jax.data import config as data_config  # pylint: disable=g-import-not-at-top
  env_dir = data_config.data_dir(required=False)  # the data folder the tasks read (gin, else $ST5_DATA_DIR)
  out = args.out or env_dir
  if not out:
    raise UsageError("pass --out DIR (or set ST5_DATA_DIR) for the prepared data folder.")
  source = args.source or (env_dir if env_dir and os.path.abspath(env_dir) != os.path.abspath(out) else None)
  if source and not os.path.isdir(source):
    raise UsageError(f"--source {source} is not a folder.")
  datasets = [d.strip() for d in args.datasets.split(",") if d.strip()] if args.datasets else None
  try:
    report = prepare_lib.prepare(out_dir=out, source_dir=source, base_url=args.base_url, datasets=datasets,
                                 offline=args.offline, trust_unverified=args.trust_unverified, strict=args.strict,
                                 progress=not args.no_progress, timeout=args.timeout, tfds=args.tfds)
  except prepare_lib.PrepareError as e:
    raise UsageError(str(e)) from e
  print(report.summary())
  if not report.ok:
    print(f"\n{len(report.errors)} problem(s); see above.", file=sys.stderr)
    return 1
  print(f"\nDone. Use it with: export ST5_DATA_DIR={report.out_dir}")
  return 0


def _list(args) -> int:
  # The data modules inside each subcommand, not at the top: `st5 --help` imports this module
  # (the readers alone add ~0.1 s; seqio and the task registry import TensorFlow).
  import seqio  # pylint: disable=g-import-not-at-top

  from st5_jax.data import tasks  # pylint: disable=g-import-not-at-top
  from st5_jax.data.offline import catalog  # pylint: disable=g-import-not-at-top
  datasets = [{"name": d.name, "files": len(d.files), "optional": d.optional, "local_only": d.local_only,
               "derived_from": list(d.derived.sources) if d.derived else None,
               "recipe": d.derived.command if d.derived else None,
               "description": d.description, "note": d.note} for d in catalog.DATASETS.values()]
  task_rows = [{"name": n, "splits": list(seqio.get_mixture_or_task(n).splits),
                "features": list(seqio.get_mixture_or_task(n).output_features)}
               for n in tasks.ALL_TASKS + tasks.MIXTURES]
  if args.json:
    print(json.dumps({"datasets": datasets, "tasks": task_rows}, indent=1))
    return 0
  print("Datasets:")
  for d in datasets:
    derived = f"derived from {', '.join(d['derived_from'])}" if d["derived_from"] else ""
    flags = ", ".join(f for f, on in (("optional", d["optional"]), ("local-only", d["local_only"]), (derived, derived))
                      if on)
    print(f"  {d['name']:26} {d['files']:>4} files  {d['description']}" + (f" [{flags}]" if flags else ""))
  print("Tasks and mixtures:")
  for t in task_rows:
    print(f"  {t['name']:32} splits={','.join(t['splits'])}  features={','.join(t['features'])}")
  return 0


def _nli_triples(args) -> int:
  from st5_jax.data import builders  # pylint: disable=g-import-not-at-top  (see _list)
  from st5_jax.data.rows import RowStats  # pylint: disable=g-import-not-at-top
  from st5_jax.errors import BadRowError, InputFileError  # pylint: disable=g-import-not-at-top
  stats = RowStats()
  try:
    triples = builders.build_nli_triples(args.input, stats=stats, strict=args.strict, mode=args.mode)
  except (BadRowError, InputFileError, ValueError) as e:
    raise UsageError(str(e)) from e
  n = builders.write_simcse_csv(triples, args.out)
  s = stats.as_dict()
  print(f"wrote {n} triples to {args.out}; rows read {s['rows_read']}, skipped {s['rows_skipped']}, "
        f"filtered {s['rows_filtered']} {s['filtered_by_reason']}")
  for bad in s["first_skipped"]:
    print(f"  skipped {bad}")
  return 0


_CONTAMINATION_FLAGS = ("beir", "mteb_task", "jsonl", "cache", "near_threshold", "num_perm", "shingle", "runner", "out")


def _overlap(args) -> int:
  # The evaluation readers and the task registry (TensorFlow): see _list.
  for module in args.module:
    importlib.import_module(module)
  if any(getattr(args, flag) not in (None, []) for flag in _CONTAMINATION_FLAGS):
    return _contamination(args)
  if args.extra:
    raise UsageError(f"unrecognized arguments: {' '.join(args.extra)} (see `st5 data overlap --help`)")
  if not args.tasks:
    raise UsageError("pass the training data: --tasks NAMES, --jsonl FILE or --cache DIR.")
  from st5_jax.data import tasks  # noqa: F401  pylint: disable=g-import-not-at-top
  from st5_jax.data.offline import overlap_report  # pylint: disable=g-import-not-at-top
  try:
    data_dir = str(paths.data_dir(args.data_dir))
    names = [t.strip() for t in args.tasks.split(",") if t.strip()]
    found, missing = overlap_report.find_overlaps(names, data_dir=data_dir, evaluations=args.eval or "all",
                                                  split=args.split, show=args.show)
  except (FileNotFoundError, ValueError) as e:  # also seqio's "not found" for an unknown task name
    raise UsageError(str(e)) from e
  print(json.dumps(overlap_report.as_json(found, missing), indent=1) if args.json
        else overlap_report.summary(found, missing))
  return 1 if found else 0


def _contamination(args) -> int:
  from st5_jax.data.offline import contamination  # pylint: disable=g-import-not-at-top
  if args.extra and not args.runner:
    raise UsageError(f"unrecognized arguments: {' '.join(args.extra)} (Beam flags need --runner)")
  defaults = contamination.Settings()
  settings = contamination.Settings(
      near_threshold=defaults.near_threshold if args.near_threshold is None else args.near_threshold,
      num_perm=defaults.num_perm if args.num_perm is None else args.num_perm,
      shingle=defaults.shingle if args.shingle is None else args.shingle, show=args.show)

  def progress(line):
    print(f"st5 data overlap: {line}", file=sys.stderr, flush=True)

  try:
    settings.check()
    task_names = [t.strip() for t in (args.tasks or "").split(",") if t.strip()]
    if task_names:
      from st5_jax.data import tasks  # noqa: F401  pylint: disable=g-import-not-at-top  (registers them)
    fields = [f.strip() for f in args.jsonl_fields.split(",") if f.strip()] if args.jsonl_fields else None
    plan = contamination.plan_training(tasks=task_names, split=args.split, jsonl=args.jsonl, jsonl_fields=fields,
                                       caches=args.cache, vocab=args.vocab)
    evaluations = []
    if args.eval is not None or not (args.beir or args.mteb_task):
      from st5_jax.data import overlap  # pylint: disable=g-import-not-at-top
      evaluations = overlap.evaluation_sets(args.eval or "all")
    data_dir = str(paths.data_dir(args.data_dir)) if evaluations else None
    test_sets, missing = contamination.read_test_sets(beir=args.beir, mteb=args.mteb_task, evaluations=evaluations,
                                                 data_dir=data_dir)
    if args.runner:
      from st5_jax.data.offline import contamination_beam  # pylint: disable=g-import-not-at-top  (Apache Beam)
      report = contamination_beam.check_beam(plan, test_sets, settings, missing=missing,
                                             pipeline_args=[f"--runner={args.runner}", *args.extra],
                                             progress=progress)
    else:
      report = contamination.check(plan, test_sets, settings, missing=missing, progress=progress)
  except (FileNotFoundError, ValueError) as e:  # also seqio's "not found" for an unknown task name
    raise UsageError(str(e)) from e
  if args.out:
    contamination.write_report(report, args.out)
    progress(f"report written to {args.out}")
  print(json.dumps(report, indent=1, ensure_ascii=False) if args.json else contamination.summary(report))
  return 1 if report["contaminated"] else 0


def _parse_lengths(text: str) -> dict[str, int]:
  out = {}
  for part in (p.strip() for p in text.split(",")):
    if not part:
      continue
    key, sep, value = part.partition("=")
    if not sep or not value.strip().isdigit():
      raise UsageError(f"--feature_lengths: {part!r} is not FEATURE=LENGTH (e.g. inputs=64,targets=64).")
    out[key.strip()] = int(value)
  if not out:
    raise UsageError("--feature_lengths is empty; e.g. inputs=64,targets=64.")
  return out


def _cache(args) -> int:
  # TensorFlow and the task registry: see _list.
  import seqio  # pylint: disable=g-import-not-at-top

  from st5_jax.data import cache  # pylint: disable=g-import-not-at-top
  from st5_jax.data.offline import cache_writer  # pylint: disable=g-import-not-at-top
  from st5_jax.data.streams import get_provider  # pylint: disable=g-import-not-at-top
  from st5_jax.errors import BadRowError  # pylint: disable=g-import-not-at-top
  for module in args.module:
    importlib.import_module(module)
  gin_args, beam_args = split_extra(args.extra)
  task, lengths, split, out, prompts = args.task, None, args.split, args.out, None
  if args.gin_file or gin_args:
    from st5_jax import gin_config  # pylint: disable=g-import-not-at-top
    from st5_jax.commands.train import gin_overrides  # pylint: disable=g-import-not-at-top
    gin_config.parse_gin(args.gin_file, gin_overrides(gin_args))
    data = gin_config.run_spec().data
    task, lengths = task or data.task, dict(data.feature_lengths)
    split, out = split or data.split, out or data.cache_dir
    prompts = getattr(data, "prompts", None)
  if args.prompts is not None:
    try:
      prompts = json.loads(args.prompts)
    except ValueError as e:
      raise UsageError(f"--prompts is not JSON ({e}); e.g. '{{\"query\": \"query: \"}}'.") from e
  if args.feature_lengths or lengths is None:
    lengths = _parse_lengths(args.feature_lengths or "inputs=64,targets=64")
  split = split or "train"
  if not task or not out:
    raise UsageError("pass --task and --out (or a --gin_file whose DataConfig names the task and cache_dir).")
  for flag in ("num_shards", "records_per_shard", "num_readers", "range_mb"):
    value = getattr(args, flag)
    if value is not None and value < 1:
      raise UsageError(f"--{flag} must be at least 1, got {value}.")
  if args.worker_memory_gb <= 0:
    raise UsageError(f"--worker_memory_gb must be positive, got {args.worker_memory_gb}.")
  if beam_args and not args.runner:
    raise UsageError(f"unrecognized arguments: {' '.join(beam_args)} (Beam flags need --runner)")
  sizing = cache_writer.ShardSizing(records_per_shard=args.records_per_shard, num_readers=args.num_readers or 1,
                                    worker_memory_gb=args.worker_memory_gb)

  def progress(line):
    print(line, file=sys.stderr, flush=True)

  if args.num_readers is None and args.num_shards is None:
    progress("st5 data cache: note: --num_readers not given, so the shard count is sized for 1 data reader; a run "
             "on R hosts reads at least one shard a host: pass --num_readers R (a v4 slice has chips / 4 hosts; "
             "a run may later resume on fewer or more hosts, up to the shard count).")

  try:
    provider = get_provider(task)
    tasks = list(provider.tasks) if isinstance(provider, seqio.Mixture) else [provider]
    names = [t.name for t in tasks]
    # The run's prompts per task of the mixture (the same resolution as its DataConfig's).
    from st5_jax.data import convert, prompts as prompts_lib  # pylint: disable=g-import-not-at-top
    token_features = list(dict.fromkeys(f.task_key for t in tasks for f in convert.batch_layout([t], lengths).features
                                        if f.is_tokens)) if prompts else []
    per_task = prompts_lib.resolve(prompts, names, token_features, where="DataConfig.prompts / --prompts")
    for name in names:
      folder = cache.task_dir(out, name, split)
      if args.runner:
        from st5_jax.data.offline import beam_cache  # pylint: disable=g-import-not-at-top  (Apache Beam)
        m = beam_cache.write_cache_beam(name, split, folder, args.num_shards, lengths,
                                        dedup=not args.keep_duplicates, decontaminate=not args.no_decontaminate,
                                        pipeline_args=[f"--runner={args.runner}", *beam_args], sizing=sizing,
                                        split_bytes=args.range_mb << 20, progress=progress, prompts=per_task[name])
      else:
        m = cache_writer.write_cache(name, split, folder, args.num_shards, lengths, dedup=not args.keep_duplicates,
                                     decontaminate=not args.no_decontaminate, sizing=sizing, progress=progress,
                                     prompts=per_task[name])
      s = m["stats"]
      print(f"{name} ({split}): {m['num_examples']} examples in {m['num_shards']} shards at {folder}; rows in "
            f"{s['rows_in']}, dropped as duplicates {s['dropped_duplicates']}, as contaminated "
            f"{s['dropped_contaminated']}, trimmed {s['trimmed']}" + (f"; prompts {m['prompts']}" if m.get("prompts")
                                                                       else ""))
  except (FileNotFoundError, ValueError, BadRowError) as e:  # DataConfigError/CacheError are ValueErrors
    raise UsageError(str(e)) from e
  return 0


def _mine(args) -> int:
  # JAX, TensorFlow (normalisation) and bm25s: see _list.
  import logging  # pylint: disable=g-import-not-at-top

  from st5_jax import multihost  # pylint: disable=g-import-not-at-top
  multihost.maybe_initialize()  # before anything starts a JAX backend (importing bm25s does)
  from st5_jax.data.offline import mine as mine_lib  # pylint: disable=g-import-not-at-top
  from st5_jax.data.registry import parse_columns  # pylint: disable=g-import-not-at-top
  from st5_jax.errors import BadRowError, InputFileError  # pylint: disable=g-import-not-at-top
  for module in args.module:
    importlib.import_module(module)
  if bool(args.pairs) == bool(args.pairs_task):
    raise UsageError("pass the pairs as --pairs FILES or as --pairs_task NAME (one of them).")
  if args.method == "bm25" and (args.model or args.index):
    raise UsageError("--model and --index are for --method dense; BM25 needs neither.")
  config = mine_lib.MineConfig(
      method=args.method, num_negatives=args.num_negatives, range_min=args.range_min, range_max=args.range_max,
      margin=args.margin, relative_margin=args.relative_margin, keep_equal_to_positive=args.keep_equal_to_positive,
      sampling=args.sampling, seed=args.seed, k1=args.k1, b=args.b, with_ids=args.with_ids,
      with_scores=args.with_scores)
  logging.getLogger("bm25s").setLevel(logging.WARNING)  # its index build logs at DEBUG
  try:
    config.check()
    if args.pairs:
      pairs = mine_lib.read_pairs(args.pairs, columns=parse_columns(args.columns) if args.columns else None,
                                  fmt=args.pairs_format, strict=args.strict)
    else:
      pairs = mine_lib.task_pairs(args.pairs_task, args.split)
    corpus = (mine_lib.files_corpus(args.corpus, fmt=args.corpus_format) if args.corpus
              else mine_lib.positives_corpus(pairs))
    report = mine_lib.mine(pairs, corpus, args.out, config, model=args.model, index_dir=args.index,
                           batch_size=args.batch_size, max_length=args.max_length, checkpoint=args.checkpoint,
                           shard_size=args.shard_size, progress=lambda line: print(line, file=sys.stderr, flush=True))
  except (FileNotFoundError, NotADirectoryError, ValueError, BadRowError, InputFileError) as e:
    raise UsageError(str(e)) from e
  where = f"process {report.process} of {report.processes}: " if report.processes > 1 else ""
  print(f"st5 data mine: {where}mined {len(report.mined)} parts ({report.seconds:.1f}s), kept {len(report.skipped)} "
        f"finished parts -> {args.out}", file=sys.stderr)
  if report.manifest:
    c = report.manifest["counts"]
    print(f"{c['queries']} queries, {c['candidates']} candidates, filtered {c['filtered']}, {c['mined']} negatives "
          f"mined, {c['short']} queries with fewer than {config.num_negatives} ({c['empty']} with none); pair rows "
          f"skipped {report.manifest['pairs']['rows'].get('rows_skipped', 0)}")
  return 0
