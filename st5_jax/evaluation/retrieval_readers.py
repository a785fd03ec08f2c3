"""The retrieval evaluation sets, read from the public data folder: queries, a corpus and graded qrels.

Each reader returns a `RetrievalData` (st5_jax.retrieval.beir: the BEIR layout in memory).
Queries without a relevant document are left out, as BEIR and the issue's WikiQA figures do.

  ReQA-SQuAD          SQuAD v1.1 dev (Ahmad et al. 2019): question -> the sentence(s) holding an answer;
                      corpus: every sentence of the 2,067 paragraphs (st5_jax.text.split_sentences)
  SQuAD-paragraphs    the same questions -> their paragraph; corpus: the 2,067 paragraphs (DPR/NQ-style
                      top-k accuracy)
  SemEval2016-B       Qatar Living duplicate-question search (SemEval-2016 Task 3 subtask B): original
                      question -> its related questions labelled PerfectMatch (2) or Relevant (1); corpus:
                      every related question of the split (the public stand-in for LAP's Quora)
  WikiQA, TREC-QA     answer retrieval: question -> its label-1 sentences; corpus: every candidate sentence
                      of the split

SQuAD: the official dev-v1.1.json is read when the data folder has it (`squad_official`);
else the reconstruction, whose `answer_start` is the first occurrence of the answer text in
the paragraph -- the wrong sentence when the text occurs earlier too. `read_squad` counts
the questions where that can happen (`ambiguous_answer_start`: an answer text that occurs
in two or more sentences of its paragraph).

Light (csv, json; no scikit-learn, TensorFlow or JAX): st5_jax/evaluation/sets.py lists
these sets, and decontamination indexes their queries and relevant texts.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import logging
from typing import Any

from st5_jax import paths
from st5_jax.errors import BadRowError, InputFileError
from st5_jax.retrieval.beir import RetrievalData
from st5_jax.text import clean_cqa_text, split_sentences, squash

SQUAD_OFFICIAL_DEV = "squad_v1.1/dev-v1.1.json"
SQUAD_RECONSTRUCTED_DEV = "squad_v1.1_dev/dev-v1.1.reconstructed.json"
SEMEVAL_B = "semeval2016_task3_cqa_cleaned/Subtask_B_{split}-BASE.csv"
WIKIQA = "qa_pairs/wikiqa/WikiQA-{split}.tsv"
TRECQA = "qa_pairs/trecqa_wang/{split}.csv"
SEMEVAL_B_GRADES = {"PerfectMatch": 2, "Relevant": 1, "Irrelevant": 0}

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class SquadInfo:
  """What reading SQuAD dev found (reported with the task's results)."""

  file: str
  official: bool
  questions: int
  ambiguous_answer_start: int  # questions whose answer text occurs in two or more sentences of the paragraph
  answer_outside_sentences: int  # questions none of whose answers starts inside a sentence span (left out)


def _file(root, rel: str) -> str:
  path = paths.join(root, rel)
  if not paths.exists(path):
    raise InputFileError(f"{path} does not exist: run `st5 data prepare --out {root}` (or point ST5_DATA_DIR at a "
                         f"folder that has {rel})")
  return path


def _text(root, rel: str) -> tuple[str, str]:
  path = _file(root, rel)
  try:
    return path, paths.read_bytes(path).decode("utf-8")
  except UnicodeDecodeError as e:
    raise BadRowError(f"{path}: not UTF-8 ({e})") from e


def _squad_file(root) -> tuple[str, bool]:
  official = paths.join(root, SQUAD_OFFICIAL_DEV)
  if paths.exists(official):
    return SQUAD_OFFICIAL_DEV, True
  if not paths.exists(paths.join(root, SQUAD_RECONSTRUCTED_DEV)):
    # The core download has neither: the official file is optional (no pinned checksum) and the
    # reconstruction local-only, so plain `st5 data prepare` does not fetch them.
    raise InputFileError(f"{paths.join(root, SQUAD_OFFICIAL_DEV)} does not exist: run `st5 data prepare --datasets "
                         f"squad_official --trust-unverified --out {root}` (downloads the official SQuAD v1.1 files "
                         f"and records their sha256)")
  return SQUAD_RECONSTRUCTED_DEV, False


def read_squad(root, *, level: str = "sentence") -> tuple[RetrievalData, SquadInfo]:
  """ReQA-style SQuAD v1.1 dev: `level` "sentence" (ReQA) or "paragraph" (DPR-style)."""
  if level not in ("sentence", "paragraph"):
    raise ValueError(f"level must be 'sentence' or 'paragraph', got {level!r}")
  rel, official = _squad_file(root)
  path, raw = _text(root, rel)
  try:
    articles = json.loads(raw)["data"]
  except (json.JSONDecodeError, KeyError, TypeError) as e:
    raise BadRowError(f"{path}: not SQuAD v1.1 JSON ({type(e).__name__}: {e})") from e
  corpus: dict[str, str] = {}
  queries: dict[str, str] = {}
  qrels: dict[str, dict[str, int]] = {}
  n_questions = ambiguous = outside = 0
  for a, article in enumerate(articles):
    for p, paragraph in enumerate(article["paragraphs"]):
      context = paragraph["context"]
      spans = split_sentences(context)
      pid = f"{a}-{p}"
      if level == "paragraph":
        corpus[pid] = squash(context)
      else:
        for s, (start, end) in enumerate(spans):
          corpus[f"{pid}-{s}"] = context[start:end].strip()
      for qa in paragraph["qas"]:
        n_questions += 1
        answers = [ans for ans in qa.get("answers", []) if ans.get("text")]
        if level == "paragraph":
          relevant = {pid} if answers else set()
        else:
          relevant = {f"{pid}-{s}" for ans in answers for s, (start, end) in enumerate(spans)
                      if start <= ans["answer_start"] < end}
          texts = {ans["text"] for ans in answers}
          if any(sum(t in context[start:end] for start, end in spans) > 1 for t in texts):
            ambiguous += 1
        if not relevant:
          outside += 1
          continue
        queries[qa["id"]] = squash(qa["question"])
        qrels[qa["id"]] = dict.fromkeys(sorted(relevant), 1)
  info = SquadInfo(path, official, n_questions, ambiguous if level == "sentence" else 0, outside)
  return RetrievalData(corpus=corpus, queries=queries, qrels=qrels), info


def _csv_rows(root, rel: str) -> tuple[str, list[dict[str, str]]]:
  path, raw = _text(root, rel)
  return path, list(csv.DictReader(io.StringIO(raw)))


def _need(path: str, row: dict[str, Any], line: int, columns: tuple[str, ...]) -> None:
  missing = [c for c in columns if row.get(c) is None]
  if missing:
    raise BadRowError(f"{path}:{line}: no {', '.join(missing)} column (expected {', '.join(columns)})")


class _Ids:
  """Stable ids for texts without ids of their own: the first occurrence's order."""

  def __init__(self, prefix: str):
    self.prefix, self.ids = prefix, {}

  def __call__(self, text: str) -> str:
    return self.ids.setdefault(text, f"{self.prefix}{len(self.ids)}")


def _assemble(pairs: list[tuple[str, str, int]], query_prefix: str = "q", doc_prefix: str = "d") -> RetrievalData:
  """(query text, document text, grade) triples -> RetrievalData; ids by first occurrence."""
  qid, did = _Ids(query_prefix), _Ids(doc_prefix)
  corpus, queries, qrels = {}, {}, {}
  for q, d, grade in pairs:
    corpus[did(d)] = d
    if grade > 0:
      queries[qid(q)] = q
      qrels.setdefault(qid(q), {})[did(d)] = grade
  return RetrievalData(corpus=corpus, queries=queries, qrels=qrels)


def read_semeval_b(root, *, split: str = "TEST") -> RetrievalData:
  """SemEval-2016 Task 3 subtask B, `split` TEST / VAL / TRAIN: graded PerfectMatch 2, Relevant 1.

  A related question whose text is the original question's is left out: TEST lists 39 originals as their own
  PerfectMatch, which any encoder ranks first (in a search, the query itself is no answer; BEIR's
  ignore_identical_ids). VAL and TRAIN have none.
  """
  path, rows = _csv_rows(root, SEMEVAL_B.format(split=split))
  pairs, itself = [], 0
  for line, row in enumerate(rows, 2):
    _need(path, row, line, ("question", "rel_question", "labels"))
    label = row["labels"].strip()
    if label not in SEMEVAL_B_GRADES:
      raise BadRowError(f"{path}:{line}: label {label!r} outside {sorted(SEMEVAL_B_GRADES)}")
    q, d = clean_cqa_text(row["question"]), clean_cqa_text(row["rel_question"])
    if q and q == d:
      itself += 1
    elif q and d:
      pairs.append((q, d, SEMEVAL_B_GRADES[label]))
  if itself:
    log.info("%s: %d related questions identical to their original question left out", path, itself)
  return _assemble(pairs)


def read_trecqa(root, *, split: str = "test") -> RetrievalData:
  """TREC-QA (`qtext,label,atext`), `split` test / dev / train."""
  path, rows = _csv_rows(root, TRECQA.format(split=split))
  pairs = []
  for line, row in enumerate(rows, 2):
    _need(path, row, line, ("qtext", "label", "atext"))
    if row["label"].strip() not in ("0", "1"):
      raise BadRowError(f"{path}:{line}: label {row['label']!r} outside ['0', '1']")
    pairs.append((squash(row["qtext"]), squash(row["atext"]), int(row["label"])))
  return _assemble([p for p in pairs if p[0] and p[1]])


def read_wikiqa(root, *, split: str = "test") -> RetrievalData:
  """WikiQA's original 7-column layout (the test split): sentence ids are its SentenceIDs."""
  path, raw = _text(root, WIKIQA.format(split=split))
  lines = raw.splitlines()
  header = lines[0].split("\t") if lines else []
  columns = ("QuestionID", "Question", "SentenceID", "Sentence", "Label")
  if not set(columns) <= set(header):
    raise BadRowError(f"{path}:1: header {header} lacks {[c for c in columns if c not in header]}")
  at = {c: header.index(c) for c in columns}
  corpus, queries, qrels = {}, {}, {}
  for line, text in enumerate(lines[1:], 2):
    fields = text.split("\t")
    if len(fields) != len(header):
      raise BadRowError(f"{path}:{line}: {len(fields)} fields, expected {len(header)}")
    qid, did, label = fields[at["QuestionID"]], fields[at["SentenceID"]], fields[at["Label"]].strip()
    if label not in ("0", "1"):
      raise BadRowError(f"{path}:{line}: label {label!r} outside ['0', '1']")
    corpus[did] = squash(fields[at["Sentence"]])
    if label == "1":
      queries[qid] = squash(fields[at["Question"]])
      qrels.setdefault(qid, {})[did] = 1
  return RetrievalData(corpus=corpus, queries=queries, qrels=qrels)
