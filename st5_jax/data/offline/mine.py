"""`st5 data mine`: K hard negatives per query, mined with BM25 or a dense model, as training JSON lines.

    pairs = read_pairs(["pairs.jsonl"])
    report = mine(pairs, positives_corpus(pairs), "mined/", MineConfig(num_negatives=7))   # every process

Input: (query, positive) pairs -- a JSON lines, TSV or CSV file (`read_pairs`) or a registered pair task's
split (`task_pairs`); rows with the same query text become one query with several positives. Corpus: files as
`st5 index` reads them (`files_corpus`) or, by default, the distinct positives themselves (`positives_corpus`).

Per query: the `range_max` best documents are retrieved (`bm25`: st5_jax.retrieval.bm25, Lucene's BM25 over
the corpus, and only documents sharing a term with the query, as Lucene returns; `dense`: the query's embedding
against a st5_jax.retrieval.index folder, exact search on the devices). Candidates are then dropped as false
negatives, each counted under the first reason that applies, in this order:

  range_min          its rank (0-based, among the retrieved, positives included) is below range_min
                     (FlagEmbedding's `range_for_sampling` lower end);
  positive           its text is one of the query's positives (always);
  equal_to_positive  its text equals a positive's after st5_jax.data.overlap.normalize (NFKC, lower case,
                     letters and digits); off with keep_equal_to_positive;
  margin             score > p - margin, p the query's lowest positive score (sentence-transformers'
                     absolute_margin);
  relative_margin    score > p - |p| * relative_margin (sentence-transformers' relative_margin; p * (1 -
                     relative_margin) when p >= 0, and still below p when p < 0).

Of the survivors, `num_negatives` are kept: the best (`sampling="top"`) or a uniform draw
(`sampling="random"`, from `default_rng([seed, query index])`, kept in rank order). A query with fewer
survivors keeps what there is (counted as short; training repeats some, st5_jax.data.sources.sample_negatives).

Output folder (local or gs://):

  part-00000.jsonl   queries [0, shard_size) in input order, one a line:
                     {"query": str, "pos": [str, ...], "neg": [str, ...]} (FlagEmbedding's and Tevatron's
                     training format), plus "neg_ids" (corpus ids) with with_ids and "pos_scores" /
                     "neg_scores" with with_scores (FlagEmbedding's distillation keys)
  part-00000.json    its counts, sha256 and the run's identity (and input_identity: the same without the
                     scorer, checked before anything is written): written last, it marks the part finished
  ...
  corpus.jsonl       (dense, corpus = the positives) the positives as a corpus file, ids p0, p1, ...
  index/             (dense without an index given) the corpus's st5 index
  manifest.json      written last, by the lead: settings, input, corpus, counts (queries, candidates, filtered
                     by reason, mined, short and empty queries), the parts. No times, paths of --out, hosts or
                     process counts: the same run on 1 or 2 processes writes the same bytes (dense scores
                     may differ in their last digits with the devices a host encodes on).

Processes: the queries are split into parts of `shard_size`; part s is mined by process s % P (each on its own
devices for dense; no collective crosses processes but st5 index's and the barriers), the lead writes the
manifest after a barrier. Sharded processes rather than a Beam pipeline: dense mining needs the model on the
accelerators the training hosts have, which Beam workers lack, and BM25 over an in-memory corpus parallelises
over queries just as well. Resumable: a rerun keeps every part whose JSON matches the run and whose
lines still hash to it, and mines the rest; an --out holding parts of another run is refused (MineMismatchError)
before anything is written to it.
Memory: every process holds the pairs, the corpus texts and (bm25) its index; searching is blocked
(st5_jax.retrieval.search), so no [queries, corpus] matrix is ever made.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import os
import time
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from st5_jax import parts as parts_lib
from st5_jax.parts import part_name
from st5_jax import paths
from st5_jax.data import overlap
from st5_jax.data import rows as rows_lib
from st5_jax.data.rows import RowStats
from st5_jax.errors import BadRowError, InputFileError
from st5_jax.retrieval import corpus_files

log = logging.getLogger(__name__)

FORMAT = "st5-mined/1"
MANIFEST = "manifest.json"
DEFAULT_SHARD_SIZE = 10_000  # queries a part file
METHODS = ("bm25", "dense")
SAMPLING = ("top", "random")
REASONS = ("range_min", "positive", "equal_to_positive", "margin", "relative_margin")


class MineMismatchError(ValueError):
  """--out holds parts or a manifest of another mining run."""


@dataclasses.dataclass(frozen=True)
class MineConfig:
  """What is mined and how (the module docstring); every field is in the manifest and the run's identity."""

  method: str = "bm25"
  num_negatives: int = 15  # FlagEmbedding's default; training samples its K from them every epoch
  range_min: int = 0
  range_max: int = 100  # SEED-Encoder's and ANCE's top-100
  margin: float | None = None
  relative_margin: float | None = None
  keep_equal_to_positive: bool = False
  sampling: str = "top"
  seed: int = 0
  k1: float = 1.5  # bm25: st5_jax.retrieval.bm25's defaults
  b: float = 0.75
  with_ids: bool = False
  with_scores: bool = False

  def check(self) -> None:
    """One ValueError naming the setting, for anything out of range."""
    if self.method not in METHODS:
      raise ValueError(f"method must be one of {', '.join(METHODS)}, got {self.method!r}")
    if self.sampling not in SAMPLING:
      raise ValueError(f"sampling must be one of {', '.join(SAMPLING)}, got {self.sampling!r}")
    if self.num_negatives < 1:
      raise ValueError(f"num_negatives must be >= 1, got {self.num_negatives}")
    if self.range_min < 0 or self.range_max < 1:
      raise ValueError(f"range_min must be >= 0 and range_max >= 1, got {self.range_min} and {self.range_max}")
    if self.range_max - self.range_min < self.num_negatives:
      raise ValueError(f"ranks [range_min, range_max) = [{self.range_min}, {self.range_max}) hold fewer than "
                       f"num_negatives={self.num_negatives} candidates; raise range_max or lower the others")
    if self.margin is not None and self.margin < 0:
      raise ValueError(f"margin must be >= 0, got {self.margin}")
    if self.relative_margin is not None and not 0 <= self.relative_margin <= 1:
      raise ValueError(f"relative_margin must be in [0, 1], got {self.relative_margin}")
    if self.k1 < 0 or not 0 <= self.b <= 1:
      raise ValueError(f"BM25 needs k1 >= 0 and 0 <= b <= 1, got k1={self.k1}, b={self.b}")


# ------------------------------------------------------------------------------------------------ input


@dataclasses.dataclass
class Pairs:
  """Distinct queries in first-seen order, each with its distinct positives; where they came from."""

  queries: list[str]
  positives: list[list[str]]
  source: dict
  stats: dict = dataclasses.field(default_factory=dict)

  @property
  def fingerprint(self) -> str:
    return parts_lib.sha256(json.dumps([self.queries, self.positives], ensure_ascii=False).encode())


def group_pairs(pairs: Iterable[tuple[str, Sequence[str]]]) -> tuple[list[str], list[list[str]]]:
  """(queries, positives): rows of the same query text joined, positives deduplicated, order kept."""
  where: dict[str, int] = {}
  queries: list[str] = []
  positives: list[list[str]] = []
  for query, pos in pairs:
    if query not in where:
      where[query] = len(queries)
      queries.append(query)
      positives.append([])
    mine = positives[where[query]]
    mine.extend(p for p in pos if p not in mine)
  return queries, positives


def read_pairs(files: str | Sequence[str], *, columns: Mapping[str, str | int] | None = None,
               fmt: str | None = None, strict: bool = False) -> Pairs:
  """Pairs from users' files: JSON lines {query, pos} (pos a string or a list: FlagEmbedding's input; `neg` is
  ignored), or TSV/CSV/TFRecord rows read as users' tasks are (st5_jax.data.rows). columns: `query` and `pos`
  keys or columns (default: query/pos; TSV/CSV: columns 0 and 1). Bad rows are skipped and counted."""
  files = rows_lib.list_files(files)
  fmt = fmt or rows_lib.infer_format(files[0])
  columns = dict(columns or {})
  unknown = set(columns) - {"query", "pos"}
  if unknown:
    raise ValueError(f"pair columns are query and pos, got {sorted(unknown)}")
  stats = RowStats()
  if fmt == "jsonl":
    keys = (columns.get("query", "query"), columns.get("pos", "pos"), "neg")
    pairs = _jsonl_pairs(files, keys, stats, strict)
  else:
    default = (0, 1) if fmt in ("tsv", "csv") else ("query", "pos")
    row_format = rows_lib.RowFormat(fmt, {"inputs": columns.get("query", default[0]),
                                          "targets": columns.get("pos", default[1])})
    reader = rows_lib.RowReader(files, row_format, strict=strict)
    pairs = ((ex["inputs"], [ex["targets"]]) for ex in reader.iter_examples(stats=stats))
  queries, positives = group_pairs(pairs)
  if not queries:
    raise InputFileError(f"no usable pair in {', '.join(files)} (rows skipped: {stats.rows_skipped}, e.g. "
                         f"{stats.first_skipped[:1]})")
  return Pairs(queries, positives, {"files": files, "format": fmt, "columns": columns}, stats.as_dict())


def _jsonl_pairs(files: Sequence[str], keys: Sequence[str], stats: RowStats, strict: bool):
  for path in files:
    for line, record in rows_lib.iter_jsonl_records(path):
      stats.rows_read += 1
      values = record if isinstance(record, str) else rows_lib.hard_negative_values(record, keys,
                                                                                   need_negatives=False)
      if isinstance(values, str):
        if strict:
          raise BadRowError(f"{path}:{line}: {values} (strict mode; drop --strict to skip and count bad rows)")
        stats.skip(f"{path}:{line}", values, kind=values.split(" (")[0])
        continue
      yield values[0], values[1]


def task_pairs(name: str, split: str = "train") -> Pairs:
  """Pairs of a registered pair task or mixture (its tasks in order) of this project's sources: inputs -> targets."""
  import seqio  # pylint: disable=g-import-not-at-top

  from st5_jax.data import sources, streams  # pylint: disable=g-import-not-at-top

  provider = streams.get_provider(name)
  tasks = list(provider.tasks) if isinstance(provider, seqio.Mixture) else [provider]
  stats = RowStats()
  pairs = []
  for task in tasks:
    source = task.source
    if not isinstance(source, sources.ExampleSource) or not {"inputs", "targets"} <= set(source.features):
      raise ValueError(f"task {task.name} is not a pair task of this project's sources (inputs, targets); write its "
                       "pairs to a JSON lines file and pass --pairs")
    pairs.extend((ex["inputs"], [ex["targets"]]) for ex in source.open(split).iter_examples(stats=stats))
  queries, positives = group_pairs(pairs)
  if not queries:
    raise ValueError(f"task {name} split {split!r} has no pairs")
  return Pairs(queries, positives, {"task": name, "split": split, "tasks": [t.name for t in tasks]}, stats.as_dict())


@dataclasses.dataclass
class Corpus:
  """Document ids and texts in corpus order, what they are and their fingerprint."""

  ids: list[str]
  texts: list[str]
  source: dict
  fingerprint: str
  files: list[str] | None = None  # the files `st5 index` reads for it (None: the positives, written when needed)


def positives_corpus(pairs: Pairs) -> Corpus:
  """The distinct positives of every query, first-seen order, ids p0, p1, ... (the default corpus)."""
  texts = list(dict.fromkeys(p for pos in pairs.positives for p in pos))
  return Corpus([f"p{i}" for i in range(len(texts))], texts, {"positives": True},
                parts_lib.sha256(json.dumps(texts, ensure_ascii=False).encode()))


def files_corpus(files: str | Sequence[str], *, fmt: str | None = None) -> Corpus:
  """A corpus from files as `st5 index` reads them (st5_jax.retrieval.corpus_files)."""
  files = corpus_files.expand(files)
  scan = corpus_files.scan(files, fmt=fmt)
  if not scan.rows:
    raise InputFileError(f"no documents in {', '.join(files)}")
  ids, texts = corpus_files.read_all(files, folder_file="corpus.jsonl", fmt=fmt)
  return Corpus(ids, texts, {"files": [f.path for f in scan.files], "documents": scan.rows}, scan.fingerprint,
                files=files)


# ------------------------------------------------------------------------------------------------ selection


class _Normalized:
  """overlap.normalize of corpus texts, computed once per document asked for."""

  def __init__(self, texts: Sequence[str]):
    self.texts, self._cache = texts, {}

  def __getitem__(self, i: int) -> str:
    got = self._cache.get(i)
    if got is None:
      got = self._cache[i] = overlap.normalize(self.texts[i])
    return got


def select_negatives(ranked_R: np.ndarray, scores_R: np.ndarray, *, positives: Sequence[str],
                     positive_scores_P: np.ndarray, corpus_texts: Sequence[str], config: MineConfig,
                     query_index: int, normalized: Any = None) -> tuple[list[int], collections.Counter]:
  """(ranks kept, candidates dropped by reason) of one query's retrieved documents (best first).

  ranked_R: corpus indices, scores_R: their scores; the filters and sampling of the module docstring.
  """
  normalized = normalized if normalized is not None else _Normalized(corpus_texts)
  dropped: collections.Counter = collections.Counter()
  exact = set(positives)
  norms = set() if config.keep_equal_to_positive else {n for n in map(overlap.normalize, positives) if n}
  floor = float(np.min(positive_scores_P))
  margin_limit = floor - config.margin if config.margin is not None else None
  relative_limit = floor - abs(floor) * config.relative_margin if config.relative_margin is not None else None
  kept = []
  for rank, (i, score) in enumerate(zip(ranked_R.tolist(), scores_R.tolist())):
    if rank < config.range_min:
      reason = "range_min"
    elif corpus_texts[i] in exact:
      reason = "positive"
    elif norms and normalized[i] in norms:
      reason = "equal_to_positive"
    elif margin_limit is not None and score > margin_limit:
      reason = "margin"
    elif relative_limit is not None and score > relative_limit:
      reason = "relative_margin"
    else:
      kept.append(rank)
      continue
    dropped[reason] += 1
  k = config.num_negatives
  if len(kept) > k:
    if config.sampling == "top":
      kept = kept[:k]
    else:
      rng = np.random.default_rng([config.seed, query_index])
      kept = sorted(np.asarray(kept)[rng.choice(len(kept), size=k, replace=False)].tolist())
  return kept, dropped


# ------------------------------------------------------------------------------------------------ scorers


def top_matches(scores_N: np.ndarray, k: int) -> np.ndarray:
  """Indices of the (at most) k best documents with a positive score: score descending, then the lower index
  (st5_jax.retrieval.bm25.BM25.search's order, without sorting the whole corpus)."""
  matched = np.flatnonzero(scores_N > 0)
  if len(matched) > k:
    s = scores_N[matched]
    threshold = s[np.argpartition(-s, k - 1)[k - 1]]  # the k-th best score
    above = matched[s > threshold]
    matched = np.concatenate([above, matched[s == threshold][:k - len(above)]])
  return matched[np.lexsort((matched, -scores_N[matched]))]


class Bm25Scorer:
  """Candidates and positive scores of queries by BM25 over the corpus (st5_jax.retrieval.bm25)."""

  def __init__(self, corpus: Corpus, *, k1: float, b: float):
    # Here, not at the top: importing bm25s starts a JAX backend, which must wait for jax.distributed.initialize.
    from st5_jax.retrieval import bm25 as bm25_lib  # pylint: disable=g-import-not-at-top

    self._tokenize = bm25_lib.tokenize
    self.bm25 = bm25_lib.BM25(corpus.texts, k1=k1, b=b)
    self.k1, self.b = k1, b
    self.texts = corpus.texts
    self._where = {t: i for i, t in reversed(list(enumerate(corpus.texts)))}  # a text's first index
    self._stats: tuple[dict[str, int], float] | None = None

  def _corpus_stats(self) -> tuple[dict[str, int], float]:
    """(document frequency of each term, average document length): for positives outside the corpus."""
    if self._stats is None:
      df: collections.Counter = collections.Counter()
      total = 0
      for text in self.texts:
        tokens = self._tokenize(text)
        total += len(tokens)
        df.update(set(tokens))
      self._stats = (dict(df), total / len(self.texts))
    return self._stats

  def score_text(self, query: str, text: str) -> float:
    """BM25 of a text that is not in the corpus, as if it were one more document leaving the corpus statistics
    unchanged (the formula of st5_jax.retrieval.bm25)."""
    df, avgdl = self._corpus_stats()
    tokens = self._tokenize(text)
    tf = collections.Counter(tokens)
    n = len(self.texts)
    norm = self.k1 * (1 - self.b + self.b * len(tokens) / avgdl)
    score = 0.0
    for t in self._tokenize(query):
      if t in df and tf[t]:
        score += np.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5)) * tf[t] / (tf[t] + norm)
    return score

  def shard(self, queries: Sequence[str], positives: Sequence[Sequence[str]],
            depth: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per query: (corpus indices [R], scores [R], positive scores [P]), R <= depth."""
    out = []
    for query, pos in zip(queries, positives):
      s_N = self.bm25.scores(query)
      top = top_matches(s_N, depth)
      pos_P = np.asarray([s_N[self._where[p]] if p in self._where else self.score_text(query, p) for p in pos],
                         np.float32)
      out.append((top, s_N[top], pos_P))
    return out


class DenseScorer:
  """Candidates by exact search over an index on the devices; positives scored by the same query encoder."""

  def __init__(self, index: Any, model: Any, *, batch_size: int = 64, devices: Sequence[Any] | None = None):
    from st5_jax.retrieval import index as index_lib  # pylint: disable=g-import-not-at-top

    self.index = index
    self.encoder = index_lib.MeshEncoder(model, devices=devices, batch_size=batch_size)
    # The model's query / document prompts, as st5 search and st5 index (the corpus) use them.
    self.prompts = {side: index_lib.side_prompt(model, side) for side in ("query", "document")}

  def shard(self, queries: Sequence[str], positives: Sequence[Sequence[str]],
            depth: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    from st5_jax.retrieval import search  # pylint: disable=g-import-not-at-top

    q_QxD = self.encoder.encode(list(queries), side="query", prompt=self.prompts["query"])
    scores_QxR, indices_QxR = search.search_index(self.index, q_QxD, depth, method="exact",
                                                  devices=list(self.encoder.mesh.devices.flat))
    flat = [p for pos in positives for p in pos]
    p_PxD = self.encoder.encode(flat, side="document", prompt=self.prompts["document"])
    out, start = [], 0
    for q, (s_R, i_R, pos) in enumerate(zip(scores_QxR, indices_QxR, positives)):
      pos_P = p_PxD[start:start + len(pos)] @ q_QxD[q]
      start += len(pos)
      out.append((i_R, s_R, pos_P.astype(np.float32)))
    return out


# ------------------------------------------------------------------------------------------------ parts


def mine_rows(pairs: Pairs, corpus: Corpus, scorer: Any, config: MineConfig, start: int,
              stop: int) -> tuple[list[dict], dict]:
  """The output rows of queries [start, stop) and their counts."""
  counts = {"queries": stop - start, "candidates": 0, "filtered": dict.fromkeys(REASONS, 0), "mined": 0,
            "short": 0, "empty": 0}
  found = scorer.shard(pairs.queries[start:stop], pairs.positives[start:stop], config.range_max)
  normalized = _Normalized(corpus.texts)
  rows = []
  for q, (ranked_R, scores_R, pos_P) in enumerate(found, start):
    ranks, dropped = select_negatives(ranked_R, scores_R, positives=pairs.positives[q], positive_scores_P=pos_P,
                                      corpus_texts=corpus.texts, config=config, query_index=q,
                                      normalized=normalized)
    chosen = [int(ranked_R[r]) for r in ranks]
    row = {"query": pairs.queries[q], "pos": pairs.positives[q], "neg": [corpus.texts[i] for i in chosen]}
    if config.with_ids:
      row["neg_ids"] = [corpus.ids[i] for i in chosen]
    if config.with_scores:
      row["pos_scores"] = [round(float(s), 6) for s in pos_P]
      row["neg_scores"] = [round(float(scores_R[r]), 6) for r in ranks]
    rows.append(row)
    counts["candidates"] += len(ranked_R)
    for reason, n in dropped.items():
      counts["filtered"][reason] += n
    counts["mined"] += len(chosen)
    counts["short"] += len(chosen) < config.num_negatives
    counts["empty"] += not chosen
  return rows, counts


def _encode_rows(rows: Sequence[dict]) -> bytes:
  return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode()


def _finished(out: str, s: int, identity: str, queries: int) -> tuple[bool, str]:
  """(True, "") when part s is complete and belongs to this run; else (False, why)."""
  return parts_lib.part_finished(
      out, s, data_suffix=".jsonl", what="lines",
      matches=lambda meta: meta.get("identity") == identity and meta.get("counts", {}).get("queries") == queries)


def _check_no_mixing(out: str, describe: str, *, identity: str | None = None,
                     input_identity: str | None = None) -> None:
  """MineMismatchError when out's manifest or a part JSON is of another run: another identity, or another
  input_identity (settings, pairs, corpus, shard size: known before dense mining writes out/corpus.jsonl and
  out/index; absent from parts of older versions, which the identity check after the setup still refuses)."""
  for name, meta in parts_lib.folder_records(out, MANIFEST):
    other_identity = identity is not None and meta.get("identity") != identity
    other_inputs = input_identity is not None and "input_identity" in meta and meta["input_identity"] != input_identity
    if other_identity or other_inputs:
      raise MineMismatchError(f"{out} holds mined negatives of another run ({name}: {meta.get('describe')}); this "
                              f"run: {describe}. Pass another --out, or delete {out} to mine again")


# ------------------------------------------------------------------------------------------------ the run


@dataclasses.dataclass
class MineReport:
  """What one process did, and the manifest when it is the lead."""

  process: int
  processes: int
  parts: int
  mined: list[int]
  skipped: list[int]
  seconds: float = 0.0
  manifest: dict | None = None


def mine(pairs: Pairs, corpus: Corpus, out: str, config: MineConfig, *, model: str | None = None,
         index_dir: str | None = None, batch_size: int = 64, max_length: int | None = None,
         checkpoint: str = "auto", shard_size: int = DEFAULT_SHARD_SIZE, devices: Sequence[Any] | None = None,
         progress: Callable[[str], None] | None = None) -> MineReport:
  """Mines every part of `out` this process owns; the lead then writes the manifest. Every process calls it.

  dense: `index_dir` (an `st5 index` folder of this corpus, in the same order) or else an index of the corpus
  built under out/index with `model`; queries and positives are encoded by `model`, else the index's own.
  """
  import jax  # pylint: disable=g-import-not-at-top

  from st5_jax import multihost  # pylint: disable=g-import-not-at-top

  say = progress or log.info
  config.check()
  if shard_size < 1:
    raise ValueError(f"shard_size must be >= 1, got {shard_size}")
  if config.method == "dense" and model is None and index_dir is None:
    raise ValueError("dense mining needs a model (--model) or an index built with one (--index)")
  out = os.fspath(paths.path(out))
  if paths.exists(out) and not paths.is_dir(out):
    raise NotADirectoryError(f"--out {out} is a file; mined negatives are a folder")
  proc, procs = jax.process_index(), jax.process_count()

  inputs = {"settings": dataclasses.asdict(config), "pairs": pairs.fingerprint, "corpus": corpus.fingerprint,
            "shard_size": shard_size}
  input_identity = parts_lib.sha256(json.dumps(inputs, sort_keys=True).encode())
  describe = (f"{config.method} k={config.num_negatives} range=[{config.range_min}, {config.range_max}) over "
              f"{len(pairs.queries)} queries (pairs {pairs.fingerprint[:12]}), corpus {corpus.fingerprint[:12]}")
  # Before anything is written (dense: out/corpus.jsonl, out/index): another run's folder is left as it is.
  _check_no_mixing(out, describe, input_identity=input_identity)
  index, loaded, scorer_info = None, None, {"method": config.method}
  if config.method == "bm25":
    scorer_info.update(k1=config.k1, b=config.b)
  else:
    index, loaded, scorer_info = _dense_setup(corpus, out, model=model, index_dir=index_dir, batch_size=batch_size,
                                              max_length=max_length, checkpoint=checkpoint, devices=devices, say=say)
  ident = dict(inputs, scorer=scorer_info)
  identity = parts_lib.sha256(json.dumps(ident, sort_keys=True).encode())
  _check_no_mixing(out, describe, identity=identity)  # the scorer too (dense: the model, the index)
  paths.mkdir(out)

  n = len(pairs.queries)
  num_parts = -(-n // shard_size)
  owned = [s for s in range(num_parts) if s % procs == proc]
  paths.remove_interrupted_writes(out, "part", set(owned))  # a killed write's temporary files
  todo, skipped = [], []
  for s in owned:
    done, why = _finished(out, s, identity, min(shard_size, n - s * shard_size))
    if done:
      skipped.append(s)
      say(f"{part_name(s)}: finished by an earlier run, kept")
    else:
      todo.append(s)
      if why != "no part JSON":
        say(f"{part_name(s)}: {why}; mining it again")
  report = MineReport(process=proc, processes=procs, parts=num_parts, mined=[], skipped=skipped)
  if todo:
    if config.method == "bm25":
      start = time.perf_counter()
      scorer = Bm25Scorer(corpus, k1=config.k1, b=config.b)
      say(f"BM25 over {len(corpus.texts)} documents indexed in {time.perf_counter() - start:.1f}s")
    else:
      scorer = DenseScorer(index, loaded, batch_size=batch_size, devices=devices)
    for s in todo:
      start = time.perf_counter()
      lo, hi = s * shard_size, min(n, (s + 1) * shard_size)
      rows, counts = mine_rows(pairs, corpus, scorer, config, lo, hi)
      data = _encode_rows(rows)
      meta = {"part": s, "identity": identity, "input_identity": input_identity, "describe": describe,
              "counts": counts, "sha256": parts_lib.sha256(data)}
      paths.write_bytes(paths.join(out, part_name(s) + ".jsonl"), data)
      paths.write_bytes(paths.join(out, part_name(s) + ".json"), parts_lib.dumps(meta))  # last: the part is finished
      seconds = time.perf_counter() - start
      report.mined.append(s)
      report.seconds += seconds
      say(f"{part_name(s)}: {hi - lo} queries, {counts['mined']} negatives ({counts['short']} queries short of "
          f"{config.num_negatives}) in {seconds:.1f}s")
  multihost.barrier("st5_mine:parts")
  if multihost.is_lead():
    report.manifest = _finish(out, num_parts=num_parts, identity=identity, input_identity=input_identity,
                              ident=ident, pairs=pairs, corpus=corpus, index_dir=index_dir)
  multihost.barrier("st5_mine:manifest")
  return report


def _dense_setup(corpus: Corpus, out: str, *, model, index_dir, batch_size, max_length, checkpoint, devices,
                 say) -> tuple[Any, Any, dict]:
  """(index, query model, what identifies them) for dense mining; builds out/index when no index is given."""
  from st5_jax import multihost  # pylint: disable=g-import-not-at-top
  from st5_jax.retrieval import index as index_lib  # pylint: disable=g-import-not-at-top
  from st5_jax.retrieval import search  # pylint: disable=g-import-not-at-top

  if index_dir is None:
    files = corpus.files
    if files is None:  # the positives: written once, read by st5 index on every process
      target = paths.join(out, "corpus.jsonl")
      if multihost.is_lead():
        paths.write_text(target, "".join(json.dumps({"_id": i, "text": t}, ensure_ascii=False) + "\n"
                                         for i, t in zip(corpus.ids, corpus.texts)))
      multihost.barrier("st5_mine:corpus")
      files = [target]
    index_dir = paths.join(out, "index")
    try:
      index_lib.build_index(model, files, index_dir, batch_size=batch_size, max_length=max_length,
                            checkpoint=checkpoint, ann="none", devices=devices, progress=say)
    except index_lib.IndexMismatchError as e:  # the same inputs mined with another model before: refused untouched
      raise MineMismatchError(f"{out} holds mined negatives of another run, whose index/ is of another model or "
                              f"corpus; pass another --out, or delete {out} to mine again ({e})") from e
  index = index_lib.Index.open(index_dir)
  if index.ids != corpus.ids:
    raise ValueError(f"the index {index_dir} holds {len(index)} documents whose ids are not the corpus's "
                     f"{len(corpus.ids)} in order; pass the corpus the index was built from (--corpus), or no --index")
  loaded = search.query_model(index, model=model, max_length=max_length, checkpoint=checkpoint)
  built = index.manifest["model"] or {}
  return index, loaded, {"method": "dense", "model_fingerprint": loaded.fingerprint,
                         "index_model_fingerprint": built.get("fingerprint"),
                         "index_corpus_fingerprint": index.manifest["corpus"]["fingerprint"]}


def _finish(out: str, *, num_parts: int, identity: str, input_identity: str, ident: dict, pairs: Pairs,
            corpus: Corpus, index_dir: str | None) -> dict:
  """The lead, after every process's parts are written: the manifest."""
  totals = {"queries": 0, "candidates": 0, "filtered": dict.fromkeys(REASONS, 0), "mined": 0, "short": 0,
            "empty": 0}
  parts = []
  for s in range(num_parts):
    meta = parts_lib.read_json(paths.join(out, part_name(s) + ".json"))
    if meta is None or meta.get("identity") != identity:
      raise RuntimeError(f"{part_name(s)} of {out} was not written (did the process that mines it fail?); rerun "
                         "the command to resume")
    c = meta["counts"]
    for key in ("queries", "candidates", "mined", "short", "empty"):
      totals[key] += c[key]
    for reason in REASONS:
      totals["filtered"][reason] += c["filtered"][reason]
    parts.append({"name": part_name(s) + ".jsonl", "queries": c["queries"], "sha256": meta["sha256"]})
  manifest = {
      "format": FORMAT, "identity": identity, "input_identity": input_identity,
      "describe": meta["describe"] if parts else "",
      "settings": ident["settings"], "scorer": dict(ident["scorer"], index=index_dir),
      "shard_size": ident["shard_size"],
      "pairs": {"source": pairs.source, "fingerprint": pairs.fingerprint, "rows": pairs.stats},
      "corpus": {"source": corpus.source, "documents": len(corpus.ids), "fingerprint": corpus.fingerprint},
      "counts": totals, "parts": parts, "train_files": "part-*.jsonl"}
  paths.write_bytes(paths.join(out, MANIFEST), parts_lib.dumps(manifest))
  return manifest
