"""`st5 data cache`: the token cache of one task split written in memory (the format: st5_jax.data.cache).

What a writer does is split into pure steps, so that the distributed writer (the Apache
Beam pipeline of st5_jax.data.offline.beam_cache) produces byte-identical files:

1. `dedup_key(texts)` -- blake2b-128 of the features' normalised texts
   (st5_jax.data.overlap.normalize); of examples with the same key the first in the
   source's order is kept (a Beam pipeline keeps the smallest source position).
2. `encode_example(...)` -- the record bytes (protobuf's deterministic serialisation).
3. `shard_of(key, num_shards)` -- the key's first 8 bytes, big-endian, mod num_shards.
4. `encode_shard(records)` -- the records of one shard sorted by (key, bytes), framed
   as TFRecord (length, masked CRC32C of the length, data, masked CRC32C of the data).
5. `make_manifest(...)` -- JSON with sorted keys and no timestamps.

`write_cache` runs them in memory over the task's existing path: for this project's
sources the same rows, filters and decontamination as the NumPy path (and the same
tokens: convert.encode_block's rule), and then drops examples with a text in any
evaluation set (`decontaminate`, default on: users' tasks too; counted by set); for any
other seqio task its own pipeline (seqio.get_dataset, unshuffled). Training reads the
result with st5_jax.data.cache's CacheReader and never imports this module.

Shard count (`plan_shards`): given, or derived from the split's input rows (counted before
writing: `input_rows`) and a target of records per shard, rounded up to a multiple of the
readers; both writers derive the same number. `check_shard_memory` refuses a plan whose
shards would not fit a Beam worker. The manifest keeps counts of what was dropped and the
first `DROPPED_SAMPLES` texts per reason (`DroppedSamples`), never every one.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import json
import logging
import os
import shutil
import struct
import tempfile
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np
import seqio

from st5_jax import paths
from st5_jax.data import convert, feature_converters, overlap, streams
from st5_jax.data import prompts as prompts_lib
from st5_jax.data import sources as sources_lib
from st5_jax.data.cache import FORMAT, FORMAT_VERSION, MANIFEST, CacheError, shard_name, vocabulary_sha256
from st5_jax.data.rows import RowStats, _masked_crc

log = logging.getLogger("st5_jax.data")

_CONTAMINATED_PREFIX = "text in evaluation set"
DUPLICATE = "duplicate"  # the reason of a dropped duplicate in the manifest's samples
DROPPED_SAMPLES = 100  # texts kept in the manifest per reason for dropping (the first in source order)
_BLOCK = 1024


# ----------------------------------------------------------------------------- pure steps


def dedup_key(texts: Sequence[str]) -> bytes:
  """16 bytes identifying an example by its features' normalised texts (NFKC, lower case, alphanumerics)."""
  h = hashlib.blake2b(digest_size=16)
  for t in texts:
    h.update(overlap.normalize(t).encode("utf-8"))
    h.update(b"\x1f")
  return h.digest()


def shard_of(key: bytes, num_shards: int) -> int:
  return int.from_bytes(key[:8], "big") % num_shards


def encode_example(tokens: Mapping[str, Sequence[int]], scalars: Mapping[str, Any] | None = None) -> bytes:
  """A tf.train.Example: int64 lists of token ids, one-element int64/float lists for scalars."""
  from tensorflow.core.example import example_pb2, feature_pb2  # pylint: disable=g-import-not-at-top
  feats = {k: feature_pb2.Feature(int64_list=feature_pb2.Int64List(value=[int(x) for x in v]))
           for k, v in tokens.items()}
  for k, v in (scalars or {}).items():
    if isinstance(v, (float, np.floating)):
      feats[k] = feature_pb2.Feature(float_list=feature_pb2.FloatList(value=[float(v)]))
    else:
      feats[k] = feature_pb2.Feature(int64_list=feature_pb2.Int64List(value=[int(v)]))
  return example_pb2.Example(features=feature_pb2.Features(feature=feats)).SerializeToString(deterministic=True)


def frame_record(data: bytes) -> bytes:
  length = struct.pack("<Q", len(data))
  return length + struct.pack("<I", _masked_crc(length)) + data + struct.pack("<I", _masked_crc(data))


def encode_shard(records: Iterable[tuple[bytes, bytes]]) -> bytes:
  """The bytes of one shard file from its (key, record) pairs, in any order."""
  return b"".join(frame_record(data) for _, data in sorted(records))


def shard_entry(index: int, num_shards: int, data: bytes, examples: int) -> dict[str, Any]:
  return {"file": shard_name(index, num_shards), "examples": examples, "bytes": len(data),
          "sha256": hashlib.sha256(data).hexdigest()}


def make_manifest(*, task: str, split: str, features: Sequence[Mapping[str, Any]], vocabulary_sha256: str,
                  shards: Sequence[Mapping[str, Any]], stats: Mapping[str, Any], pipeline: str,
                  dedup: bool, decontaminated: bool | None,
                  missing_evaluation_sets: Sequence[str] = (),
                  prompts: Mapping[str, str] | None = None) -> dict[str, Any]:
  """The manifest (st5_jax.data.cache's docstring); `prompts` ({feature: text}) only when there are any."""
  extra = {"prompts": dict(sorted(prompts.items()))} if prompts else {}
  return {**extra,
      "format": FORMAT, "format_version": FORMAT_VERSION, "task": task, "split": split,
      "features": [dict(f) for f in features],
      "feature_lengths": {f["name"]: f["length"] for f in features if f["kind"] == "tokens"},
      "vocabulary_sha256": vocabulary_sha256, "pipeline": pipeline,
      "dedup": ("blake2b-128 of the features' texts normalised as st5_jax.data.overlap.normalize; "
                "first in source order kept") if dedup else None,
      "decontaminated": decontaminated,
      "decontamination_missing_sets": sorted(m.split(" (")[0] for m in missing_evaluation_sets),
      "sharding": "shard = first 8 bytes of the dedup key, big-endian, mod num_shards; records sorted by "
                  "(key, record bytes)",
      "num_shards": len(shards), "num_examples": sum(s["examples"] for s in shards),
      "shards": [dict(s) for s in shards], "stats": dict(stats),
  }


def manifest_bytes(manifest: Mapping[str, Any]) -> bytes:
  return (json.dumps(manifest, sort_keys=True, indent=1, ensure_ascii=False) + "\n").encode("utf-8")


# ----------------------------------------------------------------------------- layout


def feature_specs(task: seqio.Task, layout: convert.BatchLayout) -> list[dict[str, Any]]:
  """What a cache stores per feature (task feature names, lengths, EOS)."""
  out = []
  for f in layout.features:
    spec = {"name": f.task_key, "kind": "tokens" if f.is_tokens else "scalar", "dtype": f.dtype,
            "length": f.length, "add_eos": f.add_eos}
    if f.is_tokens:
      spec["eos_id"] = int(task.output_features[f.task_key].vocabulary.eos_id) if f.add_eos else None
    out.append(spec)
  return out


# ----------------------------------------------------------------------------- writing


@dataclasses.dataclass
class _Counts:
  examples_in: int = 0
  dropped_duplicates: int = 0
  trimmed: int = 0
  trimmed_by_feature: dict = dataclasses.field(default_factory=dict)


def token_specs(task: seqio.Task, layout: convert.BatchLayout) -> list[tuple[str, int, bool, int]]:
  """(task feature, kept tokens before EOS, add EOS, EOS id) per token feature: convert.encode_block's rule."""
  out = []
  for f in layout.features:
    vocab = task.output_features[f.task_key].vocabulary
    out.append((f.task_key, f.length - 1 if f.add_eos else f.length, f.add_eos, int(vocab.eos_id)))
  return out


def tokenize_block(examples: Sequence[Mapping[str, str]], specs, encode, prompts: Mapping[str, str] | None = None
                   ) -> tuple[list[bytes], list[tuple[bool, ...]]]:
  """Record bytes of examples and, per example, which features were trimmed.

  `encode(feature, texts)` returns token ids per text (the feature's SentencePiece model); `prompts`
  ({feature: text}, DataConfig.prompts) are prepended first, as convert.TextEncoder does.
  """
  prompts = prompts or {}
  columns, long = {}, []
  for name, keep, add_eos, eos_id in specs:
    ids = encode(name, prompts_lib.apply([ex[name] for ex in examples], prompts.get(name, "")))
    long.append([len(row) > keep for row in ids])
    columns[name] = [row[:keep] + ([eos_id] if add_eos else []) for row in ids]
  records = [encode_example({name: rows[i] for name, rows in columns.items()}) for i in range(len(examples))]
  return records, list(zip(*long)) if long else [() for _ in examples]


class DroppedSamples:
  """The first `limit` examples dropped per reason, in source order, as their feature texts (the manifest's
  `stats.dropped_samples`; the counts are kept apart, so the manifest stays small whatever is dropped)."""

  def __init__(self, limit: int = DROPPED_SAMPLES):
    self.limit = limit
    self.by_reason: dict[str, list[list[str]]] = {}

  def wants(self, reason: str) -> bool:
    return len(self.by_reason.get(reason, ())) < self.limit

  def add(self, reason: str, texts: Sequence[str]) -> None:
    if self.wants(reason):
      self.by_reason.setdefault(reason, []).append(list(texts))

  def as_dict(self) -> dict[str, list[list[str]]]:
    return dict(sorted(self.by_reason.items()))


def record_texts(record: bytes, specs, decode) -> list[str]:
  """A record's token features decoded back to text (EOS dropped; cut to length): how a dropped duplicate is shown.

  `decode(feature, ids)` is the feature's SentencePiece decoder.
  """
  from tensorflow.core.example import example_pb2  # pylint: disable=g-import-not-at-top
  feature = example_pb2.Example.FromString(record).features.feature
  texts = []
  for name, _, add_eos, _ in specs:
    ids = list(feature[name].int64_list.value)
    texts.append(decode(name, ids[:-1] if add_eos and ids else ids))
  return texts


def contamination_index(decontaminate: bool) -> tuple[dict[str, str] | None, tuple[str, ...]]:
  """{normalised evaluation text: first evaluation set holding it} and the sets missing, or (None, ())."""
  if not decontaminate:
    return None, ()
  from st5_jax.data import config  # pylint: disable=g-import-not-at-top
  data_dir = str(config.data_dir())
  return overlap.evaluation_index(data_dir), overlap.missing_evaluation_sets(data_dir)


def _numpy_path_records(task: seqio.Task, reader: sources_lib.SplitReader, layout: convert.BatchLayout, *,
                        dedup: bool, index: dict[str, str] | None, counts: _Counts, stats: RowStats,
                        samples: DroppedSamples) -> tuple[Iterator[tuple[bytes, bytes]], dict]:
  """(key, record) of a project source's examples in source order, tokenised as convert.encode_block."""
  specs = token_specs(task, layout)
  names = [name for name, *_ in specs]
  vocabs = {f.task_key: task.output_features[f.task_key].vocabulary for f in layout.features}
  prompts = prompts_lib.task_prompts(task)

  def encode(name, texts):
    return vocabs[name].tokenizer.encode(texts, out_type=int)

  def decode(name, ids):
    return vocabs[name].tokenizer.decode(ids)

  def records():
    seen: set[bytes] = set()
    block: list[tuple[bytes, dict]] = []

    def flush():
      data, long = tokenize_block([ex for _, ex in block], specs, encode, prompts)
      count_trimmed(counts, names, long)
      for (key, _), record in zip(block, data):
        yield key, record
      block.clear()

    for ex in reader.iter_examples(stats=stats):
      counts.examples_in += 1
      if index is not None:
        hit = overlap.first_hit(index, [ex[n] for n in names])
        if hit is not None:
          reason = f"{_CONTAMINATED_PREFIX} {hit}"
          stats.filter(reason)
          samples.add(reason, [ex[n] for n in names])
          continue
      key = dedup_key([ex[n] for n in names])
      if dedup:
        if key in seen:
          counts.dropped_duplicates += 1
          if samples.wants(DUPLICATE):  # as the Beam writer shows it: the record's tokens decoded
            samples.add(DUPLICATE, record_texts(tokenize_block([ex], specs, encode, prompts)[0][0], specs, decode))
          continue
        seen.add(key)
      block.append((key, ex))
      if len(block) == _BLOCK:
        yield from flush()
    if block:
      yield from flush()

  return records(), dict(reader.build_stats)


def count_trimmed(counts: _Counts, names: Sequence[str], long: Sequence[Sequence[bool]]) -> None:
  for row in long:
    counts.trimmed += int(any(row))
    for name, flag in zip(names, row):
      if flag:
        counts.trimmed_by_feature[name] = counts.trimmed_by_feature.get(name, 0) + 1
  for name in names:  # a feature never trimmed still gets its 0
    counts.trimmed_by_feature.setdefault(name, 0)


def _seqio_path_records(task: seqio.Task, split: str, layout: convert.BatchLayout, *, dedup: bool,
                        counts: _Counts, samples: DroppedSamples) -> Iterator[tuple[bytes, bytes]]:
  """(key, record) of any seqio task's examples, unshuffled, as its pipeline and the converter make them.

  The dedup key is made from the decoded (truncated) token ids; trimming is not known here.
  """
  converter = feature_converters.DualEncoderFeatureConverter(layout=layout)
  ds = seqio.get_dataset(task, task_feature_lengths=layout.task_feature_lengths, feature_converter=converter,
                         dataset_split=split, shuffle=False, num_epochs=1, use_cached=False, verbose=False)
  seen: set[bytes] = set()
  for ex in ds.as_numpy_iterator():
    counts.examples_in += 1
    tokens, scalars, texts = {}, {}, []
    for f in layout.features:
      v = ex[f.model_key]
      if f.is_tokens:
        nz = np.flatnonzero(v)
        ids = v[:nz[-1] + 1].tolist() if len(nz) else []
        tokens[f.task_key] = ids
        vocab = task.output_features[f.task_key].vocabulary
        texts.append(vocab.decode([i for i in ids if i != vocab.eos_id]))
      else:
        scalars[f.task_key] = v.item()
        texts.append(repr(v.item()))
    key = dedup_key(texts)
    if dedup:
      if key in seen:
        counts.dropped_duplicates += 1
        samples.add(DUPLICATE, texts)
        continue
      seen.add(key)
    yield key, encode_example(tokens, scalars)


def build_cache(task: seqio.Task, split: str, layout: convert.BatchLayout, *, num_shards: int | None,
                dedup: bool = True, decontaminate: bool = True, numpy_path: bool = True,
                sizing: ShardSizing | None = None,
                progress: Callable[[str], None] | None = None) -> tuple[list[bytes], dict[str, Any]]:
  """The shard files' bytes and the manifest of a task split (nothing written).

  `num_shards` None: derived from the split's input rows (`plan_shards`, as the Beam writer does).
  """
  sizing = sizing or ShardSizing()
  if num_shards is not None and num_shards < 1:
    raise CacheError(f"num_shards must be at least 1, got {num_shards}.")
  counts = _Counts()
  stats = RowStats()
  samples = DroppedSamples()
  use_numpy = numpy_path and streams.uses_numpy_path(task, layout)
  index, missing = contamination_index(decontaminate) if use_numpy else (None, ())
  if use_numpy:
    reader = task.source.open(split)
    rows = input_rows(reader)
    records, build = _numpy_path_records(task, reader, layout, dedup=dedup, index=index, counts=counts, stats=stats,
                                         samples=samples)
  else:
    rows = None
    records, build = _seqio_path_records(task, split, layout, dedup=dedup, counts=counts, samples=samples), {}
  if rows is None:  # not known before reading (a seqio source): read it first (held in memory anyway), then count
    records = list(records)
    rows = (counts.examples_in, True)
  plan = plan_shards(rows, token_specs(task, layout), num_shards=num_shards, sizing=sizing)
  warn_given_shards(plan)
  if progress:
    progress(f"{task.name} ({split}): {plan.describe()}")
  num_shards = plan.num_shards
  buckets: list[list[tuple[bytes, bytes]]] = [[] for _ in range(num_shards)]
  for key, data in records:
    buckets[shard_of(key, num_shards)].append((key, data))
  shards = [encode_shard(b) for b in buckets]
  entries = [shard_entry(i, num_shards, data, len(b)) for i, (data, b) in enumerate(zip(shards, buckets))]
  manifest = make_manifest(
      task=task.name, split=split, features=feature_specs(task, layout),
      vocabulary_sha256=vocabulary_sha256(task, layout), shards=entries,
      stats=cache_stats(build, stats.as_dict(), counts, entries, use_numpy, samples),
      pipeline="numpy" if use_numpy else "seqio", dedup=dedup,
      decontaminated=decontaminated_flag(task, index is not None), missing_evaluation_sets=missing,
      prompts=prompts_lib.task_prompts(task))
  return shards, manifest


def decontaminated_flag(task: seqio.Task, by_cache: bool) -> bool | None:
  """True when the cache step or the public source dropped evaluation texts; None: not known (seqio path)."""
  if by_cache:
    return True
  if isinstance(task.source, sources_lib.PublicSource):
    from st5_jax.data import config  # pylint: disable=g-import-not-at-top
    return bool(config.options().decontaminate)
  return None


def cache_stats(build: Mapping[str, Any], read: Mapping[str, Any], counts: _Counts,
                entries: Sequence[Mapping[str, Any]], use_numpy: bool, samples: DroppedSamples) -> dict[str, Any]:
  """The manifest's stats from the source's build stats, the rows read (and filtered) and the cache step's counts."""
  filtered = dict(build.get("filtered_by_reason", {}))
  for k, v in read["filtered_by_reason"].items():
    filtered[k] = filtered.get(k, 0) + v
  contaminated = sum(v for k, v in filtered.items() if k.startswith(_CONTAMINATED_PREFIX))
  return {
      "source_rows_read": build.get("rows_read", read["rows_read"]) if use_numpy else None,
      "source_rows_skipped": build.get("rows_skipped", 0) + read["rows_skipped"] if use_numpy else None,
      "source_rows_filtered": build.get("rows_filtered", 0) + read["rows_filtered"] if use_numpy else None,
      "filtered_by_reason": dict(sorted(filtered.items())) if use_numpy else None,
      "rows_in": counts.examples_in,
      "dropped_duplicates": counts.dropped_duplicates,
      "dropped_contaminated": contaminated if use_numpy else None,
      "trimmed": counts.trimmed if use_numpy else None,
      "trimmed_by_feature": dict(sorted(counts.trimmed_by_feature.items())) if use_numpy else None,
      "examples": sum(e["examples"] for e in entries),
      "dropped_samples": samples.as_dict(),
  }


def resolve_task(task: str, split: str, feature_lengths: Mapping[str, int], prompts: Any = None
                 ) -> tuple[seqio.Task, convert.BatchLayout]:
  """The task (not a mixture; with its prompts step when `prompts`, any DataConfig.prompts form for this task)
  and its batch layout, or a CacheError saying why not."""
  provider = streams.get_provider(task)
  if isinstance(provider, seqio.Mixture):
    raise CacheError(f"{task} is a mixture; cache each of its tasks ({', '.join(t.name for t in provider.tasks)}).")
  if split not in provider.splits:
    raise CacheError(f"Task {task} has no split {split!r}; splits: {sorted(provider.splits)}.")
  layout = convert.batch_layout([provider], feature_lengths)
  try:
    resolved = prompts_lib.resolve(prompts, [provider.name], [f.task_key for f in layout.features if f.is_tokens],
                                   where="prompts")
    return prompts_lib.with_prompts(provider, resolved[provider.name]), layout
  except ValueError as e:
    raise CacheError(str(e)) from e


# ----------------------------------------------------------------------------- how many shards

RECORDS_PER_SHARD = 500_000  # 2B pairs -> 4,000 shards; resuming reads at most one shard (docs/data.md)
WORKER_MEMORY_GB = 4.0  # a Dataflow n2-standard-8 worker: 32 GB over its 8 SDK processes
_COUNT_BYTES = 256 << 20  # inputs up to this size are counted; larger ones are estimated from samples
_SAMPLE_FILES = 64
_SAMPLE_BYTES = 1 << 20
# Bytes a shard's writer holds per record (beam_cache.write_shard: the grouped tuples, their sorted copy, the
# framed pieces and the shard's bytes): tracemalloc's peak on 20,000-record shards of 100, 400 and 1,600-byte
# records was 462-473 + 3 x record bytes a record (2026-12-04), rounded up here.
_SHARD_OVERHEAD_BYTES = 500
_SHARD_RECORD_COPIES = 3


@dataclasses.dataclass(frozen=True)
class ShardSizing:
  """How a writer chooses the shard count when none is given, and what a Beam worker may hold."""
  records_per_shard: int = RECORDS_PER_SHARD
  num_readers: int = 1  # the data readers (hosts) of the runs that read the cache: shards are a multiple
  worker_memory_gb: float = WORKER_MEMORY_GB


@dataclasses.dataclass(frozen=True)
class ShardPlan:
  """The shard count of a split and what it implies."""
  input_rows: int  # an upper bound of the examples: lines (TFRecord: records), or a built split's examples
  exact: bool  # counted; False: estimated from samples of the files
  num_shards: int
  derived: bool  # from input_rows and the sizing (else given)
  sizing: ShardSizing
  record_bytes: int  # an upper bound of one record's bytes, from the feature lengths

  @property
  def records_per_shard(self) -> int:
    return -(-self.input_rows // self.num_shards)

  @property
  def bytes_per_record(self) -> int:
    """Memory a shard's writer holds per record."""
    return _SHARD_OVERHEAD_BYTES + _SHARD_RECORD_COPIES * self.record_bytes

  @property
  def shard_memory_bytes(self) -> int:
    return self.records_per_shard * self.bytes_per_record

  def describe(self) -> str:
    how = (f"derived from --records_per_shard {self.sizing.records_per_shard:,} and --num_readers "
           f"{self.sizing.num_readers}" if self.derived else "given")
    return (f"{self.input_rows:,} input rows ({'counted' if self.exact else 'estimated from samples'}) -> "
            f"{self.num_shards:,} shards ({how}), <= {self.records_per_shard:,} records and "
            f"~{self.shard_memory_bytes / 2**30:.2f} GiB held while writing one")


def record_bytes_bound(specs: Sequence[tuple[str, int, bool, int]]) -> int:
  """An upper bound of one record's bytes: every token id a 3-byte varint (ids < 2**21), EOS included, plus the
  tf.train.Example's field tags and lengths (16 bytes a feature and its name, 16 for the record)."""
  return 16 + sum(3 * (keep + int(add_eos)) + len(name) + 16 for name, keep, add_eos, _ in specs)


def _rows_in(path: str, fmt: str, limit: int | None = None) -> tuple[int, int]:
  """(rows, bytes) of a file, or of about its first `limit` bytes: lines (a last line without a line end counts),
  TFRecord records (walked by their length headers)."""
  with paths.open_file(path, "rb") as f:
    if fmt == "tfrecord":
      rows = position = 0
      while limit is None or position < limit:
        header = f.read(12)
        if len(header) < 12:
          break
        length = struct.unpack("<Q", header[:8])[0]
        f.seek(length + 4, 1)
        rows, position = rows + 1, position + 16 + length
      return rows, position
    if limit is not None:
      data = f.read(limit)
      if len(data) == limit and f.read(1):  # a sample: whole lines only
        last = data.rfind(b"\n")
        return (data.count(b"\n"), last + 1) if last >= 0 else (1, len(data))
      return data.count(b"\n") + int(bool(data) and not data.endswith(b"\n")), len(data)
    rows = size = 0
    last = b"\n"
    while chunk := f.read(1 << 22):
      rows, size, last = rows + chunk.count(b"\n"), size + len(chunk), chunk[-1:]
    return rows + int(last != b"\n"), size


def file_sizes(files: Sequence[str]) -> list[int]:
  """Bytes of each file (16 at a time: one request each on GCS)."""
  with concurrent.futures.ThreadPoolExecutor(16) as pool:
    return list(pool.map(paths.size, files))


def input_rows(reader: sources_lib.SplitReader, sizes: Sequence[int] | None = None) -> tuple[int, bool] | None:
  """(rows, exact) of a split before it is read, or None when not known without reading it.

  A built split: its examples. Files: their lines (TFRecord: records), an upper bound of the examples (bad rows,
  filters and duplicates only remove). Up to 256 MiB of files are counted; beyond that, the rows per byte of the
  first MiB of up to 64 evenly spaced files times the files' bytes (seconds on GCS, where a count would read the
  whole corpus through one machine).
  """
  if isinstance(reader, sources_lib.MemorySplit):
    return reader.count(), True
  files = getattr(reader, "files", None)
  if not files:
    return None
  fmt = reader.reader.row_format.format if isinstance(reader, sources_lib.FileSplit) else "jsonl"
  sizes = file_sizes(files) if sizes is None else sizes
  with concurrent.futures.ThreadPoolExecutor(16) as pool:
    if sum(sizes) <= _COUNT_BYTES:
      return sum(rows for rows, _ in pool.map(lambda f: _rows_in(f, fmt), files)), True
    picks = sorted({round(i * (len(files) - 1) / max(_SAMPLE_FILES - 1, 1))
                    for i in range(min(_SAMPLE_FILES, len(files)))})
    counted = list(pool.map(lambda k: _rows_in(files[k], fmt, _SAMPLE_BYTES), picks))
  rows, sampled = sum(r for r, _ in counted), sum(b for _, b in counted)
  return max(1, -(-sum(sizes) * rows // max(sampled, 1))), False


def plan_shards(rows: tuple[int, bool], specs: Sequence[tuple[str, int, bool, int]], *, num_shards: int | None,
                sizing: ShardSizing) -> ShardPlan:
  """The shard count: `num_shards` when given, else ceil(rows / records_per_shard) rounded up to a multiple of
  num_readers (at least one shard a reader)."""
  if sizing.records_per_shard < 1 or sizing.num_readers < 1:
    raise CacheError(f"records_per_shard and num_readers must be at least 1, got {sizing.records_per_shard} and "
                     f"{sizing.num_readers}.")
  if num_shards is not None and num_shards < 1:
    raise CacheError(f"num_shards must be at least 1, got {num_shards}.")
  count, exact = rows
  derived = num_shards is None
  if derived:
    wanted = max(1, -(-count // sizing.records_per_shard))
    num_shards = -(-wanted // sizing.num_readers) * sizing.num_readers
  return ShardPlan(count, exact, num_shards, derived, sizing, record_bytes_bound(specs))


def warn_given_shards(plan: ShardPlan) -> None:
  """Logs a warning when a given shard count is not a multiple of the readers or its shards exceed the sizing."""
  problems = []
  if plan.records_per_shard > plan.sizing.records_per_shard:
    problems.append(f"up to {plan.records_per_shard:,} records a shard, more than --records_per_shard "
                    f"{plan.sizing.records_per_shard}")
  if plan.num_shards % plan.sizing.num_readers:
    problems.append(f"not a multiple of the {plan.sizing.num_readers} readers")
  if problems and not plan.derived:
    log.warning("num_shards %d: %s.", plan.num_shards, "; ".join(problems))


def check_shard_memory(plan: ShardPlan) -> None:
  """Refuses (one line) a plan whose shard's writer would hold more than half a worker's memory (the rest: the
  worker's Python with TensorFlow imported, ~1 GiB, and Beam's buffers)."""
  budget = plan.sizing.worker_memory_gb * 2**30 / 2
  if plan.shard_memory_bytes <= budget:
    return
  fits = max(1, int(budget // plan.bytes_per_record))
  enough = plan_shards((plan.input_rows, plan.exact), (), num_shards=None,
                       sizing=dataclasses.replace(plan.sizing, records_per_shard=fits)).num_shards
  raise CacheError(
      f"{plan.num_shards:,} shards of up to {plan.records_per_shard:,} records ({plan.input_rows:,} input rows): "
      f"writing one would hold ~{plan.shard_memory_bytes / 2**30:.1f} GiB ({plan.bytes_per_record:,} bytes a "
      f"record), over half of --worker_memory_gb {plan.sizing.worker_memory_gb:g}; use at least {enough:,} shards "
      f"(--records_per_shard {fits}) or workers with more memory.")


def write_cache(task: str, split: str, out_dir: str, num_shards: int | None, feature_lengths: Mapping[str, int], *,
                dedup: bool = True, decontaminate: bool = True, numpy_path: bool = True,
                sizing: ShardSizing | None = None, progress: Callable[[str], None] | None = None,
                prompts: Any = None) -> dict[str, Any]:
  """Writes the cache of one task split to `out_dir` (replaced as a whole) in memory; returns the manifest.

  `num_shards` None: derived from the input rows and `sizing` (plan_shards). `prompts`: prepended to the
  features before tokenising (DataConfig.prompts' forms for this one task; recorded in the manifest).
  st5_jax.data.offline.beam_cache.write_cache_beam writes the same files with Apache Beam.
  """
  provider, layout = resolve_task(task, split, feature_lengths, prompts)
  shards, manifest = build_cache(provider, split, layout, num_shards=num_shards, dedup=dedup,
                                 decontaminate=decontaminate, numpy_path=numpy_path, sizing=sizing,
                                 progress=progress)
  files = {e["file"]: data for e, data in zip(manifest["shards"], shards)}
  files[MANIFEST] = manifest_bytes(manifest)
  if paths.is_remote(out_dir):
    with paths.staged_output(out_dir) as local:
      _write_files(local, files)
  else:
    out_dir = os.path.abspath(out_dir)
    parent = os.path.dirname(out_dir)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".st5_cache_", dir=parent)
    try:
      _write_files(tmp, files)
      if os.path.exists(out_dir):
        shutil.rmtree(out_dir)
      os.replace(tmp, out_dir)
    finally:
      shutil.rmtree(tmp, ignore_errors=True)
  return manifest


def _write_files(folder: str, files: Mapping[str, bytes]) -> None:
  os.makedirs(folder, exist_ok=True)
  for name, data in files.items():
    with open(os.path.join(folder, name), "wb") as f:
      f.write(data)
