"""The token cache written by an Apache Beam pipeline: the same files as `cache_writer.write_cache`, at any size.

The in-memory writer holds a task split in one process; this pipeline spreads the same
pure steps (st5_jax.data.offline.cache_writer) over Beam workers, so the DirectRunner here and Cloud
Dataflow there write byte-identical shards and the same manifest:

    read units ──► rows ──► decontaminate ──► tokenise ──► by shard ──► dedup + write shard ──► manifest
    (a file, or a  (source   (the evaluation   (batches;     (one GroupByKey:  (first in source order
     byte range of  filters,  texts' index,     trimmed        a duplicate's     kept; records sorted
     a large line   bad rows  read once per     flags kept)    key picks its     by key)
     file)          counted)  worker)                          shard)

Input by reference: a read unit is (unit key, kind, path, byte range), never a reader
holding the file list (that made the job graph grow with the square of the files: 136 KB
an element at 2,000 files). Workers rebuild the reader from a `ReaderSpec` (row format,
strictness), pickled once with the DoFn. Uncompressed JSON-lines and TSV files larger than
`split_bytes` are read in byte ranges, each a unit of its own, so one big file does not
hold a stage: a range reads the lines that start in it (`iter_range_lines`). CSV (quoted
fields may span lines), TFRecord and compressed files are read whole.

Dedup needs no shuffle of its own: the shard is a function of the dedup key, so all
copies of a text meet in one shard's group, where the one with the smallest source
position (file index, byte range, row in the unit) is kept -- the in-memory writer's "first
in source order". Decontamination is a broadcast join: the evaluation texts are ~1.5 x 10^5
strings and the corpus up to 10^9 rows, so every worker loads the texts' index once (a file
beside the output, removed at the end) rather than the corpus being shuffled a second time.
(A Beam side input was tried: it is decoded per bundle, 50 s per 20,000 rows here.) The
tokenizer models travel the same way, so the job graph holds neither.

Counts are Beam counters (namespace `METRICS_NAMESPACE`, named as the manifest's stats) while
the job runs; the manifest gets the counts and the first `cache_writer.DROPPED_SAMPLES` dropped
texts per reason (combined per reason, never a list of every drop).

Only tasks read by the NumPy path (this project's sources and users' TSV/CSV/JSON lines/
TFRecord files with the standard preprocessors) run here; their rows are read by the
same RowReader, so bad rows, filters and their counts are the same.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import heapq
import json
import logging
import os
import pickle
import time
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

from st5_jax import paths
from st5_jax.data import cache, overlap, sources as sources_lib, streams
from st5_jax.data import prompts as prompts_lib
from st5_jax.data import rows as rows_lib
from st5_jax.data.offline import cache_writer
from st5_jax.data.rows import RowFormat, RowReader, RowStats

log = logging.getLogger("st5_jax.data")

METRICS_NAMESPACE = "st5_cache"
SPLIT_BYTES = 64 << 20  # a line-based file larger than this is read in ranges of this size
_SPLITTABLE = ("jsonl", "tsv")  # CSV is not: a quoted field may hold a line break
_COMPRESSED = (".gz", ".bz2", ".xz", ".zst", ".zip", ".deflate", ".lz4", ".snappy")
_MEMORY_CHUNK = 4096  # examples per read unit of a split built in memory (public tasks)
_TOKENIZE_BATCH = 512
_INDEX_FILE = "_evaluation_index.pickle"  # removed when the pipeline is done
_MODELS_FILE = "_tokenizer_models.pickle"  # likewise


def _import_beam():
  try:
    import apache_beam as beam  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise cache.CacheError("Apache Beam is not installed: `pip install 'st5_jax[beam]'` (or drop --runner to "
                           "write the cache in memory).") from e
  return beam


# ----------------------------------------------------------------------------- reading by reference


@dataclasses.dataclass(frozen=True)
class ReaderSpec:
  """What a worker needs to read any file of the split (no file list): its RowReader's settings."""
  row_format: RowFormat
  strict: bool
  name: str

  @classmethod
  def of(cls, reader: RowReader) -> "ReaderSpec":
    return cls(reader.row_format, reader.strict, reader.name)

  def splittable(self, path: str) -> bool:
    return self.row_format.format in _SPLITTABLE and not path.lower().endswith(_COMPRESSED)


def read_units(reader: sources_lib.SplitReader, sizes: Sequence[int] | None = None,
               split_bytes: int = SPLIT_BYTES) -> list[tuple]:
  """The pipeline's input: (unit key, kind, payload, byte range or None) per read unit.

  A file is ((file index, 0), 'file', path, None); a splittable file over `split_bytes` (`sizes`: the files'
  bytes) is one ((file index, start), 'range', path, (start, end)) per range; a built split is
  ((chunk, 0), 'memory', examples, None) per chunk. Unit keys order the units as the source.
  """
  if isinstance(reader, sources_lib.FileSplit):
    spec = ReaderSpec.of(reader.reader)
    units = []
    for k, path in enumerate(reader.files):
      total = sizes[k] if sizes is not None and spec.splittable(path) else 0
      if total <= split_bytes:
        units.append(((k, 0), "file", path, None))
      else:
        units += [((k, start), "range", path, (start, min(start + split_bytes, total)))
                  for start in range(0, total, split_bytes)]
    return units
  if isinstance(reader, sources_lib.MemorySplit):
    examples = list(reader.iter_examples())
    return [((k, 0), "memory", examples[s:s + _MEMORY_CHUNK], None)
            for k, s in enumerate(range(0, max(len(examples), 1), _MEMORY_CHUNK))]
  raise cache.CacheError(f"The Beam cache reads files and built splits, not {type(reader).__name__}.")


def iter_range_lines(path: str, start: int, end: int) -> Iterator[tuple[int, bytes]]:
  """(byte offset, raw line) of every line that starts in [start, end) of a file.

  A line belongs to the range where it starts: one straddling `end` is read whole here, and the next range
  skips past it (it starts at the first line whose previous byte, start - 1, is a line end).
  """
  with paths.open_file(path, "rb") as f:
    offset = 0
    if start > 0:
      f.seek(start - 1)
      offset = start - 1 + len(f.readline())  # the rest of the line holding byte start - 1
    while offset < end:
      raw = f.readline()
      if not raw:
        return
      yield offset, raw
      offset += len(raw)


def _jsonl_record(text: str) -> dict | str:
  """A JSON-lines row, or the reason it is bad (the words of rows.iter_jsonl_records)."""
  if not text.strip():
    return "blank line"
  try:
    value = json.loads(text)
  except json.JSONDecodeError as e:
    return f"invalid JSON ({e.msg} at column {e.colno})"
  return value if isinstance(value, dict) else "not a JSON object"


class _RangeReader(RowReader):
  """The RowReader of one file's byte range: rows are numbered by byte offset + 1, bad rows located by byte."""

  def _bad(self, stats, where, reason, kind=None):
    path, _, number = where.rpartition(":")
    super()._bad(stats, f"{path} at byte {int(number) - 1}", reason, kind)

  def prime(self, path: str) -> None:
    """What the reader learns from the file's first rows: its header, or (TSV without one) its field count."""
    fmt = self.row_format
    if fmt.has_header:
      with contextlib.closing(self._records(path)) as records:  # pylint: disable=protected-access
        next(records, None)  # reads the header (or refuses it, as a whole-file read does)
    elif fmt.format == "tsv" and fmt.num_fields is None:
      with contextlib.closing(rows_lib.iter_tsv_records(path)) as records:
        for _, record in records:
          if not isinstance(record, str):
            self._first_num_fields = len(record)  # pylint: disable=attribute-defined-outside-init
            break

  def range_records(self, path: str, start: int, end: int) -> Iterator[tuple[int, Any]]:
    fmt = self.row_format
    for offset, raw in iter_range_lines(path, start, end):
      if offset == 0 and fmt.has_header:
        continue
      try:
        text = rows_lib._decode_line(raw, offset == 0)  # pylint: disable=protected-access
      except UnicodeDecodeError as e:
        yield offset + 1, f"undecodable bytes (not UTF-8) at byte {e.start}"
        continue
      yield offset + 1, text.split("\t") if fmt.format == "tsv" else _jsonl_record(text)


def read_unit(unit: tuple, spec: ReaderSpec | None) -> Iterator[tuple[str, Any]]:
  """('row', ((unit key, n), example)) for each example of a unit, then ('stats', RowStats dict + unit, examples).

  A file is read by a RowReader rebuilt from `spec` (never listing files: the path is read as it is)."""
  key, kind, payload, byte_range = unit
  stats = RowStats()
  if kind == "memory":
    examples = iter(payload)
  elif kind == "file":
    reader = RowReader(payload, spec.row_format, strict=spec.strict, name=spec.name)
    examples = (reader._to_example(payload, line, record, stats)  # pylint: disable=protected-access
                for line, record in reader._records(payload))  # pylint: disable=protected-access
  else:
    reader = _RangeReader(payload, spec.row_format, strict=spec.strict, name=spec.name)
    reader.prime(payload)
    examples = (reader._to_example(payload, line, record, stats)  # pylint: disable=protected-access
                for line, record in reader.range_records(payload, *byte_range))
  n = 0
  for ex in examples:
    if ex is None:
      continue
    yield "row", ((key, n), ex)
    n += 1
  yield "stats", {**stats.as_dict(), "unit": key, "examples": n}


# ----------------------------------------------------------------------------- writing a shard


def write_shard(index: int, values: Iterable[Any], *, out_dir: str, num_shards: int, dedup: bool,
                names: Sequence[str], specs: Sequence[tuple] = (),
                decode: Callable[[str, list[int]], str] | None = None) -> dict[str, Any]:
  """Dedups one shard's records (smallest source position kept), writes the shard, returns its entry + counts and
  its first `DROPPED_SAMPLES` dropped duplicates as (position, texts) (texts decoded when `decode` is given)."""
  items = sorted(v for v in values if v is not None)  # (key, position, record, long)
  kept, dropped = [], []
  for item in items:
    if dedup and kept and kept[-1][0] == item[0]:
      dropped.append(item)
      continue
    kept.append(item)
  counts = cache_writer._Counts()  # pylint: disable=protected-access
  cache_writer.count_trimmed(counts, names, [item[3] for item in kept])
  data = cache_writer.encode_shard((key, record) for key, _, record, _ in kept)
  paths.write_bytes(paths.join(out_dir, cache.shard_name(index, num_shards)), data)
  first = heapq.nsmallest(cache_writer.DROPPED_SAMPLES, dropped, key=lambda item: item[1]) if decode else []
  return {"entry": cache_writer.shard_entry(index, num_shards, data, len(kept)), "dropped_duplicates": len(dropped),
          "trimmed": counts.trimmed, "trimmed_by_feature": counts.trimmed_by_feature,
          "dropped_sample": [(item[1], cache_writer.record_texts(item[2], specs, decode)) for item in first]}


# ----------------------------------------------------------------------------- the pipeline


@dataclasses.dataclass
class CachePlan:
  """Everything the pipeline needs, resolved on the launching machine (`plan_cache`)."""
  provider: Any
  layout: Any
  split: str
  out_dir: str
  shards: cache_writer.ShardPlan
  dedup: bool
  units: list
  spec: ReaderSpec | None
  split_bytes: int
  build_stats: dict
  specs: list
  models: dict
  index: dict | None
  missing: tuple
  prompts: dict = dataclasses.field(default_factory=dict)  # {feature: text} prepended before tokenising

  @property
  def num_shards(self) -> int:
    return self.shards.num_shards

  @property
  def names(self) -> list[str]:
    return [name for name, *_ in self.specs]

  @property
  def index_file(self) -> str | None:
    return paths.join(self.out_dir, _INDEX_FILE) if self.index is not None else None

  @property
  def models_file(self) -> str:
    return paths.join(self.out_dir, _MODELS_FILE)


def plan_cache(task: str, split: str, out_dir: str, num_shards: int | None, feature_lengths: Mapping[str, int], *,
               dedup: bool = True, decontaminate: bool = True, sizing: cache_writer.ShardSizing | None = None,
               split_bytes: int = SPLIT_BYTES, prompts: Any = None) -> CachePlan:
  """Resolves the task (and its prompts), its input, the shard count (refusing shards too big for a worker) and
  the side files."""
  provider, layout = cache_writer.resolve_task(task, split, feature_lengths, prompts)
  if num_shards is not None and num_shards < 1:
    raise cache.CacheError(f"num_shards must be at least 1, got {num_shards}.")
  if split_bytes < 1:
    raise cache.CacheError(f"split_bytes must be at least 1, got {split_bytes}.")
  if not streams.uses_numpy_path(provider, layout):
    raise cache.CacheError(
        f"Task {task} is not read by the NumPy path (its own source or preprocessors), which the Beam cache "
        "reproduces; write its cache in memory (drop --runner) or with seqio's cache_tasks_main.")
  if not paths.is_remote(out_dir):
    out_dir = os.path.abspath(out_dir)
  reader = provider.source.open(split)
  sizes = cache_writer.file_sizes(reader.files) if isinstance(reader, sources_lib.FileSplit) else None
  units = read_units(reader, sizes, split_bytes)
  specs = cache_writer.token_specs(provider, layout)
  rows = cache_writer.input_rows(reader, sizes)
  if rows is None:
    raise cache.CacheError(f"The rows of {task} ({split}) are not known before reading it; pass --num_shards.")
  shards = cache_writer.plan_shards(rows, specs, num_shards=num_shards, sizing=sizing or cache_writer.ShardSizing())
  cache_writer.check_shard_memory(shards)
  cache_writer.warn_given_shards(shards)
  index, missing = cache_writer.contamination_index(decontaminate)
  models = {f.task_key: provider.output_features[f.task_key].vocabulary.sp_model for f in layout.features}
  spec = ReaderSpec.of(reader.reader) if isinstance(reader, sources_lib.FileSplit) else None
  return CachePlan(provider=provider, layout=layout, split=split, out_dir=out_dir, shards=shards, dedup=dedup,
                   units=units, spec=spec, split_bytes=split_bytes, build_stats=dict(reader.build_stats),
                   specs=specs, models=models, index=index, missing=missing,
                   prompts=prompts_lib.task_prompts(provider))


def _load(path: str | None):
  return pickle.loads(paths.read_bytes(path)) if path else None


class _Tokenizers:
  """SentencePiece processors of the features, from the models file (once per worker)."""

  def __init__(self, models_file: str):
    import sentencepiece as spm  # pylint: disable=g-import-not-at-top
    self.sp = {name: spm.SentencePieceProcessor(model_proto=m) for name, m in _load(models_file).items()}

  def encode(self, name: str, texts: list[str]) -> list[list[int]]:
    return self.sp[name].encode(texts, out_type=int)

  def decode(self, name: str, ids: list[int]) -> str:
    return self.sp[name].decode(ids)


def build_pipeline(p, plan: CachePlan) -> None:
  """Adds the cache's transforms to pipeline `p` (nothing runs until p.run())."""
  beam = _import_beam()
  from apache_beam.metrics import Metrics  # pylint: disable=g-import-not-at-top

  out_dir, num_shards, dedup, names, specs = plan.out_dir, plan.num_shards, plan.dedup, plan.names, plan.specs
  prompts = dict(plan.prompts)
  index_file, models_file = plan.index_file, plan.models_file

  def counter(name):
    return Metrics.counter(METRICS_NAMESPACE, name)

  class Read(beam.DoFn):
    def __init__(self, spec):
      self._spec = spec  # pickled once in the graph: the row format, no file list

    def setup(self):
      self._counters = {n: counter(n) for n in ("rows_in", "rows_read", "rows_skipped", "rows_filtered")}

    def process(self, unit):
      for tag, value in read_unit(unit, self._spec):
        if tag == "row":
          self._counters["rows_in"].inc()
          yield value
        else:
          for name in ("rows_read", "rows_skipped", "rows_filtered"):
            self._counters[name].inc(value[name])
          yield beam.pvalue.TaggedOutput("stats", value)

  class Decontaminate(beam.DoFn):
    def setup(self):  # once per worker, not per bundle as a side input would be (~50 s per 20k rows here)
      self._index = _load(index_file)
      self._contaminated, self._filtered = counter("dropped_contaminated"), counter("rows_filtered")

    def process(self, row):
      texts = [row[1][n] for n in names]
      hit = overlap.first_hit(self._index, texts) if self._index else None
      if hit is None:
        yield row
      else:
        self._contaminated.inc()
        self._filtered.inc()  # the manifest counts it with the reader's filters too (source_rows_filtered)
        reason = f"{cache_writer._CONTAMINATED_PREFIX} {hit}"  # pylint: disable=protected-access
        yield beam.pvalue.TaggedOutput("contaminated", (reason, (row[0], texts)))

  class Tokenize(beam.DoFn):
    def setup(self):
      self._tokenizers = _Tokenizers(models_file)

    def process(self, rows):
      data, long = cache_writer.tokenize_block([ex for _, ex in rows], specs, self._tokenizers.encode, prompts)
      for (position, ex), record, flags in zip(rows, data, long):
        key = cache_writer.dedup_key([ex[n] for n in names])
        yield cache_writer.shard_of(key, num_shards), (key, position, record, tuple(flags))

  class WriteShards(beam.DoFn):
    def setup(self):
      self._tokenizers = _Tokenizers(models_file) if dedup else None
      self._counters = {n: counter(n) for n in ("examples", "dropped_duplicates", "trimmed")}

    def process(self, kv):
      summary = write_shard(kv[0], kv[1], out_dir=out_dir, num_shards=num_shards, dedup=dedup, names=names,
                            specs=specs, decode=self._tokenizers.decode if dedup else None)
      self._counters["examples"].inc(summary["entry"]["examples"])
      self._counters["dropped_duplicates"].inc(summary["dropped_duplicates"])
      self._counters["trimmed"].inc(summary["trimmed"])
      for position, texts in summary.pop("dropped_sample"):
        yield beam.pvalue.TaggedOutput("dropped", (cache_writer.DUPLICATE, (position, texts)))
      yield summary

  # What the manifest needs of the task, resolved here: the task itself (its vocabulary) stays out of the graph.
  task_name, split, build_stats, missing = plan.provider.name, plan.split, plan.build_stats, plan.missing
  features = cache_writer.feature_specs(plan.provider, plan.layout)
  vocabulary_sha256 = cache.vocabulary_sha256(plan.provider, plan.layout)
  decontaminated = cache_writer.decontaminated_flag(plan.provider, plan.index is not None)

  def manifest_of(_, shards, unit_stats, contaminated, samples):
    read = RowStats()
    examples_in = 0
    for s in sorted(unit_stats, key=lambda s: s["unit"]):
      examples_in += s["examples"]
      part = RowStats(rows_read=s["rows_read"], rows_skipped=s["rows_skipped"], rows_filtered=s["rows_filtered"],
                      skipped_by_reason=collections.Counter(s["skipped_by_reason"]),
                      filtered_by_reason=collections.Counter(s["filtered_by_reason"]),
                      first_skipped=list(s["first_skipped"]))
      read.merge(part)
    for reason, n in contaminated:
      read.rows_filtered += n
      read.filtered_by_reason[reason] += n
    counts = cache_writer._Counts(examples_in=examples_in)  # pylint: disable=protected-access
    shards = sorted(shards, key=lambda s: s["entry"]["file"])
    for s in shards:
      counts.dropped_duplicates += s["dropped_duplicates"]
      counts.trimmed += s["trimmed"]
      for k, v in s["trimmed_by_feature"].items():
        counts.trimmed_by_feature[k] = counts.trimmed_by_feature.get(k, 0) + v
    entries = [s["entry"] for s in shards]
    if not sum(e["examples"] for e in entries):
      counts.trimmed_by_feature = {}  # as the in-memory writer: nothing tokenised, no per-feature counts
    dropped = cache_writer.DroppedSamples()
    for reason, first in samples:
      for _, texts in sorted(first):
        dropped.add(reason, texts)
    manifest = cache_writer.make_manifest(
        task=task_name, split=split, features=features, vocabulary_sha256=vocabulary_sha256, shards=entries,
        stats=cache_writer.cache_stats(build_stats, read.as_dict(), counts, entries, True, dropped), pipeline="beam",
        dedup=dedup, decontaminated=decontaminated, missing_evaluation_sets=missing, prompts=prompts)
    paths.write_bytes(paths.join(out_dir, cache.MANIFEST), cache_writer.manifest_bytes(manifest))

  units = p | "Units" >> beam.Create(plan.units, reshuffle=False) | "Spread" >> beam.Reshuffle()
  read = units | "Read" >> beam.ParDo(Read(plan.spec)).with_outputs("stats", main="rows")
  clean = read.rows | "Decontaminate" >> beam.ParDo(Decontaminate()).with_outputs("contaminated", main="rows")
  empty = p | "EveryShard" >> beam.Create([(i, None) for i in range(num_shards)])
  keyed = (clean.rows | "Batch" >> beam.BatchElements(min_batch_size=_TOKENIZE_BATCH, max_batch_size=_TOKENIZE_BATCH)
           | "Tokenize" >> beam.ParDo(Tokenize()))
  shards = ((keyed, empty) | "WithEmpty" >> beam.Flatten() | "ByShard" >> beam.GroupByKey()
            | "WriteShards" >> beam.ParDo(WriteShards()).with_outputs("dropped", main="shards"))
  contaminated = (clean.contaminated | "ContaminatedReason" >> beam.Map(lambda kv: kv[0])
                  | "CountContaminated" >> beam.combiners.Count.PerElement())
  samples = ((clean.contaminated, shards.dropped) | "Dropped" >> beam.Flatten()
             | "FirstDropped" >> beam.combiners.Top.SmallestPerKey(cache_writer.DROPPED_SAMPLES))
  _ = (p | "Once" >> beam.Create([None])
       | "Manifest" >> beam.Map(manifest_of, shards=beam.pvalue.AsList(shards.shards),
                                unit_stats=beam.pvalue.AsList(read.stats),
                                contaminated=beam.pvalue.AsList(contaminated), samples=beam.pvalue.AsList(samples)))


def pipeline_payload(plan: CachePlan) -> dict[str, int]:
  """The job graph's size for `plan`, nothing run: the pipeline proto's bytes (what a runner is sent, the input
  units included) and the read units' bytes, pickled one by one."""
  beam = _import_beam()
  from apache_beam.options.pipeline_options import PipelineOptions  # pylint: disable=g-import-not-at-top
  p = beam.Pipeline(options=PipelineOptions(["--runner=DirectRunner"]))
  build_pipeline(p, plan)
  return {"pipeline_proto_bytes": len(p.to_runner_api().SerializeToString()),
          "element_bytes": sum(len(pickle.dumps(unit, protocol=5)) for unit in plan.units)}


def counters(result) -> dict[str, int]:
  """The pipeline's counters (namespace METRICS_NAMESPACE) from a run's result: {name: committed value}."""
  from apache_beam.metrics.metric import MetricsFilter  # pylint: disable=g-import-not-at-top
  out: dict[str, int] = {}
  for c in result.metrics().query(MetricsFilter().with_namespace(METRICS_NAMESPACE))["counters"]:
    out[c.key.metric.name] = out.get(c.key.metric.name, 0) + int(c.committed or 0)
  return dict(sorted(out.items()))


def _clear(out_dir: str, num_shards: int) -> None:
  """Removes an old manifest first (a half-written cache is then never read as the old one), then old shards."""
  manifest = paths.join(out_dir, cache.MANIFEST)
  if paths.exists(manifest):
    paths.path(manifest).unlink()
  for old in paths.glob(paths.join(out_dir, "shard-*-of-*.tfrecord")):
    if not old.endswith(f"-of-{num_shards:05d}.tfrecord"):  # same names are overwritten
      paths.path(old).unlink()


@contextlib.contextmanager
def side_files(plan: CachePlan) -> Iterator[None]:
  """Clears the output folder and writes the files workers read once (evaluation index, tokenizer models);
  removes those at the end."""
  _clear(plan.out_dir, plan.num_shards)
  paths.mkdir(plan.out_dir)
  # The evaluation texts' index (~10^5 strings, ~10 MB) and the models (~1 MB) travel as files, not in the graph.
  written = [plan.models_file]
  paths.write_bytes(plan.models_file, pickle.dumps(plan.models, protocol=5))
  if plan.index_file:
    paths.write_bytes(plan.index_file, pickle.dumps(plan.index, protocol=5))
    written.append(plan.index_file)
  try:
    yield
  finally:
    for path in written:
      if paths.exists(path):
        paths.path(path).unlink()


def write_cache_beam(task: str, split: str, out_dir: str, num_shards: int | None, feature_lengths: Mapping[str, int],
                     *, dedup: bool = True, decontaminate: bool = True,
                     pipeline_args: Sequence[str] = ("--runner=DirectRunner",),
                     sizing: cache_writer.ShardSizing | None = None, split_bytes: int = SPLIT_BYTES,
                     progress: Callable[[str], None] | None = None, prompts: Any = None) -> dict[str, Any]:
  """Writes the cache of one task split with a Beam pipeline (options: Beam's flags); returns the manifest.

  `num_shards` None: derived from the input rows and `sizing`, as the in-memory writer does; a shard too big for
  `sizing.worker_memory_gb` is refused before anything is written (cache_writer.check_shard_memory).
  `prompts`: as cache_writer.write_cache's.
  """
  beam = _import_beam()
  from apache_beam.options.pipeline_options import PipelineOptions  # pylint: disable=g-import-not-at-top

  plan = plan_cache(task, split, out_dir, num_shards, feature_lengths, dedup=dedup, decontaminate=decontaminate,
                    sizing=sizing, split_bytes=split_bytes, prompts=prompts)
  if progress:
    progress(f"{plan.provider.name} ({split}): {plan.shards.describe()}")
  start = time.perf_counter()
  with side_files(plan):
    p = beam.Pipeline(options=PipelineOptions(list(pipeline_args)))
    build_pipeline(p, plan)
    result = p.run()
    result.wait_until_finish()
  manifest = cache.CacheReader(plan.out_dir).manifest
  log.info("Beam cache of %s (%s): %d examples in %d shards, %.1f s; counters %s", task, split,
           manifest["num_examples"], plan.num_shards, time.perf_counter() - start, counters(result))
  return manifest
