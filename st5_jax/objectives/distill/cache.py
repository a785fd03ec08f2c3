"""The teacher cache: a teacher's vectors of a task's decontaminated training texts, computed once.

    examples = task_examples("st5_snli_devtest_triples", "all")      # or Examples(...) of your own
    report = build_cache(examples, load_teacher("path/to/teacher"), "distill/teacher")  # rerun to resume
    cache = TeacherCache.open("distill/teacher")                     # what training reads

Input: the examples of a registered task or mixture of this project's sources (`inputs`, `targets`
and any hard negatives `negative_targets`, `negative_targets_1`, ...; st5_jax.features). Every
example with a text in an evaluation set is dropped here (st5_jax.data.overlap.decontaminate, the
check the public tasks run when they are built; users' tasks get it here too) and counted by set
(`dropped_contaminated`; what a public task dropped itself: `dropped_contaminated_by_task`).

Folder (local or gs://):

  texts.jsonl        the distinct texts of the kept examples, first-seen order, one JSON string a line
  examples.npy       int64 [N, S]: each example's texts as indices into texts.jsonl, S = its text features
  part-00000.npy     float32 [n, E]: the teacher's `encode` of texts [0, shard_size), as it returned them
  part-00000.json    the part's count, dimension, sha256 and the run's identity: written last, it marks
                     the part finished
  ...
  manifest.json      written last: teacher (backend, path, fingerprint, dim), input (task, split), features,
                     counts (rows read, examples kept, dropped as contaminated by set, distinct texts),
                     decontamination version, the texts' and examples' sha256, the parts. No times: the
                     same run writes the same bytes.

Resumable: a rerun keeps every part whose JSON matches the run (teacher fingerprint, texts, examples,
shard size) and whose vectors still hash to it, and encodes the rest; a folder holding another run's
cache is refused (DistillCacheMismatchError) before anything is written. One process encodes (a
teacher is one model on one host's devices).
"""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import os
import time
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from st5_jax import parts as parts_lib
from st5_jax.parts import part_name
from st5_jax import paths
from st5_jax.features import negative_features

log = logging.getLogger(__name__)

FORMAT = "st5-distill/1"
MANIFEST = "manifest.json"
TEXTS = "texts.jsonl"
EXAMPLES = "examples.npy"
DEFAULT_SHARD_SIZE = 10_000  # texts a part
EVALUATION_SET = "text in evaluation set "  # st5_jax.data.overlap's reason for a dropped example


class DistillCacheMismatchError(ValueError):
  """The folder holds the cache of another run (another teacher, texts or shard size)."""


def _npy_bytes(array: np.ndarray) -> bytes:
  buf = io.BytesIO()
  np.save(buf, array, allow_pickle=False)
  return buf.getvalue()


def text_keys(num_negatives: int) -> tuple[str, ...]:
  """The text features of an example with K hard negatives, in order."""
  return ("inputs", "targets") + tuple(task_key for task_key, _ in (negative_features(num_negatives)
                                                                    if num_negatives else []))


def num_negatives_of(features: Sequence[str]) -> int:
  """K of a feature list that text_keys(K) gives; ValueError for any other list."""
  K = max(0, len(features) - 2)
  if tuple(features) != text_keys(K):
    raise ValueError(f"a distillation example has the text features {text_keys(K)} (inputs, targets, then K hard "
                     f"negatives), got {tuple(features)}")
  return K


# ------------------------------------------------------------------------------------------------ input


@dataclasses.dataclass
class Examples:
  """Text examples (feature -> text), their features in order and where they came from."""

  features: tuple[str, ...]
  rows: list[dict[str, str]]
  source: dict
  counts: dict = dataclasses.field(default_factory=dict)


def task_examples(name: str, split: str = "train") -> Examples:
  """The examples of a registered task or mixture (its tasks in order) of this project's sources."""
  import seqio  # pylint: disable=g-import-not-at-top

  from st5_jax.data import sources, streams  # pylint: disable=g-import-not-at-top
  from st5_jax.data.rows import RowStats  # pylint: disable=g-import-not-at-top

  provider = streams.get_provider(name)
  tasks = list(provider.tasks) if isinstance(provider, seqio.Mixture) else [provider]
  stats, rows, features = RowStats(), [], None
  by_task: dict[str, int] = {}  # examples a public task dropped itself for a text in an evaluation set
  for task in tasks:
    source = task.source
    if not isinstance(source, sources.ExampleSource):
      raise ValueError(f"task {task.name} is not a task of this project's sources (a public task, users' files, mined "
                       "negatives); write its examples to a JSON lines file and register it as a user task")
    if features is None:
      features = tuple(source.features)
      num_negatives_of(features)
    elif tuple(source.features) != features:
      raise ValueError(f"the tasks of mixture {name} have different features: {features} and {source.features}")
    reader = source.open(split)
    rows.extend(reader.iter_examples(stats=stats))
    for reason, n in (reader.build_stats or {}).get("filtered_by_reason", {}).items():
      if reason.startswith(EVALUATION_SET):
        set_name = reason.removeprefix(EVALUATION_SET)
        by_task[set_name] = by_task.get(set_name, 0) + n
  if not rows:
    raise ValueError(f"task {name} split {split!r} has no examples (rows skipped: {stats.rows_skipped})")
  return Examples(features, rows, {"task": name, "split": split, "tasks": [t.name for t in tasks]},
                  {"rows_skipped": stats.rows_skipped, "dropped_contaminated_by_task": dict(sorted(by_task.items()))})


def decontaminate(examples: Examples, *, data_dir: str | None = None) -> Examples:
  """The examples without those sharing a text with an evaluation set (st5_jax.data.overlap), counted by set."""
  from st5_jax.data import config, overlap  # pylint: disable=g-import-not-at-top
  from st5_jax.data.rows import RowStats  # pylint: disable=g-import-not-at-top

  data_dir = data_dir or config.data_dir()
  stats = RowStats()
  kept, missing = overlap.decontaminate(examples.rows, examples.features, data_dir=data_dir, stats=stats)
  overlap.warn_missing(f"distill cache of {examples.source}", data_dir, missing)
  dropped = {reason.removeprefix(EVALUATION_SET): n for reason, n in stats.filtered_by_reason.items()}
  counts = dict(examples.counts, examples_in=len(examples.rows), examples=len(kept),
                dropped_contaminated=dict(sorted(dropped.items())))
  return dataclasses.replace(examples, rows=kept, counts=counts,
                             source=dict(examples.source, decontamination={
                                 "version": overlap.DECONTAMINATION_VERSION,
                                 "evaluation_sets_missing": [m.split(" (")[0] for m in missing]}))


def index_texts(examples: Examples) -> tuple[list[str], np.ndarray]:
  """(distinct texts in first-seen order, int64 [N, S] index of each example's texts)."""
  where: dict[str, int] = {}
  texts: list[str] = []
  ids_NxS = np.zeros((len(examples.rows), len(examples.features)), np.int64)
  for n, row in enumerate(examples.rows):
    for s, key in enumerate(examples.features):
      text = row[key]
      i = where.get(text)
      if i is None:
        i = where[text] = len(texts)
        texts.append(text)
      ids_NxS[n, s] = i
  return texts, ids_NxS


# ------------------------------------------------------------------------------------------------ building


@dataclasses.dataclass
class CacheReport:
  """What one build did: parts encoded now and parts kept from an earlier run, and the manifest."""

  encoded: list[int]
  kept: list[int]
  manifest: dict
  seconds: float = 0.0


def _finished(out: str, s: int, identity: str, count: int) -> tuple[bool, str]:
  """(True, "") when part s is complete and belongs to this run; else (False, why)."""
  return parts_lib.part_finished(out, s, data_suffix=".npy", what="vectors",
                                 matches=lambda meta: meta.get("identity") == identity and meta.get("count") == count)


def _check_no_mixing(out: str, identity: str, describe: str) -> None:
  """DistillCacheMismatchError when out's manifest or a part JSON belongs to another run."""
  for name, meta in parts_lib.folder_records(out, MANIFEST):
    if meta.get("identity") != identity:
      raise DistillCacheMismatchError(
          f"{out} holds the teacher cache of another run ({name}: {meta.get('describe')}); this run: {describe}. "
          f"Pass another --out, or delete {out} to build it again")


def build_cache(examples: Examples, teacher: Any, out: str, *, shard_size: int = DEFAULT_SHARD_SIZE,
                data_dir: str | None = None, progress: Callable[[str], None] | None = None) -> CacheReport:
  """Decontaminates `examples`, then writes (or finishes) the teacher cache of their texts in `out`."""
  say = progress or log.info
  start_time = time.perf_counter()
  if shard_size < 1:
    raise ValueError(f"shard_size must be >= 1, got {shard_size}")
  K = num_negatives_of(examples.features)
  out = os.fspath(paths.path(out))
  if paths.exists(out) and not paths.is_dir(out):
    raise NotADirectoryError(f"--out {out} is a file; a teacher cache is a folder")
  clean = decontaminate(examples, data_dir=data_dir)
  if not clean.rows:
    raise ValueError(f"every example of {examples.source} shares a text with an evaluation set; nothing to cache")
  texts, ids_NxS = index_texts(clean)
  texts_bytes = "".join(json.dumps(t, ensure_ascii=False) + "\n" for t in texts).encode()
  examples_bytes = _npy_bytes(ids_NxS)
  teacher_info = teacher.describe()
  dim = int(teacher.dim)
  ident = {"format": FORMAT, "teacher": teacher_info, "texts_sha256": parts_lib.sha256(texts_bytes),
           "examples_sha256": parts_lib.sha256(examples_bytes), "features": list(clean.features),
           "shard_size": shard_size}
  identity = parts_lib.sha256(json.dumps(ident, sort_keys=True).encode())
  describe = (f"teacher {teacher_info['backend']} {teacher_info['path']} ({dim}-d, {teacher_info['fingerprint'][:12]}) "
              f"on {len(clean.rows)} examples, {len(texts)} texts ({ident['texts_sha256'][:12]}) in parts of "
              f"{shard_size}")
  _check_no_mixing(out, identity, describe)  # before anything is written
  paths.mkdir(out)
  for name, data in ((TEXTS, texts_bytes), (EXAMPLES, examples_bytes)):
    target = paths.join(out, name)
    if not paths.exists(target) or parts_lib.sha256(paths.read_bytes(target)) != parts_lib.sha256(data):
      paths.write_bytes(target, data)

  num_parts = -(-len(texts) // shard_size)
  paths.remove_interrupted_writes(out, "part", set(range(num_parts)))  # a killed write's temporary files
  encoded, kept, parts = [], [], []
  for s in range(num_parts):
    lo, hi = s * shard_size, min((s + 1) * shard_size, len(texts))
    done, why = _finished(out, s, identity, hi - lo)
    if not done:
      t = time.perf_counter()
      vecs_nxE = np.asarray(teacher.encode(texts[lo:hi]))
      if vecs_nxE.shape != (hi - lo, dim):
        raise ValueError(f"teacher {teacher_info['path']} returned vectors of shape {vecs_nxE.shape} for {hi - lo} "
                         f"texts; expected ({hi - lo}, {dim})")
      if not np.all(np.isfinite(vecs_nxE)):
        bad = lo + int(np.flatnonzero(~np.all(np.isfinite(vecs_nxE), axis=1))[0])
        raise ValueError(f"teacher {teacher_info['path']} returned a non-finite vector for text {bad}: {texts[bad]!r}")
      data = _npy_bytes(vecs_nxE.astype(np.float32))
      paths.write_bytes(paths.join(out, part_name(s) + ".npy"), data)
      meta = {"part": s, "start": lo, "count": hi - lo, "dim": dim, "sha256": parts_lib.sha256(data),
              "identity": identity, "describe": describe}
      paths.write_bytes(paths.join(out, part_name(s) + ".json"), parts_lib.dumps(meta, ensure_ascii=False))
      encoded.append(s)
      say(f"part {s + 1}/{num_parts}: {hi - lo} texts encoded in {time.perf_counter() - t:.1f}s ({why})")
    else:
      kept.append(s)
    parts.append({"name": part_name(s), "start": lo, "count": hi - lo,
                  "sha256": parts_lib.read_json(paths.join(out, part_name(s) + ".json"))["sha256"]})
  manifest = {"format": FORMAT, "identity": identity, "describe": describe, "teacher": teacher_info, "dim": dim,
              "features": list(clean.features), "num_negatives": K, "input": clean.source, "counts": dict(
                  clean.counts, texts=len(texts)), "texts_sha256": ident["texts_sha256"],
              "examples_sha256": ident["examples_sha256"], "shard_size": shard_size, "parts": parts}
  paths.write_bytes(paths.join(out, MANIFEST), parts_lib.dumps(manifest, ensure_ascii=False))
  return CacheReport(encoded, kept, manifest, time.perf_counter() - start_time)


# ------------------------------------------------------------------------------------------------ reading


class TeacherCache:
  """A finished teacher cache: its texts, examples (text indices) and the teacher's vectors by text index."""

  def __init__(self, folder: str, manifest: Mapping[str, Any], texts: list[str], examples_NxS: np.ndarray,
               parts: list[np.ndarray]):
    self.folder = folder
    self.manifest = dict(manifest)
    self.texts = texts
    self.examples_NxS = examples_NxS
    self.parts = parts
    self.dim = int(manifest["dim"])
    self.features = tuple(manifest["features"])
    self.shard_size = int(manifest["shard_size"])

  @staticmethod
  def resolve(folder: str) -> str:
    """The folder as `open` names it (absolute when local)."""
    return os.fspath(paths.path(folder))

  @classmethod
  def open(cls, folder: str) -> "TeacherCache":
    """Reads a finished cache (the vectors memory-mapped); a clear error for an unfinished or foreign one."""
    folder = cls.resolve(folder)
    manifest = parts_lib.read_json(paths.join(folder, MANIFEST))
    if manifest is None:
      raise FileNotFoundError(f"{folder} has no {MANIFEST}: not a finished teacher cache. `st5 distill-cache ... --out "
                              f"{folder}` writes one (rerun it with the same arguments to finish an interrupted one)")
    if manifest.get("format") != FORMAT:
      raise ValueError(f"{folder}/{MANIFEST} is of format {manifest.get('format')!r}, not {FORMAT!r}")
    texts = [json.loads(line) for line in paths.read_text(paths.join(folder, TEXTS)).splitlines()]
    examples_NxS = np.load(io.BytesIO(paths.read_bytes(paths.join(folder, EXAMPLES))), allow_pickle=False)
    parts = []
    for p in manifest["parts"]:
      vecs = np.load(paths.local_file(paths.join(folder, p["name"] + ".npy")), mmap_mode="r", allow_pickle=False)
      if vecs.shape != (p["count"], manifest["dim"]):
        raise ValueError(f"{folder}/{p['name']}.npy holds {vecs.shape}, its manifest says ({p['count']}, "
                         f"{manifest['dim']}): rerun `st5 distill-cache` with the same arguments to rebuild it")
      parts.append(vecs)
    if len(texts) != sum(len(p) for p in parts) or examples_NxS.shape[1:] != (len(manifest["features"]),):
      raise ValueError(f"{folder}: texts, examples and parts disagree with its manifest; rebuild it")
    return cls(folder, manifest, texts, examples_NxS, parts)

  @property
  def num_negatives(self) -> int:
    return num_negatives_of(self.features)

  def __len__(self) -> int:
    return len(self.examples_NxS)

  def vectors(self, ids: np.ndarray) -> np.ndarray:
    """float32 [len(ids), dim]: the teacher's vectors of texts `ids`."""
    ids = np.asarray(ids, np.int64)
    out = np.empty((len(ids), self.dim), np.float32)
    part, row = np.divmod(ids, self.shard_size)
    for p in np.unique(part):
      where = part == p
      out[where] = self.parts[int(p)][row[where]]
    return out

  def all_vectors(self) -> np.ndarray:
    """float32 [texts, dim], in texts' order."""
    return self.vectors(np.arange(len(self.texts)))
