"""BEIR-format retrieval folders (the layout BEIR and MTEB use), local or gs://.

  FOLDER/corpus.jsonl       one JSON object a line: "_id", "text", optional "title" (other fields ignored)
  FOLDER/queries.jsonl      one JSON object a line: "_id", "text"
  FOLDER/qrels/SPLIT.tsv    header `query-id<TAB>corpus-id<TAB>score`, then one row per judgement

A document's text is its title and text joined with a space (title first, when non-empty).
Qrels scores are integers; a score <= 0 is "not relevant", and a query with no relevant
document in the split is left out (counted in `RetrievalData.stats`). A qrels file may also
be in TREC's 4-column form (`qid iter docid rel`, whitespace-separated).

Anything inconsistent is a `RetrievalDataError` whose message is one line,
`file:line: what is wrong; what to do`: a missing file, a line that is not a JSON object,
a missing "_id" / "text", a duplicate id, an empty corpus or queries file, a qrels row that
names a query absent from queries.jsonl or a document absent from corpus.jsonl, a
non-integer score. (BEIR's own loader fails with a KeyError on the first of these and does
not check the second.)
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator

from st5_jax import paths

LAYOUT = "a BEIR folder holds corpus.jsonl, queries.jsonl and qrels/<split>.tsv"


class RetrievalDataError(ValueError):
  """A malformed retrieval input (BEIR folder, qrels, run file); the message is one actionable line."""


@dataclasses.dataclass(frozen=True)
class RetrievalData:
  """A retrieval set in memory: what every retrieval task (BEIR folder or built-in reader) yields."""
  corpus: dict[str, str]  # doc id -> text
  queries: dict[str, str]  # query id -> text (only queries with at least one relevant doc in qrels)
  qrels: dict[str, dict[str, int]]  # query id -> {doc id: relevance}, for the queries above
  # What load_beir counted: documents, queries_in_file, judgements (qrels pairs), qrels_queries,
  # queries (kept), queries_without_relevant (in the qrels but left out: every score <= 0).
  stats: dict[str, int] = dataclasses.field(default_factory=dict)


def text_lines(path: str, what: str, fix: str) -> Iterator[tuple[int, str]]:
  """(1-based line number, text without its line ending) of a UTF-8 text file, streamed; blank lines skipped.

  what: the file's role ("the run file"), fix: what to do, both for the message when it is missing.
  """
  if not paths.is_file(path):
    raise RetrievalDataError(f"{path}: {what} is missing; {fix}")
  with paths.open_file(path, "rb") as f:
    for lineno, raw in enumerate(f, 1):
      try:
        line = raw.decode("utf-8")
      except UnicodeDecodeError as e:
        raise RetrievalDataError(f"{path}:{lineno}: not UTF-8 ({e.reason} at byte {e.start + 1} of the line); "
                                 "save the file as UTF-8") from None
      if lineno == 1:
        line = line.lstrip("\ufeff")  # a byte-order mark
      line = line.rstrip("\r\n")
      if line.strip():
        yield lineno, line


def _json_records(path: str, kind: str, *, title: bool) -> dict[str, str]:
  """id -> text of a BEIR corpus.jsonl (title: join "title" and "text") or queries.jsonl."""
  fields = '"_id", "title" (optional) and "text"' if title else '"_id" and "text"'
  fix = f"each line of {os.path.basename(path)} must be one JSON object with {fields}"
  out: dict[str, str] = {}
  first_line: dict[str, int] = {}
  for lineno, line in text_lines(path, f"the {kind} file", LAYOUT):
    try:
      record = json.loads(line)
    except json.JSONDecodeError as e:
      raise RetrievalDataError(f"{path}:{lineno}: not valid JSON ({e.msg}, column {e.colno}); {fix}") from None
    if not isinstance(record, dict):
      raise RetrievalDataError(f"{path}:{lineno}: a JSON {type(record).__name__}, not an object; {fix}")
    doc_id = record.get("_id")
    if isinstance(doc_id, int) and not isinstance(doc_id, bool):
      doc_id = str(doc_id)  # qrels name ids as text
    if not isinstance(doc_id, str) or not doc_id:
      raise RetrievalDataError(f"{path}:{lineno}: no \"_id\" (a non-empty string); {fix}")
    text = record.get("text")
    if not isinstance(text, str):
      raise RetrievalDataError(f"{path}:{lineno}: no \"text\" string for _id {doc_id!r}; {fix}")
    head = record.get("title") if title else None
    if head is not None and not isinstance(head, str):
      raise RetrievalDataError(f"{path}:{lineno}: \"title\" of _id {doc_id!r} is not a string; {fix}")
    if doc_id in out:
      raise RetrievalDataError(f"{path}:{lineno}: duplicate _id {doc_id!r} (first on line {first_line[doc_id]}); "
                               "ids must be unique: remove or rename one")
    first_line[doc_id] = lineno
    out[doc_id] = f"{head} {text}" if head else text
  if not out:
    raise RetrievalDataError(f"{path}: no {kind} (the file is empty); {fix}")
  return out


def qrels_rows(path: paths.PathLike) -> Iterator[tuple[int, str, str, int]]:
  """(line, query id, doc id, score) of a BEIR qrels TSV (header optional) or a TREC qrels file."""
  path = os.fspath(path)
  fix = ("each line must be `query-id<TAB>corpus-id<TAB>score` (BEIR, after its header) or `qid iter docid rel` "
         "(TREC), with an integer score")
  first = True
  for lineno, line in text_lines(path, "the qrels file", "pass a BEIR qrels/<split>.tsv or a TREC qrels file"):
    fields = line.split("\t") if "\t" in line else line.split()
    if len(fields) not in (3, 4):
      raise RetrievalDataError(f"{path}:{lineno}: {len(fields)} columns; {fix}")
    qid, did, score = (fields[0], fields[1], fields[2]) if len(fields) == 3 else (fields[0], fields[2], fields[3])
    qid, did, score = qid.strip(), did.strip(), score.strip()
    if first and len(fields) == 3 and not _is_number(score):
      first = False
      continue  # the header, `query-id corpus-id score`
    first = False
    try:
      value = int(score)
    except ValueError:
      raise RetrievalDataError(f"{path}:{lineno}: score {score!r} is not an integer; {fix}") from None
    if not qid or not did:
      raise RetrievalDataError(f"{path}:{lineno}: empty query or corpus id; {fix}")
    yield lineno, qid, did, value


def _is_number(text: str) -> bool:
  try:
    float(text)
  except ValueError:
    return False
  return True


def _read_qrels(path: str) -> tuple[dict[str, dict[str, int]], dict[str, int], dict[str, int]]:
  """(qrels, query id -> first line naming it, doc id -> first line naming it)."""
  qrels: dict[str, dict[str, int]] = {}
  query_line: dict[str, int] = {}
  doc_line: dict[str, int] = {}
  for lineno, qid, did, value in qrels_rows(path):
    query_line.setdefault(qid, lineno)
    doc_line.setdefault(did, lineno)
    previous = qrels.setdefault(qid, {}).setdefault(did, value)
    if previous != value:
      raise RetrievalDataError(f"{path}:{lineno}: query {qid!r}, document {did!r} judged again with score {value} "
                               f"(earlier {previous}); keep one row per pair")
  if not qrels:
    raise RetrievalDataError(f"{path}: no judgements (only a header or nothing); "
                             "write one `query-id<TAB>corpus-id<TAB>score` row per judgement")
  return qrels, query_line, doc_line


def read_qrels(path: paths.PathLike) -> dict[str, dict[str, int]]:
  """query id -> {doc id: score}: every row, scores <= 0 included; a conflicting duplicate row is an error."""
  return _read_qrels(os.fspath(path))[0]


def load_beir(folder: paths.PathLike, split: str = "test") -> RetrievalData:
  """A BEIR folder (local or gs://): corpus, the queries judged in `split` with a relevant doc, their qrels."""
  root = os.fspath(paths.path(folder))
  if not paths.is_dir(root):
    raise RetrievalDataError(f"{root}: no such folder; pass a folder laid out as BEIR's ({LAYOUT})")
  corpus_path = paths.join(root, "corpus.jsonl")
  queries_path = paths.join(root, "queries.jsonl")
  qrels_path = paths.join(root, "qrels", f"{split}.tsv")
  if not paths.is_file(qrels_path):
    splits = [os.path.basename(p)[:-len(".tsv")] for p in paths.glob(paths.join(root, "qrels", "*.tsv"))]
    have = f"the folder has {', '.join(splits)}" if splits else f"the folder has no qrels; {LAYOUT}"
    raise RetrievalDataError(f"{qrels_path}: no qrels for split {split!r}; {have}: pick one of those splits")
  corpus = _json_records(corpus_path, "documents", title=True)
  all_queries = _json_records(queries_path, "queries", title=False)

  qrels, query_line, doc_line = _read_qrels(qrels_path)
  for lines, known, kind, where in ((query_line, all_queries, "query-id", queries_path),
                                    (doc_line, corpus, "corpus-id", corpus_path)):
    unknown = sorted((line, i) for i, line in lines.items() if i not in known)
    if unknown:
      lineno, first = unknown[0]
      others = f" (and {len(unknown) - 1} more such ids)" if len(unknown) > 1 else ""
      raise RetrievalDataError(f"{qrels_path}:{lineno}: {kind} {first!r} is not in {where}{others}; "
                               "add it there or drop its qrels rows")

  kept = {qid: rel for qid, rel in qrels.items() if any(v > 0 for v in rel.values())}
  if not kept:
    raise RetrievalDataError(f"{qrels_path}: no query has a relevant document (every score <= 0); "
                             "relevant documents need a score of 1 or more")
  queries = {qid: text for qid, text in all_queries.items() if qid in kept}  # queries.jsonl's order
  stats = {"documents": len(corpus), "queries_in_file": len(all_queries), "judgements": sum(map(len, qrels.values())),
           "qrels_queries": len(qrels), "queries": len(queries), "queries_without_relevant": len(qrels) - len(kept)}
  return RetrievalData(corpus=corpus, queries=queries, qrels={qid: kept[qid] for qid in queries}, stats=stats)
