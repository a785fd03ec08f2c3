"""How much of a public test set a training set holds: exact and near-duplicate matches, by test set and side.

    training texts  ─► normalise ─► distinct ─┬─► exact: the same normalised text as a test text
    (a task, a token                          └─► near: MinHash LSH candidates (datasketch), kept when the
     cache decoded,                               exact Jaccard of the two shingle sets >= near_threshold
     JSON lines)
    test sets: BEIR folders (queries, documents, relevant documents), MTEB tasks from a local copy of their
    Hugging Face dataset, this project's evaluation sets (their texts)

Texts are compared as st5_jax.data.overlap.normalize makes them (NFKC, lower case, letters and digits
only). Shingles are the character `shingle`-grams of that normalised text (a text shorter than that is
one shingle), so an exact match is Jaccard 1 and a spacing, casing or punctuation variant is no
change at all; character shingles rather than word shingles because queries are a few words long (one
changed word of a six-word query leaves a third of its word 3-grams, most of its character 5-grams).
MinHash LSH (datasketch's `MinHashLSH`: the bands and rows it picks for `near_threshold` and `num_perm`,
false negatives weighted 0.9 and false positives 0.1, `LSH_WEIGHTS`) proposes candidates; each is verified
by the exact Jaccard of the two shingle sets, so LSH false positives are never reported. Its false
negatives are missed: at 0.8 and 128 permutations (14 bands of 9 rows) a pair of Jaccard 0.85 shares no
band with probability 2.5% ((1 - 0.85^9)^14), one of exactly 0.8 with 13%; 256 permutations (23 x 11)
bring 0.85 to 1.5%. (datasketch's default weights, 0.5 / 0.5, give 9 x 13 and miss 31% at 0.85.)

A document is matched by its title and text joined (what BEIR and MTEB encode) and by its text alone (what
a corpus of passages holds). Each test text counts once, by its best training match: exact first, else
the near match of highest Jaccard (ties: the smaller training text). The report counts, per test set and
side, the texts matched exactly, nearly (not exactly) and in all, their fraction, and a few examples
(`show`: exact ones in file order, near ones lowest Jaccard first, where the threshold is judged).

`check` runs it in memory (the distinct training texts and every test text are held); the Apache Beam
pipeline (st5_jax.data.offline.contamination_beam) runs the same steps at any size and writes the same
report. Both read the training data as the same `Unit`s, through `unit_texts`.
"""

from __future__ import annotations

import dataclasses
import heapq
import json
import logging
import os
import re
import tempfile
import types
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

from st5_jax import paths
from st5_jax.data.offline import contamination_names as names_lib
from st5_jax.data.overlap import normalize

log = logging.getLogger("st5_jax.data")

FORMAT = "st5_contamination"
FORMAT_VERSION = 1
SIDES = ("queries", "documents", "relevant_documents", "texts")
_CHUNK = 4096  # texts per in-memory unit (a task read off the NumPy path)
# MinHashLSH's (false positive, false negative) weights: candidates are verified exactly, so a false positive
# costs one Jaccard and a false negative a missed duplicate.
LSH_WEIGHTS = (0.1, 0.9)


class ContaminationError(ValueError):
  """Bad input to the check (a missing folder or file, a corrupt line, a bad setting): one actionable line."""


# ----------------------------------------------------------------------------- settings and the text rule


@dataclasses.dataclass(frozen=True)
class Settings:
  """near_threshold: Jaccard of the shingle sets at and above which a pair is a near duplicate; num_perm:
  MinHash permutations; shingle: the characters of a shingle; show: examples kept per side and kind."""
  near_threshold: float = 0.8
  num_perm: int = 128
  shingle: int = 5
  show: int = 3

  def check(self) -> "Settings":
    if not 0 < self.near_threshold <= 1:
      raise ContaminationError(f"near_threshold must be in (0, 1], got {self.near_threshold}.")
    if self.num_perm < 2:
      raise ContaminationError(f"num_perm must be at least 2, got {self.num_perm}.")
    if self.shingle < 1:
      raise ContaminationError(f"shingle must be at least 1 character, got {self.shingle}.")
    if self.show < 0:
      raise ContaminationError(f"show must be 0 or more, got {self.show}.")
    return self

  def lsh(self):
    """An empty datasketch MinHashLSH for these settings (its bands `b`, rows `r`, `hashranges`)."""
    from datasketch import MinHashLSH  # pylint: disable=g-import-not-at-top
    return MinHashLSH(threshold=self.near_threshold, num_perm=self.num_perm, weights=LSH_WEIGHTS)

  def as_dict(self) -> dict[str, Any]:
    lsh = self.lsh()
    return {"near_threshold": self.near_threshold, "num_perm": self.num_perm, "shingle": self.shingle,
            "shingles": f"character {self.shingle}-grams of the normalised text", "lsh_bands": lsh.b,
            "lsh_rows": lsh.r, "lsh_weights": list(LSH_WEIGHTS), "show": self.show,
            "normalisation": "NFKC, lower case, letters and digits only (st5_jax.data.overlap.normalize)"}


def shingles(normalized: str, k: int) -> frozenset[str]:
  """The character k-grams of a normalised text; the text itself when it is shorter than k."""
  if len(normalized) <= k:
    return frozenset([normalized])
  return frozenset(normalized[i:i + k] for i in range(len(normalized) - k + 1))


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
  return len(a & b) / len(a | b)


class Signer:
  """MinHash signatures (datasketch, seed 1) of shingle sets; one set of permutations for all."""

  def __init__(self, num_perm: int):
    from datasketch import MinHash  # pylint: disable=g-import-not-at-top
    self._base = MinHash(num_perm=num_perm)

  def sign(self, shingle_set: frozenset[str]):
    m = self._base.copy()
    m.update_batch([s.encode("utf-8") for s in shingle_set])
    return m


def band_keys(minhash, hashranges: Sequence[tuple[int, int]]) -> list[tuple[int, bytes]]:
  """(band, its hash values' bytes) per LSH band: two texts are candidates when they share one."""
  values = minhash.hashvalues
  return [(i, values[start:end].tobytes()) for i, (start, end) in enumerate(hashranges)]


def best_of(a: tuple, b: tuple) -> tuple:
  """The better of two matches (rank, -jaccard, training text): exact (rank 0) first, then the higher
  Jaccard, then the smaller training text."""
  return min(a, b)


# ----------------------------------------------------------------------------- test sets


@dataclasses.dataclass(frozen=True)
class Item:
  """One test text: `variants` are the normalised forms it is matched by (a document: title + text, text)."""
  index: int
  set_index: int
  side: str  # queries | documents | texts
  id: str
  text: str
  variants: tuple[str, ...]
  relevant: bool = False  # a document judged relevant to a test query (also counted as relevant_documents)

  @property
  def sides(self) -> tuple[str, ...]:
    return (self.side, "relevant_documents") if self.relevant else (self.side,)


@dataclasses.dataclass
class TestSet:
  name: str
  kind: str  # beir | mteb | evaluation
  path: str | None
  split: str | None
  mteb_name: str | None
  totals: dict[str, int]  # side -> texts
  items: list[Item] = dataclasses.field(default_factory=list)

  def describe(self) -> dict[str, Any]:
    return {"name": self.name, "kind": self.kind, "path": self.path, "split": self.split, "mteb_name": self.mteb_name}


def _variants(*texts: str) -> tuple[str, ...]:
  return tuple(dict.fromkeys(n for n in map(normalize, texts) if n))


class _Builder:
  """Numbers the items of every test set in reading order (the order examples are shown in)."""

  def __init__(self):
    self.sets: list[TestSet] = []
    self._next = 0

  def add(self, name, kind, path, split, mteb_name, queries=None, documents=None, relevant=(), texts=None):
    """queries: {id: text}; documents: {id: (title, text)}; texts: [text] (distinct by normalised text)."""
    test_set = TestSet(name, kind, path, split, mteb_name, {})
    index = len(self.sets)
    relevant = set(relevant)

    def item(side, item_id, text, variants, is_relevant=False):
      test_set.items.append(Item(self._next, index, side, str(item_id), text, variants, is_relevant))
      self._next += 1

    if queries is not None:
      for qid, text in queries.items():
        item("queries", qid, text, _variants(text))
      test_set.totals["queries"] = len(queries)
    if documents is not None:
      for did, (title, text) in documents.items():
        joined = f"{title} {text}" if title else text
        item("documents", did, joined, _variants(joined, text), did in relevant)
      test_set.totals["documents"] = len(documents)
      test_set.totals["relevant_documents"] = len(relevant & documents.keys())
    if texts is not None:
      seen = set()
      for i, text in enumerate(texts):
        n = normalize(text)
        if n and n not in seen:
          seen.add(n)
          item("texts", i, text, (n,))
      test_set.totals["texts"] = len(seen)
    self.sets.append(test_set)


def _split_spec(spec: str, default: str) -> tuple[str, str]:
  """FOLDER[:SPLIT], as `st5 eval --beir`: a gs:// scheme's colon is followed by '//'."""
  head, _, tail = spec.rpartition(":")
  if head and tail and "/" not in tail:
    return head, tail
  return spec, default


def beir_folder_name(folder: str) -> str:
  """A BEIR folder's dataset name: its folder name, with its parent's for a CQADupStack forum."""
  parts = [p for p in re.split(r"[/\\]", folder.rstrip("/\\")) if p]
  if len(parts) >= 2 and parts[-2].lower() == "cqadupstack":
    return f"cqadupstack/{parts[-1]}"
  return parts[-1] if parts else folder


def _beir_documents(folder: str) -> dict[str, tuple[str, str]]:
  """id -> (title, text) of a BEIR corpus.jsonl that st5_jax.retrieval.beir.load_beir has already checked."""
  from st5_jax.retrieval import beir  # pylint: disable=g-import-not-at-top
  out = {}
  for _, line in beir.text_lines(paths.join(folder, "corpus.jsonl"), "the documents file", beir.LAYOUT):
    record = json.loads(line)
    out[str(record["_id"])] = (record.get("title") or "", record["text"])
  return out


def add_beir(builder: _Builder, spec: str) -> None:
  """A BEIR folder (`FOLDER[:SPLIT]`, split test by default): the split's judged queries, every document, and the
  documents judged relevant (score > 0) to them."""
  from st5_jax.retrieval import beir  # pylint: disable=g-import-not-at-top
  folder, split = _split_spec(spec, "test")
  data = beir.load_beir(folder, split)  # RetrievalDataError: one line, file:line
  documents = _beir_documents(folder)
  relevant = {did for rel in data.qrels.values() for did, score in rel.items() if score > 0}
  name = beir_folder_name(folder)
  builder.add(name, "beir", folder, split, names_lib.beir_name(name), queries=data.queries, documents=documents,
              relevant=relevant)


_MTEB_FORMAT = ("a local copy of the task's Hugging Face dataset (e.g. `huggingface-cli download mteb/scifact "
                "--repo-type dataset --local-dir DIR`, or its snapshot folder in the Hugging Face cache)")


def _mteb_task_for(path: str, name: str | None):
  """The mteb task named `name`, else the one whose Hugging Face dataset the folder holds (by its name)."""
  try:
    import mteb  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ContaminationError("--mteb_task needs the `mteb` package: pip install 'st5_jax[mteb]' (mteb==2.26.24).") from e
  if name:
    try:
      return mteb.get_task(name)
    except (KeyError, ValueError) as e:
      raise ContaminationError(f"--mteb_task {name}={path}: {name!r} is not an mteb task name (e.g. SciFact, "
                               "STS12; `mteb.get_tasks()` lists them).") from e
  parts = [p for p in re.split(r"[/\\]", path.rstrip("/\\")) if p]
  cached = next((p for p in reversed(parts) if p.startswith("datasets--")), None)  # hub cache: datasets--OWNER--NAME
  repo = cached[len("datasets--"):].replace("--", "/", 1).lower() if cached else None
  base = parts[-1].lower() if parts else ""
  found = [t for t in mteb.get_tasks(exclude_superseded=False)
           if (str(t.metadata.dataset.get("path", "")).lower() == repo if repo
               else str(t.metadata.dataset.get("path", "")).lower().rsplit("/", 1)[-1] == base)]
  if len(found) > 1:
    found = [t for t in found if str(t.metadata.dataset["path"]).lower().startswith("mteb/")] or found
  if len(found) > 1:
    found = [t for t in found if not t.metadata.superseded_by] or found
  if len(found) != 1:
    which = ", ".join(sorted(t.metadata.name for t in found)) if found else "none"
    raise ContaminationError(f"--mteb_task {path}: cannot tell which mteb task the folder holds (matching tasks: "
                             f"{which}); name it: --mteb_task NAME={path}.")
  return found[0]


def _hf_split(datasets, path: str, config: str, split: str) -> str:
  """mteb's split choice: the split asked for, else a config's only split (corpus, queries)."""
  splits = datasets.get_dataset_split_names(path, config_name=config)
  if split in splits:
    return split
  if len(splits) == 1:
    return splits[0]
  raise ValueError(f"config {config!r} has no split {split!r} (it has {', '.join(splits)})")


def _mteb_retrieval(datasets, path: str, split: str, cache_dir: str):
  """(queries {id: text}, documents {id: (title, text)}, relevant ids) of a retrieval dataset, as mteb 2.26.24's
  RetrievalDatasetLoader reads it: configs corpus, queries (or query) and default (or qrels); `_id` columns as
  ids; the queries named in the split's qrels, any score."""
  configs = datasets.get_dataset_config_names(path)
  qrels_config = "default" if "default" in configs else "qrels" if "qrels" in configs else None
  if qrels_config is None or "corpus" not in configs:
    raise ValueError(f"configs {', '.join(configs)}: a retrieval dataset has corpus, queries and default (qrels)")

  def load(config):
    ds = datasets.load_dataset(path, config, split=_hf_split(datasets, path, config, split), cache_dir=cache_dir)
    return ds.to_dict()

  qrels = load(qrels_config)
  judged = {str(q) for q in qrels["query-id"]}
  relevant = {str(d) for d, score in zip(qrels["corpus-id"], qrels["score"]) if int(score) > 0}
  queries_table = load("query" if "query" in configs else "queries")
  corpus = load("corpus")
  ids = lambda table: [str(i) for i in table["_id" if "_id" in table else "id"]]
  queries = {i: t for i, t in zip(ids(queries_table), queries_table["text"]) if i in judged}
  titles = corpus.get("title") or [""] * len(corpus["text"])
  documents = {i: (t or "", x) for i, t, x in zip(ids(corpus), titles, corpus["text"])}
  return queries, documents, relevant


def add_mteb(builder: _Builder, spec: str) -> None:
  """An MTEB task from a local copy of its Hugging Face dataset (`[NAME=]PATH`), read as mteb reads it: a retrieval
  task's queries judged in the task's evaluation splits, every document and the relevant ones (`_mteb_retrieval`);
  any other task type's evaluation splits, every string (or list of strings) column a text. Read through a cache
  of its own: `datasets` keys its default cache by the folder's name, so two folders named alike would share it."""
  name, sep, path = spec.partition("=")
  if not sep:
    name, path = "", spec
  if not paths.is_dir(path):
    raise ContaminationError(f"--mteb_task {spec}: {path} is not a folder; pass {_MTEB_FORMAT}.")
  task = _mteb_task_for(path, name or None)
  meta = task.metadata
  if meta.is_multilingual:
    raise ContaminationError(f"--mteb_task {spec}: {meta.name} has language subsets ({', '.join(meta.hf_subsets)}); "
                             "only single-subset tasks are read here.")
  import datasets  # pylint: disable=g-import-not-at-top  (mteb's own dependency)
  datasets.disable_progress_bars()
  splits = list(meta.eval_splits)
  try:
    with tempfile.TemporaryDirectory(prefix="st5_hf_cache_") as cache_dir:
      if meta.type in ("Retrieval", "Reranking", "InstructionRetrieval"):
        queries, documents, relevant = {}, {}, set()
        for split in splits:
          q, d, r = _mteb_retrieval(datasets, path, split, cache_dir)
          queries.update(q)
          documents.update(d)
          relevant |= r
        builder.add(meta.name, "mteb", path, ",".join(splits), meta.name, queries=queries, documents=documents,
                    relevant=relevant)
        return
      texts = []
      for split in splits:
        table = datasets.load_dataset(path, split=split, cache_dir=cache_dir).to_dict()
        for row in zip(*table.values()):
          texts += _strings(row)
      builder.add(meta.name, "mteb", path, ",".join(splits), meta.name, texts=texts)
  except (ValueError, KeyError, FileNotFoundError, datasets.exceptions.DatasetGenerationError) as e:
    raise ContaminationError(f"--mteb_task {spec}: cannot read {meta.name} from {path} ({type(e).__name__}: "
                             f"{str(e).splitlines()[0] if str(e) else ''}); pass {_MTEB_FORMAT}.") from e


def add_evaluation(builder: _Builder, names: Sequence[str], data_dir: str) -> list[str]:
  """This project's evaluation sets (st5_jax.evaluation.sets): every text each encodes. Returns the sets whose files
  are missing (not checked)."""
  from st5_jax.evaluation import sets as eval_sets  # pylint: disable=g-import-not-at-top
  missing = []
  for name in names:
    try:
      texts = eval_sets.texts(name, data_dir)
    except FileNotFoundError as e:
      missing.append(f"{name} ({e})")
      continue
    builder.add(name, "evaluation", None, None, names_lib.EVAL_NAMES.get(name), texts=texts)
  return missing


# ----------------------------------------------------------------------------- training data, as units


@dataclasses.dataclass(frozen=True)
class Unit:
  """What one reader reads: kind 'texts' (payload: the texts), 'task' (a beam_cache read unit and its ReaderSpec),
  'jsonl' (path, fields or None), 'cache' (folder, shard, token features [(name, eos id, prompt)], vocabulary key)."""
  index: int
  kind: str
  payload: Any


@dataclasses.dataclass
class TrainingPlan:
  units: list[Unit]
  sources: list[dict[str, Any]]  # what was read, for the report
  models: dict[str, bytes]  # vocabulary key -> SentencePiece model (decoding caches)


def _strings(values: Iterable[Any]) -> list[str]:
  """The strings among values, and the strings of list values ({query, pos: [...], neg: [...]})."""
  out = []
  for v in values:
    if isinstance(v, str):
      out.append(v)
    elif isinstance(v, (list, tuple)):
      out += [x for x in v if isinstance(x, str)]
  return out


def _expand(pattern: str, flag: str) -> list[str]:
  found = sorted(paths.glob(pattern)) if any(c in pattern for c in "*?[") else []
  if found:
    return found
  if paths.is_file(pattern):
    return [pattern]
  raise ContaminationError(f"{flag} {pattern}: no such file.")


def _cache_folders(root: str) -> list[str]:
  from st5_jax.data import cache  # pylint: disable=g-import-not-at-top
  if paths.is_file(paths.join(root, cache.MANIFEST)):
    return [root]
  found = sorted(os.path.dirname(p) if not paths.is_remote(p) else p.rsplit("/", 1)[0]
                 for p in paths.glob(paths.join(root, "*", "*", cache.MANIFEST)))
  if not found:
    raise ContaminationError(f"--cache {root}: no token cache there ({cache.MANIFEST} neither in it nor in "
                             "<task>/<split>/ under it); write one with `st5 data cache`.")
  return found


def _cache_model(manifest: Mapping[str, Any], folder: str, vocab: str | None) -> bytes:
  """The SentencePiece model a cache was written with: `vocab` (default: the tasks' vocabulary), checked against the
  manifest's vocabulary_sha256 (st5_jax.data.cache.vocabulary_sha256, over the same vocabulary class)."""
  from st5_jax.data import cache, vocabulary  # pylint: disable=g-import-not-at-top
  vocab_obj = vocabulary.T5Vocabulary(vocab) if vocab else vocabulary.get_vocabulary()
  features = manifest["features"]
  task = types.SimpleNamespace(output_features={f["name"]: types.SimpleNamespace(vocabulary=vocab_obj)
                                                for f in features if f["kind"] == "tokens"})
  layout = types.SimpleNamespace(features=[types.SimpleNamespace(task_key=f["name"], is_tokens=f["kind"] == "tokens")
                                           for f in features])
  if cache.vocabulary_sha256(task, layout) != manifest["vocabulary_sha256"]:
    raise ContaminationError(f"--cache {folder} was tokenised with another vocabulary (sha256 "
                             f"{manifest['vocabulary_sha256'][:12]}...) than {vocab or 'the default one'}; pass the "
                             "SentencePiece model it was written with: --vocab PATH.")
  return vocab_obj.sp_model


def plan_training(*, tasks: Sequence[str] = (), split: str = "train", jsonl: Sequence[str] = (),
                  jsonl_fields: Sequence[str] | None = None, caches: Sequence[str] = (),
                  vocab: str | None = None) -> TrainingPlan:
  """The training data as units: tasks or mixtures (their split), JSON-lines files (globs), token cache folders."""
  units: list[Unit] = []
  sources: list[dict[str, Any]] = []
  models: dict[str, bytes] = {}

  def add(kind, payload):
    units.append(Unit(len(units), kind, payload))

  if tasks:
    import seqio  # pylint: disable=g-import-not-at-top
    from st5_jax.data import sources as sources_lib  # pylint: disable=g-import-not-at-top
    from st5_jax.data.offline import beam_cache, cache_writer, overlap_report  # pylint: disable=g-import-not-at-top
    names = []
    for name in tasks:
      provider = seqio.get_mixture_or_task(name)  # ValueError for an unknown name
      names += [t.name for t in provider.tasks] if isinstance(provider, seqio.Mixture) else [name]
    for name in dict.fromkeys(names):
      task = seqio.get_mixture_or_task(name)
      sources.append({"kind": "task", "name": name, "split": split})
      reader = task.source.open(split) if isinstance(task.source, sources_lib.ExampleSource) else None
      if isinstance(reader, (sources_lib.FileSplit, sources_lib.MemorySplit)):
        # The reads the Beam cache distributes: a file, a byte range of a large line file, a chunk of a built split.
        sizes = cache_writer.file_sizes(reader.files) if isinstance(reader, sources_lib.FileSplit) else None
        spec = beam_cache.ReaderSpec.of(reader.reader) if isinstance(reader, sources_lib.FileSplit) else None
        for unit in beam_cache.read_units(reader, sizes):
          add("task", (unit, spec))
        continue
      # Any other split reader (hard negatives) or seqio task (its own source, TFDS, preprocessors): its texts,
      # read here, in chunks.
      if reader is not None:
        texts = [t for ex in reader.iter_examples() for t in _strings(ex.values())]
      else:
        texts = list(overlap_report.task_texts(name, split))
      for start in range(0, len(texts), _CHUNK):
        add("texts", texts[start:start + _CHUNK])
  fields = tuple(jsonl_fields) if jsonl_fields else None
  for pattern in jsonl:
    for path in _expand(pattern, "--jsonl"):
      sources.append({"kind": "jsonl", "name": path, "fields": list(fields) if fields else "every string field"})
      add("jsonl", (path, fields))
  for root in caches:
    from st5_jax.data import cache  # pylint: disable=g-import-not-at-top
    for folder in _cache_folders(root):
      cached = cache.CacheReader(folder)  # CacheError: one line
      m = cached.manifest
      for i in range(cached.num_shards):
        cached.check_size(i)  # a truncated shard fails here, before anything runs
      key = f"vocab{len(models)}"
      models[key] = _cache_model(m, folder, vocab)
      prompts = m.get("prompts") or {}
      features = [(f["name"], f.get("eos_id"), prompts.get(f["name"], "")) for f in m["features"]
                  if f["kind"] == "tokens"]
      sources.append({"kind": "cache", "name": folder, "task": m["task"], "split": m["split"],
                      "features": [f[0] for f in features], "examples": m["num_examples"]})
      for i in range(cached.num_shards):
        add("cache", (folder, i, features, key))
  if not units and not sources:
    raise ContaminationError("no training data: pass --tasks, --jsonl or --cache.")
  return TrainingPlan(units, sources, models)


def processors(models: Mapping[str, bytes]) -> dict[str, Any]:
  """SentencePiece processors of the plan's vocabularies (what `unit_texts` decodes caches with)."""
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  return {k: spm.SentencePieceProcessor(model_proto=v) for k, v in models.items()}


def _jsonl_texts(path: str, fields: Sequence[str] | None) -> Iterator[str]:
  fix = "each line of a JSON-lines training file must be one JSON object: fix or remove the line"
  with paths.open_file(path, "rb") as f:
    for lineno, raw in enumerate(f, 1):
      try:
        line = raw.decode("utf-8")
      except UnicodeDecodeError as e:
        raise ContaminationError(f"{path}:{lineno}: not UTF-8 (byte {e.start + 1} of the line); {fix}") from None
      if lineno == 1:
        line = line.lstrip("\ufeff")
      if not line.strip():
        continue
      try:
        record = json.loads(line)
      except json.JSONDecodeError as e:
        raise ContaminationError(f"{path}:{lineno}: not valid JSON ({e.msg} at column {e.colno}); {fix}") from None
      if not isinstance(record, dict):
        raise ContaminationError(f"{path}:{lineno}: a JSON {type(record).__name__}, not an object; {fix}")
      yield from _strings(record.values() if fields is None else (record.get(k) for k in fields))


def _cache_texts(folder: str, shard: int, features, sp) -> Iterator[str]:
  from tensorflow.core.example import example_pb2  # pylint: disable=g-import-not-at-top
  from st5_jax.data import cache  # pylint: disable=g-import-not-at-top
  size = sp.get_piece_size()
  for record in cache.CacheReader(folder).iter_shard(shard):
    parsed = example_pb2.Example.FromString(record).features.feature
    for name, eos_id, prompt in features:
      ids = [int(i) for i in parsed[name].int64_list.value if i != eos_id and 0 < i < size]
      text = sp.decode(ids)
      head = prompt.strip()
      if head and text.startswith(head):  # the prompt the cache was written with is not the example's text
        text = text[len(head):].lstrip()
      yield text


def unit_texts(unit: Unit, sp: Mapping[str, Any]) -> Iterator[str]:
  """Every text of a unit, in order (`sp`: `processors` of the plan's models, for caches)."""
  if unit.kind == "texts":
    yield from unit.payload
  elif unit.kind == "task":
    from st5_jax.data.offline import beam_cache  # pylint: disable=g-import-not-at-top
    read_unit, spec = unit.payload
    for tag, value in beam_cache.read_unit(read_unit, spec):
      if tag == "row":
        yield from _strings(value[1].values())
  elif unit.kind == "jsonl":
    yield from _jsonl_texts(*unit.payload)
  elif unit.kind == "cache":
    folder, shard, features, key = unit.payload
    yield from _cache_texts(folder, shard, features, sp[key])
  else:
    raise ValueError(unit.kind)


# ----------------------------------------------------------------------------- matching and the report


def side_entries(item: Item, best: tuple) -> list[tuple[tuple[int, str, str], tuple, dict[str, Any]]]:
  """((set, side, kind), sort key, example) per side an item counts in, for its best match (rank, -J, text)."""
  rank, neg_j, train_text = best
  kind = "exact" if rank == 0 else "near"
  key = (item.index,) if rank == 0 else (-neg_j, item.index)  # exact: file order; near: lowest Jaccard first
  example = {"id": item.id, "test_text": item.text, "training_text": train_text, "jaccard": round(-neg_j, 4)}
  return [((item.set_index, side, kind), key, example) for side in item.sides]


def aggregate(entries: Iterable[tuple[tuple[int, str, str], tuple, dict[str, Any]]], show: int) -> dict:
  """{(set, side, kind): (count, the `show` examples of smallest key)} of `side_entries` outputs."""
  counts: dict = {}
  examples: dict = {}
  for group, key, example in entries:
    counts[group] = counts.get(group, 0) + 1
    examples.setdefault(group, []).append((key, example))
  return {g: (counts[g], [e for _, e in heapq.nsmallest(show, examples[g], key=lambda x: x[0])]) for g in counts}


def assemble(test_sets: Sequence[TestSet], groups: Mapping[tuple[int, str, str], tuple[int, list]], *,
             settings: Settings, training: Mapping[str, Any], missing: Sequence[str] = ()) -> dict[str, Any]:
  """The report: settings, what was read, and per test set and side the counts, fraction and examples."""
  out_sets = []
  for index, test_set in enumerate(test_sets):
    sides = {}
    for side in SIDES:
      if side not in test_set.totals:
        continue
      exact, exact_examples = groups.get((index, side, "exact"), (0, []))
      near, near_examples = groups.get((index, side, "near"), (0, []))
      total = test_set.totals[side]
      sides[side] = {"total": total, "exact": exact, "near": near, "contaminated": exact + near,
                     "fraction": (exact + near) / total if total else 0.0,
                     "exact_examples": exact_examples, "near_examples": near_examples}
    out_sets.append({**test_set.describe(), "sides": sides})
  return {"format": FORMAT, "format_version": FORMAT_VERSION, "settings": settings.as_dict(),
          "training": dict(training), "test_sets": out_sets, "missing_test_sets": list(missing),
          "contaminated": any(s["contaminated"] for t in out_sets for s in t["sides"].values())}


class Index:
  """The test texts, for matching training texts one at a time: exact by normalised text, near by MinHash LSH."""

  def __init__(self, items: Sequence[Item], settings: Settings):
    self.settings = settings
    self.signer = Signer(settings.num_perm)
    self.lsh = settings.lsh()
    self.exact: dict[str, list[int]] = {}
    self.shingles: dict[tuple[int, int], frozenset[str]] = {}
    for item in items:
      for v, n in enumerate(item.variants):
        self.exact.setdefault(n, []).append(item.index)
        s = shingles(n, settings.shingle)
        self.shingles[(item.index, v)] = s
        self.lsh.insert((item.index, v), self.signer.sign(s), check_duplication=False)
    self._variants = {(item.index, v): n for item in items for v, n in enumerate(item.variants)}

  def matches(self, n: str, text: str) -> Iterator[tuple[int, tuple]]:
    """(item, (rank, -jaccard, text)) of every test text the training text (normalised: n) matches."""
    for index in self.exact.get(n, ()):
      yield index, (0, -1.0, text)
    s = shingles(n, self.settings.shingle)
    for key in self.lsh.query(self.signer.sign(s)):
      if self._variants[key] == n:
        continue  # exact: above
      j = jaccard(s, self.shingles[key])
      if j >= self.settings.near_threshold:
        yield key[0], (1, -j, text)


def distinct_texts(plan: TrainingPlan) -> tuple[dict[str, str], int]:
  """({normalised text: its smallest original}, texts read) over every unit in order."""
  sp = processors(plan.models)
  distinct: dict[str, str] = {}
  count = 0
  for unit in plan.units:
    for text in unit_texts(unit, sp):
      n = normalize(text)
      if not n:
        continue
      count += 1
      old = distinct.get(n)
      if old is None or text < old:
        distinct[n] = text
  return distinct, count


def check(plan: TrainingPlan, test_sets: Sequence[TestSet], settings: Settings, *,
          missing: Sequence[str] = (), progress: Callable[[str], None] | None = None) -> dict[str, Any]:
  """The report of `plan`'s training texts against `test_sets`, in this process."""
  settings.check()
  items = [item for t in test_sets for item in t.items]
  distinct, count = distinct_texts(plan)
  if progress:
    progress(f"{count} training texts, {len(distinct)} distinct; {len(items)} test texts")
  index = Index(items, settings)
  best: dict[int, tuple] = {}
  for n, text in distinct.items():
    for item_index, match in index.matches(n, text):
      old = best.get(item_index)
      best[item_index] = match if old is None else best_of(old, match)
  entries = (e for i, m in best.items() for e in side_entries(items[i], m))
  training = {"sources": plan.sources, "texts": count, "distinct_texts": len(distinct)}
  return assemble(test_sets, aggregate(entries, settings.show), settings=settings, training=training,
                  missing=missing)


def read_test_sets(*, beir: Sequence[str] = (), mteb: Sequence[str] = (), evaluations: Sequence[str] = (),
              data_dir: str | None = None) -> tuple[list[TestSet], list[str]]:
  """The test sets named (BEIR folders, MTEB tasks by path, evaluation sets) and the evaluation sets not found."""
  builder = _Builder()
  for spec in beir:
    add_beir(builder, spec)
  for spec in mteb:
    add_mteb(builder, spec)
  missing = add_evaluation(builder, evaluations, data_dir) if evaluations else []
  if not builder.sets:
    raise ContaminationError("no test set: pass --beir FOLDER[:SPLIT], --mteb_task [NAME=]PATH or --eval SETS.")
  return builder.sets, missing


# ----------------------------------------------------------------------------- reading and writing reports


def read_report(path: str) -> dict[str, Any]:
  """A report `st5 data overlap --out` wrote; ContaminationError when it is not one."""
  if not paths.is_file(path):
    raise ContaminationError(f"{path}: no such contamination report; write one with `st5 data overlap ... --out "
                             f"{path}`.")
  try:
    report = json.loads(paths.read_text(path))
  except ValueError as e:
    raise ContaminationError(f"{path}: not JSON ({e}); pass the file `st5 data overlap --out` wrote.") from e
  if not isinstance(report, dict) or report.get("format") != FORMAT:
    raise ContaminationError(f"{path}: not a contamination report (format {FORMAT!r} expected); pass the file "
                             "`st5 data overlap --out` wrote.")
  if report.get("format_version") != FORMAT_VERSION:
    raise ContaminationError(f"{path}: contamination report version {report.get('format_version')}, this code reads "
                             f"{FORMAT_VERSION}; rerun `st5 data overlap`.")
  return report


def write_report(report: Mapping[str, Any], path: str) -> None:
  paths.write_text(path, json.dumps(report, indent=1, sort_keys=True, ensure_ascii=False) + "\n")


def summary(report: Mapping[str, Any]) -> str:
  """The report as text: a line per test set and side, then examples."""
  s, t = report["settings"], report["training"]
  lines = [f"Training texts: {t['texts']:,} ({t['distinct_texts']:,} distinct after normalisation) from "
           f"{len(t['sources'])} source(s). Near duplicates: Jaccard >= {s['near_threshold']} of {s['shingles']} "
           f"(MinHash {s['num_perm']} permutations, LSH {s['lsh_bands']} bands x {s['lsh_rows']} rows, verified).",
           "",
           f"{'test set (split)':34} {'side':19} {'exact':>8} {'near':>8} {'total':>9} {'fraction':>9}  MTEB name"]
  for test_set in report["test_sets"]:
    label = test_set["name"] + (f" ({test_set['split']})" if test_set.get("split") else "")
    for side, c in test_set["sides"].items():
      lines.append(f"{label:34} {side:19} {c['exact']:>8,} {c['near']:>8,} {c['total']:>9,} "
                   f"{100 * c['fraction']:>8.2f}%  {test_set.get('mteb_name') or '-'}")
  examples = [(test_set["name"], side, kind, e) for test_set in report["test_sets"]
              for side, c in test_set["sides"].items() for kind in ("exact", "near") for e in c[f"{kind}_examples"]]
  if examples:
    lines += ["", "Examples (training text | test text):"]
    for name, side, kind, e in examples:
      lines.append(f"  {name} {side} {kind} (Jaccard {e['jaccard']:.2f}): {e['training_text'][:70]!r} | "
                   f"{e['test_text'][:70]!r}")
  if report.get("missing_test_sets"):
    lines += ["", "Test sets not checked (files missing):"] + [f"  {m}" for m in report["missing_test_sets"]]
  lines += ["", "Contamination found." if report["contaminated"] else "No contamination found."]
  return "\n".join(lines)
