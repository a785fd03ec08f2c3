"""The token cache written by an Apache Beam pipeline: the same files as `cache_writer.write_cache`, at any size.

The in-memory writer holds a task split in one process; this pipeline spreads the same
pure steps (st5_jax.data.offline.cache_writer) over Beam workers, so the DirectRunner here and Cloud
Dataflow there write byte-identical shards and the same manifest:

    read units ──► rows ──► decontaminate ──► tokenise ──► by shard ──► dedup + write shard ──► manifest
    (one per file;   (source    (the evaluation   (batches;     (one GroupByKey:  (first in source order
     public tasks:    filters,   texts' index,     trimmed        a duplicate's     kept; records sorted
     chunks of the    bad rows   read once per     flags kept)    key picks its     by key)
     built split)     counted)   worker)                          shard)

Dedup needs no shuffle of its own: the shard is a function of the dedup key, so all
copies of a text meet in one shard's group, where the one with the smallest source
position (file index, row in file) is kept -- the in-memory writer's "first in source
order". Decontamination is a broadcast join: the evaluation texts are ~1.5 x 10^5 strings
and the corpus up to 10^9 rows, so every worker loads the texts' index once (a file beside
the output, removed at the end) rather than the corpus being shuffled a second time. (A
Beam side input was tried: it is decoded per bundle, 50 s per 20,000 rows here.)

Only tasks read by the NumPy path (this project's sources and users' TSV/CSV/JSON lines/
TFRecord files with the standard preprocessors) run here; their rows are read by the
same RowReader, so bad rows, filters and their counts are the same. Each file is read by
one worker: split a big corpus into many files (hundreds per billion rows).
"""

from __future__ import annotations

import collections
import logging
import pickle
import time
from typing import Any, Iterable, Iterator, Mapping, Sequence

from st5_jax import paths
from st5_jax.data import cache, overlap, sources as sources_lib, streams
from st5_jax.data.offline import cache_writer
from st5_jax.data.rows import RowStats

log = logging.getLogger("st5_jax.data")

_MEMORY_CHUNK = 4096  # examples per read unit of a split built in memory (public tasks)
_TOKENIZE_BATCH = 512
_INDEX_FILE = "_evaluation_index.pickle"  # removed when the pipeline is done


def _import_beam():
  try:
    import apache_beam as beam  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise cache.CacheError("Apache Beam is not installed: `pip install 'st5_jax[beam]'` (or drop --runner to "
                           "write the cache in memory).") from e
  return beam


# ----------------------------------------------------------------------------- the steps (plain functions)


def read_unit(unit: tuple[int, Any]) -> Iterator[tuple[str, Any]]:
  """('row', ((unit, row), example)) for each example of a unit, then ('stats', RowStats dict + 'examples')."""
  index, payload = unit
  stats = RowStats()
  n = 0
  if payload[0] == "memory":
    examples = payload[1]
  else:
    _, reader, file_index = payload
    examples = reader.iter_examples(shard_index=file_index, num_shards=len(reader.files()), stats=stats)
  for ex in examples:
    yield "row", ((index, n), ex)
    n += 1
  yield "stats", {**stats.as_dict(), "unit": index, "examples": n}


def write_shard(index: int, values: Iterable[Any], *, out_dir: str, num_shards: int, dedup: bool,
                names: Sequence[str]) -> dict[str, Any]:
  """Dedups one shard's records (smallest source position kept), writes the shard, returns its entry + counts."""
  items = sorted(v for v in values if v is not None)  # (key, position, record, long)
  kept, dropped = [], 0
  for item in items:
    if dedup and kept and kept[-1][0] == item[0]:
      dropped += 1
      continue
    kept.append(item)
  counts = cache_writer._Counts()  # pylint: disable=protected-access
  cache_writer.count_trimmed(counts, names, [item[3] for item in kept])
  data = cache_writer.encode_shard((key, record) for key, _, record, _ in kept)
  paths.write_bytes(paths.join(out_dir, cache.shard_name(index, num_shards)), data)
  return {"entry": cache_writer.shard_entry(index, num_shards, data, len(kept)), "dropped_duplicates": dropped,
          "trimmed": counts.trimmed, "trimmed_by_feature": counts.trimmed_by_feature}


# ----------------------------------------------------------------------------- the pipeline


def _units(reader: sources_lib.SplitReader) -> list[tuple[int, Any]]:
  if isinstance(reader, sources_lib.FileSplit):
    files = reader.reader.files()
    return [(k, ("file", reader.reader, k)) for k in range(len(files))]
  if isinstance(reader, sources_lib.MemorySplit):
    examples = list(reader.iter_examples())
    return [(k, ("memory", examples[s:s + _MEMORY_CHUNK]))
            for k, s in enumerate(range(0, max(len(examples), 1), _MEMORY_CHUNK))]
  raise cache.CacheError(f"The Beam cache reads files and built splits, not {type(reader).__name__}.")


def _clear(out_dir: str, num_shards: int) -> None:
  """Removes an old manifest first (a half-written cache is then never read as the old one), then old shards."""
  manifest = paths.join(out_dir, cache.MANIFEST)
  if paths.exists(manifest):
    paths.path(manifest).unlink()
  for old in paths.glob(paths.join(out_dir, "shard-*-of-*.tfrecord")):
    if not old.endswith(f"-of-{num_shards:05d}.tfrecord"):  # same names are overwritten
      paths.path(old).unlink()


def write_cache_beam(task: str, split: str, out_dir: str, num_shards: int, feature_lengths: Mapping[str, int], *,
                     dedup: bool = True, decontaminate: bool = True,
                     pipeline_args: Sequence[str] = ("--runner=DirectRunner",)) -> dict[str, Any]:
  """Writes the cache of one task split with a Beam pipeline (options: Beam's flags); returns the manifest."""
  beam = _import_beam()
  from apache_beam.options.pipeline_options import PipelineOptions  # pylint: disable=g-import-not-at-top
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top

  provider, layout = cache_writer.resolve_task(task, split, feature_lengths)
  if num_shards < 1:
    raise cache.CacheError(f"num_shards must be at least 1, got {num_shards}.")
  if not streams.uses_numpy_path(provider, layout):
    raise cache.CacheError(
        f"Task {task} is not read by the NumPy path (its own source or preprocessors), which the Beam cache "
        "reproduces; write its cache in memory (drop --runner) or with seqio's cache_tasks_main.")
  if not paths.is_remote(out_dir):
    import os  # pylint: disable=g-import-not-at-top
    out_dir = os.path.abspath(out_dir)
  reader = provider.source.open(split)
  build_stats = dict(reader.build_stats)
  specs = cache_writer.token_specs(provider, layout)
  names = [name for name, *_ in specs]
  models = {f.task_key: provider.output_features[f.task_key].vocabulary.sp_model for f in layout.features}
  index, missing = cache_writer.contamination_index(decontaminate)
  units = _units(reader)
  _clear(out_dir, num_shards)
  paths.mkdir(out_dir)
  # The evaluation texts' index (~10^5 strings, ~10 MB) travels as a file every worker reads once.
  index_file = paths.join(out_dir, _INDEX_FILE) if index is not None else None
  if index_file:
    paths.write_bytes(index_file, pickle.dumps(index, protocol=5))

  class Read(beam.DoFn):
    def process(self, unit):
      for tag, value in read_unit(unit):
        yield value if tag == "row" else beam.pvalue.TaggedOutput("stats", value)

  class Decontaminate(beam.DoFn):
    def setup(self):  # once per worker, not per bundle as a side input would be (~50 s per 20k rows here)
      self._index = pickle.loads(paths.read_bytes(index_file)) if index_file else None

    def process(self, row):
      hit = overlap.first_hit(self._index, [row[1][n] for n in names]) if self._index else None
      if hit is None:
        yield row
      else:
        yield beam.pvalue.TaggedOutput("contaminated", hit)

  class Tokenize(beam.DoFn):
    def setup(self):
      self._sp = {n: spm.SentencePieceProcessor(model_proto=m) for n, m in models.items()}

    def process(self, rows):
      data, long = cache_writer.tokenize_block([ex for _, ex in rows], specs,
                                        lambda n, texts: self._sp[n].encode(texts, out_type=int))
      for (position, ex), record, flags in zip(rows, data, long):
        key = cache_writer.dedup_key([ex[n] for n in names])
        yield cache_writer.shard_of(key, num_shards), (key, position, record, tuple(flags))

  def manifest_of(_, shards, unit_stats, contaminated):
    read = RowStats()
    examples_in = 0
    for s in sorted(unit_stats, key=lambda s: s["unit"]):
      examples_in += s["examples"]
      part = RowStats(rows_read=s["rows_read"], rows_skipped=s["rows_skipped"], rows_filtered=s["rows_filtered"],
                      skipped_by_reason=collections.Counter(s["skipped_by_reason"]),
                      filtered_by_reason=collections.Counter(s["filtered_by_reason"]),
                      first_skipped=list(s["first_skipped"]))
      read.merge(part)
    for name, n in collections.Counter(contaminated).items():
      read.rows_filtered += n
      read.filtered_by_reason[f"{cache_writer._CONTAMINATED_PREFIX} {name}"] += n  # pylint: disable=protected-access
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
    manifest = cache_writer.make_manifest(
        task=provider.name, split=split, features=cache_writer.feature_specs(provider, layout),
        vocabulary_sha256=cache.vocabulary_sha256(provider, layout), shards=entries,
        stats=cache_writer.cache_stats(build_stats, read.as_dict(), counts, entries, True), pipeline="beam",
        dedup=dedup, decontaminated=cache_writer.decontaminated_flag(provider, index is not None),
        missing_evaluation_sets=missing)
    paths.write_bytes(paths.join(out_dir, cache.MANIFEST), cache_writer.manifest_bytes(manifest))
    return manifest

  start = time.perf_counter()
  options = PipelineOptions(list(pipeline_args))
  with beam.Pipeline(options=options) as p:
    read = (p | "Units" >> beam.Create(units, reshuffle=False) | "Spread" >> beam.Reshuffle()
            | "Read" >> beam.ParDo(Read()).with_outputs("stats", main="rows"))
    clean = read.rows | "Decontaminate" >> beam.ParDo(Decontaminate()).with_outputs(
        "contaminated", main="rows")
    empty = p | "EveryShard" >> beam.Create([(i, None) for i in range(num_shards)])
    keyed = (clean.rows | "Batch" >> beam.BatchElements(min_batch_size=_TOKENIZE_BATCH,
                                                         max_batch_size=_TOKENIZE_BATCH)
             | "Tokenize" >> beam.ParDo(Tokenize()))
    shards = ((keyed, empty) | "WithEmpty" >> beam.Flatten() | "ByShard" >> beam.GroupByKey()
              | "WriteShards" >> beam.Map(lambda kv: write_shard(kv[0], kv[1], out_dir=out_dir,
                                                                 num_shards=num_shards, dedup=dedup, names=names)))
    _ = (p | "Once" >> beam.Create([None])
         | "Manifest" >> beam.Map(manifest_of, shards=beam.pvalue.AsList(shards),
                                  unit_stats=beam.pvalue.AsList(read.stats),
                                  contaminated=beam.pvalue.AsList(clean.contaminated)))
  if index_file:
    paths.path(index_file).unlink()
  manifest = cache.CacheReader(out_dir).manifest
  log.info("Beam cache of %s (%s): %d examples in %d shards, %.1f s", task, split, manifest["num_examples"],
           num_shards, time.perf_counter() - start)
  return manifest
