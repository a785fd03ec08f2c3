"""The token cache's format and its reader: one task split, tokenised, de-duplicated and sharded.

Layout (one folder per task split; `task_dir(root, task, split)` = root/<task>/<split>):

    manifest.json                         what was cached and how (below), per-shard counts and sizes
    shard-00000-of-00008.tfrecord ...     TFRecord files of tf.train.Example records (`shard_name`)

Record schema: each record is one example, an int64 feature per token feature holding its
token ids exactly as the task's pipeline makes them (tokenised, truncated to the feature
length minus one, EOS appended; no padding), and an int64 or float feature per scalar
feature. TFRecord framing: length, masked CRC32C of the length, data, masked CRC32C of the data.

Manifest (JSON, sorted keys, no timestamps): format and format_version (`FORMAT`,
`FORMAT_VERSION`), task, split, features (name, kind tokens|scalar, dtype, length, add_eos,
eos_id), feature_lengths, vocabulary_sha256 (`vocabulary_sha256`), pipeline, dedup,
decontaminated, num_shards, num_examples, shards (file, examples, bytes, sha256) and stats; and
`prompts` ({task feature: text prepended before tokenising}, DataConfig.prompts) only when the cache
was written with prompts (a manifest without the key holds none, as every cache written before them).

This module is what training needs: `CacheReader` checks a cache against the task that
reads it and reads shards record by record with checksums verified, `decode_rows` turns
records into batch rows (st5_jax.data.cache_stream makes the training stream of them).
The writers are offline steps, never imported by training: st5_jax.data.offline.cache_writer
(`st5 data cache`, in memory) and st5_jax.data.offline.beam_cache (`--runner`, Apache Beam),
which write byte-identical files.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np
import seqio

from st5_jax import paths
from st5_jax.batch_geometry import DataConfigError
from st5_jax.data import convert
from st5_jax.data import prompts as prompts_lib
from st5_jax.data.rows import iter_tfrecord_payloads

FORMAT = "st5_token_cache"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"


class CacheError(DataConfigError):
  """A cache that is missing, corrupt, truncated, or not the one this run asks for."""


def task_dir(root: str, task: str, split: str) -> str:
  return paths.join(root, task, split)


def shard_name(index: int, num_shards: int) -> str:
  return f"shard-{index:05d}-of-{num_shards:05d}.tfrecord"


def vocabulary_sha256(task: seqio.Task, layout: convert.BatchLayout) -> str:
  """sha256 over each token feature's vocabulary (SentencePiece model bytes and extra ids)."""
  h = hashlib.sha256()
  for f in layout.features:
    if not f.is_tokens:
      continue
    vocab = task.output_features[f.task_key].vocabulary
    h.update(f.task_key.encode() + b"\0" + type(vocab).__name__.encode() + b"\0")
    if isinstance(vocab, seqio.SentencePieceVocabulary):
      h.update(hashlib.sha256(vocab.sp_model).digest())
      h.update(str(vocab.extra_ids).encode())
    else:
      h.update(str(vocab.vocab_size).encode())
  return h.hexdigest()



# ----------------------------------------------------------------------------- reading


class CacheReader:
  """A cache folder: its manifest, checks against the reading task, and checksummed shard reads."""

  def __init__(self, folder: str):
    self.folder = folder
    path = paths.join(folder, MANIFEST)
    if not paths.exists(path):
      raise CacheError(f"No cache at {folder} ({MANIFEST} missing); write it with `st5 data cache`.")
    try:
      self.manifest = json.loads(paths.read_text(path))
    except ValueError as e:
      raise CacheError(f"Cache manifest {path} is not valid JSON ({e}); rewrite the cache.") from e
    m = self.manifest
    if m.get("format") != FORMAT or m.get("format_version") != FORMAT_VERSION:
      raise CacheError(f"{path} is format {m.get('format')!r} version {m.get('format_version')}, this code reads "
                       f"{FORMAT!r} version {FORMAT_VERSION}; rewrite the cache.")
    self.shards = list(m["shards"])
    self.features = {f["name"]: f for f in m["features"]}
    if len(self.shards) != m.get("num_shards") or sum(s["examples"] for s in self.shards) != m.get("num_examples"):
      raise CacheError(f"Cache manifest {path} is inconsistent: {len(self.shards)} shards listed for num_shards "
                       f"{m.get('num_shards')}, {sum(s['examples'] for s in self.shards)} examples for "
                       f"num_examples {m.get('num_examples')}.")

  @property
  def fingerprint(self) -> str:
    """Identifies the cache's contents and sharding (its shards' checksums)."""
    h = hashlib.sha256("".join(s["sha256"] for s in self.shards).encode())
    return h.hexdigest()[:16]

  @property
  def num_shards(self) -> int:
    return len(self.shards)

  def shard_path(self, index: int) -> str:
    return paths.join(self.folder, self.shards[index]["file"])

  def check(self, task: seqio.Task, split: str, layout: convert.BatchLayout) -> None:
    """Raises CacheError unless this cache holds `task`'s `split` with this vocabulary and room for the lengths."""
    m = self.manifest
    where = f"Cache {self.folder}"
    if m["task"] != task.name or m["split"] != split:
      raise CacheError(f"{where} holds task {m['task']} split {m['split']!r}, not {task.name} split {split!r}.")
    mine = vocabulary_sha256(task, layout)
    if m["vocabulary_sha256"] != mine:
      raise CacheError(f"{where} was tokenised with vocabulary sha256 {m['vocabulary_sha256'][:12]}..., this "
                       f"run's is {mine[:12]}...; rewrite the cache with this vocabulary.")
    tokens = [f.task_key for f in layout.features if f.is_tokens]
    cached = {k: v for k, v in m.get("prompts", {}).items() if k in tokens}
    mine = {k: v for k, v in prompts_lib.task_prompts(task).items() if k in tokens}
    if cached != mine:
      raise CacheError(f"{where} was tokenised with prompts {cached or 'none'}, this run's DataConfig.prompts give "
                       f"{mine or 'none'}: rewrite the cache with the run's prompts (`st5 data cache --gin_file "
                       "<the run's gin file>`, or --prompts) or set DataConfig.prompts to the cache's.")
    for f in layout.features:
      got = self.features.get(f.task_key)
      kind = "tokens" if f.is_tokens else "scalar"
      if got is None or got["kind"] != kind:
        raise CacheError(f"{where} has features {sorted(self.features)}; this run needs {f.task_key!r} ({kind}).")
      if f.is_tokens and (f.length > got["length"] or f.add_eos != got["add_eos"]):
        raise CacheError(f"{where} holds {f.task_key!r} truncated to {got['length']} tokens; this run asks for "
                         f"{f.length}: rewrite the cache with --feature_lengths {f.task_key}={f.length} or more.")

  def check_size(self, index: int) -> None:
    path = self.shard_path(index)
    want = self.shards[index]["bytes"]
    got = paths.size(path) if paths.exists(path) else None
    if got != want:
      state = "is missing" if got is None else f"is {got} bytes"
      raise CacheError(f"Cache shard {path} {state}, the manifest says {want}: truncated or rewritten; "
                       "rewrite the cache (`st5 data cache`).")

  def iter_shard(self, index: int, on_read: Callable[[], None] | None = None) -> Iterator[bytes]:
    """The record bytes of one shard, checksums verified and the count checked against the manifest."""
    path = self.shard_path(index)
    want = self.shards[index]["examples"]
    n = 0
    with paths.open_file(path, "rb") as f:
      for payload in iter_tfrecord_payloads(_ChunkReader(f)):
        if isinstance(payload, str):
          raise CacheError(f"Cache shard {path}: {payload} at record {n + 1}; rewrite the cache (`st5 data cache`).")
        n += 1
        if on_read is not None:
          on_read()
        yield payload
    if n != want:
      raise CacheError(f"Cache shard {path} holds {n} records, the manifest says {want}; rewrite the cache.")


class _ChunkReader:
  """`read(n)` served from chunks of a file: one remote read per chunk, not three per record.

  (gcsfs answers every small read through its event loop: ~10 ms each, 20 s for a
  shard of 800 records on the test emulator; with 4 MiB chunks it is a few reads.)
  """

  def __init__(self, f, chunk_bytes: int = 1 << 22):
    self._f, self._chunk = f, chunk_bytes
    self._buf, self._pos = b"", 0

  def read(self, n: int) -> bytes:
    if len(self._buf) - self._pos < n:
      parts = [self._buf[self._pos:]]
      have = len(parts[0])
      while have < n:
        more = self._f.read(max(self._chunk, n - have))
        if not more:
          break
        parts.append(more)
        have += len(more)
      self._buf, self._pos = b"".join(parts), 0
    out = self._buf[self._pos:self._pos + n]
    self._pos += len(out)
    return out


def decode_rows(records: Sequence[bytes], layout: convert.BatchLayout,
                cached: Mapping[str, Mapping[str, Any]]) -> dict[str, np.ndarray]:
  """Batch rows of the layout from cache records (token ids re-truncated when the layout is shorter)."""
  from tensorflow.core.example import example_pb2  # pylint: disable=g-import-not-at-top
  parsed = [example_pb2.Example.FromString(r).features.feature for r in records]
  n = len(parsed)
  out = {}
  for f in layout.features:
    if not f.is_tokens:
      spec = cached[f.task_key]
      kind = "float_list" if np.dtype(spec["dtype"]).kind == "f" else "int64_list"
      out[f.model_key] = np.asarray([getattr(p[f.task_key], kind).value[0] for p in parsed], f.dtype)
      continue
    ids = [p[f.task_key].int64_list.value for p in parsed]
    if f.length < cached[f.task_key]["length"]:
      eos = cached[f.task_key]["eos_id"]
      keep = f.length - 1 if f.add_eos else f.length
      ids = [list(r) if len(r) <= f.length else list(r[:keep]) + ([eos] if f.add_eos else []) for r in ids]
    lengths = np.fromiter(map(len, ids), np.int64, count=n)
    flat = np.fromiter((x for r in ids for x in r), np.int64, count=int(lengths.sum()))
    rows = np.repeat(np.arange(n), lengths)
    cols = np.arange(flat.size) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    tokens = np.zeros((n, f.length), f.dtype)
    tokens[rows, cols] = flat
    out[f.model_key] = tokens
  return out
