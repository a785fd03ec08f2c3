"""Run files (local or gs://): TREC's `qid Q0 docid rank score tag` and JSON lines; BEIR qrels.

TREC: one line per retrieved document, ranks 1.. in trec_eval's order (score descending,
then doc id descending), scores written with Python's shortest round-trip repr (read back
bit for bit). Ids and the tag must be free of whitespace (the format splits on it).

JSON lines: one object per query, the documents in the same order,
  {"query_id": "q1", "results": [{"corpus_id": "d7", "score": 0.83}, ...]}
(the keys of sentence-transformers' InformationRetrievalEvaluator predictions file).

Writers build the file in memory and write it whole (st5_jax.paths.write_text: a temp file
renamed into place locally; a GCS object appears whole on close), so a reader never sees
half a run. Readers report a malformed line as a RetrievalDataError, `file:line: ...`.
"""

from __future__ import annotations

import json
import math
import os
import re

from st5_jax import paths
from st5_jax.retrieval.beir import RetrievalDataError, read_qrels, text_lines  # noqa: F401  (read_qrels: re-exported)
from st5_jax.retrieval.metrics import Run, ranked

_TOKEN = re.compile(r"\S+")
_SPACE = re.compile(r"\s")
_RUN_FIX = "pass a run file written by `st5 search` (TREC or JSON lines)"


def _check_token(value: str, what: str) -> str:
  if not isinstance(value, str) or not _TOKEN.fullmatch(value):
    raise ValueError(f"{what} {value!r} cannot go in a TREC run file: it must be a non-empty string without "
                     "whitespace")
  return value


def write_trec(path: paths.PathLike, run: Run, *, tag: str) -> None:
  """`qid Q0 docid rank score tag` lines, queries in the run's order, documents in trec_eval's."""
  _check_token(tag, "tag")
  lines = []
  for qid, scores in run.items():
    _check_token(qid, "query id")
    order = ranked(scores)
    if not all(isinstance(d, str) and d for d in order) or _SPACE.search("".join(order)):  # names the culprit:
      for did in order:
        _check_token(did, "document id")
    lines.extend(f"{qid} Q0 {did} {rank} {float(scores[did])!r} {tag}\n" for rank, did in enumerate(order, 1))
  paths.write_text(path, "".join(lines))


def read_trec(path: paths.PathLike) -> dict[str, dict[str, float]]:
  """query id -> {doc id: score} of a TREC run file (the rank column is checked, not used: trec_eval re-sorts)."""
  path = os.fspath(path)
  fix = "each line of a TREC run is `qid Q0 docid rank score tag`"
  run: dict[str, dict[str, float]] = {}
  for lineno, line in text_lines(path, "the run file", _RUN_FIX):
    fields = line.split()
    if len(fields) != 6:
      raise RetrievalDataError(f"{path}:{lineno}: {len(fields)} columns, not 6; {fix}")
    qid, _, did, rank, score, _ = fields
    try:
      int(rank)
      value = float(score)
    except ValueError:
      raise RetrievalDataError(f"{path}:{lineno}: rank {rank!r} or score {score!r} is not a number; {fix}") from None
    if math.isnan(value):
      raise RetrievalDataError(f"{path}:{lineno}: score is NaN; every score must be a number")
    hits = run.setdefault(qid, {})
    if did in hits:
      raise RetrievalDataError(f"{path}:{lineno}: document {did!r} retrieved twice for query {qid!r}; "
                               "keep one line per (query, document)")
    hits[did] = value
  return run


def write_jsonl(path: paths.PathLike, run: Run, *, k: int | None = None) -> None:
  """One JSON object per query: its documents in trec_eval's order, the first `k` of them when k is given."""
  if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
    raise ValueError(f"write_jsonl: k must be a positive integer or None, got {k!r}")
  lines = []
  for qid, scores in run.items():
    results = [{"corpus_id": did, "score": float(scores[did])} for did in ranked(scores, k)]
    lines.append(json.dumps({"query_id": qid, "results": results}, ensure_ascii=False) + "\n")
  paths.write_text(path, "".join(lines))


def read_jsonl(path: paths.PathLike) -> dict[str, dict[str, float]]:
  """The run a `write_jsonl` file holds."""
  path = os.fspath(path)
  fix = 'each line must be {"query_id": ..., "results": [{"corpus_id": ..., "score": ...}, ...]}'
  run: dict[str, dict[str, float]] = {}
  for lineno, line in text_lines(path, "the run file", _RUN_FIX):
    try:
      record = json.loads(line)
      qid, results = record["query_id"], record["results"]
      hits = {r["corpus_id"]: float(r["score"]) for r in results}
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
      raise RetrievalDataError(f"{path}:{lineno}: not a run line ({type(e).__name__}: {e}); {fix}") from None
    if not isinstance(qid, str) or not all(isinstance(d, str) for d in hits):
      raise RetrievalDataError(f"{path}:{lineno}: query and corpus ids must be strings; {fix}")
    if qid in run:
      raise RetrievalDataError(f"{path}:{lineno}: query {qid!r} appears twice; keep one line per query")
    if len(hits) != len(results):
      raise RetrievalDataError(f"{path}:{lineno}: a document is listed twice for query {qid!r}; {fix}")
    run[qid] = hits
  return run
