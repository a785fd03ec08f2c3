"""Builders that turn the public raw files into examples for the seqio tasks.

Each builder reads files in the data folder `st5 data prepare --out DIR` writes,
returns a list of examples (dicts of `inputs`, `targets`, optionally
`negative_targets`, plus `source` = `file:line` provenance) and records rows read,
skipped and filtered in a `RowStats`. The same builders write the prepared JSONL
files and, when those are absent, feed the tasks directly from memory; both paths
give the same examples in the same order.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import pathlib
import xml.etree.ElementTree as ET
from typing import Callable, Iterable, Iterator, Sequence

from st5_jax import paths
from st5_jax.data import rows as rows_lib
# Text rules shared with the retrieval evaluation sets (st5_jax/text.py); re-exported under their old names.
from st5_jax.text import _ABBREVIATIONS, _BOUNDARY, clean_cqa_text, split_sentences  # noqa: F401
from st5_jax.text import squash as _squash
from st5_jax.data.rows import RowFormat, RowReader, RowStats
from st5_jax.errors import BadRowError, InputFileError

# Raw files, relative to the data folder.
# ReQA pairs for training come from SQuAD v1.1 *train* only: GLUE QNLI dev (SentGLUE-QNLI)
# is built from SQuAD dev (5,460 of its 5,463 questions are SQuAD dev questions).
SQUAD_TRAIN_FILES = ("squad_v1.1/train-v1.1.json",)
# SQuAD dev as reconstructed here: the builder's reference data in tests, never a training task.
SQUAD_DEV_RECONSTRUCTED = ("squad_v1.1_dev/dev-v1.1.reconstructed.json",)
# Test splits are evaluation-only (the retrieval tasks of st5_jax/evaluation/sets.py read them): training
# reads train / dev / trial splits only. SemEval-2016 subtasks A and C have no train split here.
CQA2015_FILES = ("semeval2015_task3_cqa/CQA-QL-devel.xml", "semeval2015_task3_cqa/CQA-QL-trial.xml")
CQA2016_DIR = "semeval2016_task3_cqa_cleaned"
CQA2016_GOOD_FILES = tuple(f"{CQA2016_DIR}/Subtask_{t}_VAL-BASE.csv" for t in "AC")
CQA2016_MATCH_FILES = tuple(f"{CQA2016_DIR}/Subtask_B_{s}-BASE.csv" for s in ("TRAIN", "VAL"))
TRECQA_FILES = tuple(f"qa_pairs/trecqa_wang/{s}.csv" for s in ("train", "dev"))
WIKIQA_FILES = ("qa_pairs/wikiqa/WikiQA-train.tsv",)
SNLI_TRIPLES_FILE = "nli/snli_devtest_triples_derived.csv"
SNLI_SENTEVAL_DIR = "nli/snli_senteval_devtest"
SIMCSE_NLI_FILE = "nli/nli_for_simcse.csv"

# An example's texts that decontamination (st5_jax.data.overlap) checks besides its features: a forum
# question's body when the example holds subject + body and an evaluation set holds the body alone.
DECONTAMINATION_TEXTS = "decontamination_texts"

# Bump when a builder's output changes, so `st5 data prepare` rebuilds prepared files.
BUILDERS_VERSION = 4  # 3: test splits left out of training; 4: question bodies checked in decontamination
NLI_LABELS = ("entailment", "neutral", "contradiction")
SIMCSE_COLUMNS = {"inputs": "sent0", "targets": "sent1", "negative_targets": "hard_neg"}


@dataclasses.dataclass
class Built:
  """Examples of one task split and what reading them cost."""
  examples: list[dict[str, str]]
  stats: RowStats
  inputs: list[str]  # raw files read, relative to the data folder
  # Evaluation sets not decontaminated against because their files are missing (st5_jax.data.overlap).
  evaluation_sets_missing: tuple[str, ...] = ()


def _path(data_dir: os.PathLike | str, rel: str) -> str:
  path = paths.join(data_dir, rel)
  if not paths.exists(path):
    raise InputFileError(
        f"Input file {path} does not exist. Run `st5 data prepare --out {data_dir}` (or point ST5_DATA_DIR "
        f"at a folder that has {rel}: {paths.LAYOUT_HINT}).")
  if paths.size(path) == 0:
    raise InputFileError(f"Input file {path} is empty.")
  return path


def _norm_key(*texts: str) -> tuple[str, ...]:
  # Dedup key: case, spacing and the upstream ','->';' cleaning do not make a new pair.
  return tuple(" ".join(t.replace(";", ",").lower().split()) for t in texts)


def _dedup(examples: Iterable[dict[str, str]], stats: RowStats) -> list[dict[str, str]]:
  seen = set()
  out = []
  for ex in examples:
    key = _norm_key(*(ex[k] for k in ("inputs", "targets", "negative_targets") if k in ex))
    if key in seen:
      stats.filter("duplicate pair")
      continue
    seen.add(key)
    out.append(ex)
  return out


def _bad(stats: RowStats, strict: bool, where: str, reason: str, kind: str | None = None) -> None:
  if strict:
    raise BadRowError(f"{where}: {reason} (strict mode)")
  stats.skip(where, reason, kind=kind)


def build_reqa_squad(data_dir, *, stats: RowStats, strict: bool = False,
                     files: Sequence[str] = SQUAD_TRAIN_FILES) -> Built:
  """Question -> the sentence of the paragraph that contains its (first) answer.

  Questions whose answer crosses a sentence boundary, or whose answer text is not at
  its offset, are skipped and counted (ReQA drops them too). `files` defaults to SQuAD
  train; SQuAD dev would leak into SentGLUE-QNLI.
  """
  rel_files = list(files)
  examples = []
  for rel in rel_files:
    if rel in SQUAD_TRAIN_FILES and not paths.exists(paths.join(data_dir, rel)):
      raise InputFileError(
          f"{paths.join(data_dir, rel)} does not exist. The ReQA task is built from SQuAD v1.1 train only (GLUE "
          "QNLI dev, used by SentGLUE-QNLI, comes from SQuAD dev): `st5 data prepare --datasets squad_official "
          "--trust-unverified`, or the TFDS task st5_tfds_reqa_squad.")
    path = _path(data_dir, rel)
    with paths.open_file(path, "rb") as f:
      try:
        data = json.loads(f.read().decode("utf-8"))
      except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputFileError(f"{path} is not valid UTF-8 JSON: {e}") from e
    for article in _squad_list(data, "data", path, "the file"):
      for p_index, paragraph in enumerate(_squad_list(article, "paragraphs", path, "an article")):
        context = paragraph.get("context", "")
        if not isinstance(context, str):
          raise InputFileError(f"{path} is not SQuAD v1.1 JSON: a paragraph's context is a "
                               f"{type(context).__name__}, not a string")
        spans = split_sentences(context)
        for qa in _squad_list(paragraph, "qas", path, "a paragraph"):
          where = f"{path}:{article.get('title', '?')}/{p_index}/{qa.get('id', '?')}"
          stats.rows_read += 1
          question = rows_lib.clean_text(qa.get("question"))
          answers = qa.get("answers") or []
          if not question:
            _bad(stats, strict, where, "empty question", kind="empty text")
            continue
          if not answers:
            _bad(stats, strict, where, "no answer", kind="no answer")
            continue
          answer = answers[0] if isinstance(answers, list) else None
          a_start = answer.get("answer_start", -1) if isinstance(answer, dict) else None
          a_text = answer.get("text", "") if isinstance(answer, dict) else None
          if type(a_start) is not int or not isinstance(a_text, str):  # bool is not an offset
            _bad(stats, strict, where, "answers[0] is not {answer_start: int, text: str}", kind="malformed answer")
            continue
          if not a_text or context[a_start:a_start + len(a_text)] != a_text:
            _bad(stats, strict, where, "answer text not at answer_start", kind="answer not found")
            continue
          a_end = a_start + len(a_text)
          sentence = next(((s, e) for s, e in spans if s <= a_start < e), None)
          if sentence is None or a_end > sentence[1]:
            stats.filter("answer crosses a sentence boundary")
            continue
          examples.append({"inputs": question, "targets": context[sentence[0]:sentence[1]].strip(),
                           "source": where})
  return Built(_dedup(examples, stats), stats, rel_files)


def _squad_list(parent, key: str, path: str, what: str) -> list[dict]:
  """parent[key] as a list of objects, or an InputFileError naming the file (not SQuAD's layout)."""
  value = parent.get(key, []) if isinstance(parent, dict) else None
  if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
    raise InputFileError(f"{path} is not SQuAD v1.1 JSON: {what} has no list of objects under {key!r}")
  return value


# ----------------------------------------------------------------------------
# Qatar Living community QA (SemEval 2015/2016 Task 3).

_CQA2015_LABELS = {
    "v2": frozenset({"good", "potential", "bad", "dialogue", "not english", "other"}),
    "v1": frozenset({"good", "potential", "bad", "dialog", "not english", "other", "ad", "author", "url",
                     "related", "repetition"}),
}
_CQA2016_LABELS = {
    "A": ("Good", "PotentiallyUseful", "Bad"),
    "C": ("Good", "PotentiallyUseful", "Bad"),
    "B": ("PerfectMatch", "Relevant", "Irrelevant"),
}


def _question_text(subject: str, body: str) -> str:
  # Forum posts: the subject is a title; bodies often repeat it.
  subject, body = _squash(subject), _squash(body)
  if not subject or body.lower().startswith(subject.lower()):
    return body
  if not body:
    return subject
  return f"{subject} {body}"


def _iter_cqa2015(path: str, stats: RowStats, strict: bool) -> Iterator[tuple[str, str, str, str, str]]:
  """(question, its body alone, comment, label, where) for every comment of a SemEval-2015 XML file."""
  try:
    root = ET.fromstring(paths.read_bytes(path))
  except ET.ParseError as e:
    raise InputFileError(f"{path} is not well-formed XML: {e}") from e
  for question in root.iter("Question"):
    if question.find("QSubject") is not None or question.find("QBody") is not None:
      version = "v2"
      q_text = _question_text(question.findtext("QSubject"), question.findtext("QBody"))
      q_body = _squash(question.findtext("QBody"))
    else:
      version = "v1"  # the 2014 trial format
      q_text = _question_text(question.findtext("Short_Question"), question.findtext("Full_Question"))
      q_body = _squash(question.findtext("Full_Question"))
    for comment in question.iter("Comment"):
      cid = comment.get("CID", "?")
      where = f"{path}:{cid}"
      stats.rows_read += 1
      label = (comment.get("CGOLD") if version == "v2" else comment.get("ANNOTATION")) or ""
      label = label.strip().lower()
      c_text = _squash(comment.findtext("CBody") if version == "v2" else comment.findtext("Body"))
      if label not in _CQA2015_LABELS[version]:
        _bad(stats, strict, where, f"label {label!r} outside {sorted(_CQA2015_LABELS[version])}",
             kind="label out of range")
        continue
      if not q_text or not c_text:
        _bad(stats, strict, where, "empty text", kind="empty text")
        continue
      yield q_text, q_body, c_text, label, where


def _cqa2016_reader(path: str, subtask: str, strict: bool) -> RowReader:
  target = "rel_question" if subtask == "B" else "answer"
  keep = ("PerfectMatch",) if subtask == "B" else ("Good",)
  columns = {"subject": "feature", "inputs": "question", "targets": target}
  return RowReader(path, RowFormat("csv", columns, label_column="labels", label_values=_CQA2016_LABELS[subtask],
                                   keep_labels=keep), strict=strict)


def _iter_cqa2016(path: str, subtask: str, stats: RowStats, strict: bool) -> Iterator[dict[str, str]]:
  reader = _cqa2016_reader(path, subtask, strict)
  line_of = _LineTracker()
  for ex in line_of.wrap(reader, stats):
    subject = clean_cqa_text(ex.pop("subject"))
    body = clean_cqa_text(ex["inputs"])
    # Subtask B's subject column glues both questions' subjects: use the body alone.
    ex["inputs"] = body if subtask == "B" else _question_text(subject, body)
    if ex["inputs"] != body and body:
      # Subtasks A/C VAL hold subtask B VAL's questions (and B TEST's related ones) as subject + body, the
      # retrieval sets the bodies alone: decontamination checks the body too (st5_jax.data.overlap.ALSO_CHECKED).
      ex[DECONTAMINATION_TEXTS] = [body]
    ex["targets"] = clean_cqa_text(ex["targets"])
    if not ex["inputs"] or not ex["targets"]:
      _bad(stats, strict, ex["source"], "empty text after removing quote artefacts", kind="empty text")
      continue
    yield ex


class _LineTracker:
  """Adds `source` (file:line) to examples of a RowReader by reading its stats."""

  def wrap(self, reader: RowReader, stats: RowStats) -> Iterator[dict[str, str]]:
    path = reader.files()[0]
    for ex in reader.iter_examples(stats=stats):
      ex["source"] = f"{path}:{stats._counted_upto.get(path, 0)}"  # pylint: disable=protected-access
      yield ex


def build_qatar_living_good(data_dir, *, stats: RowStats, strict: bool = False) -> Built:
  """Question -> a comment labelled Good (SemEval 2015 XML; 2016 subtasks A and C)."""
  examples = []
  for rel in CQA2015_FILES:
    path = _path(data_dir, rel)
    for q_text, q_body, c_text, label, where in _iter_cqa2015(path, stats, strict):
      if label == "good":
        ex = {"inputs": q_text, "targets": c_text, "source": where}
        if q_body and q_body != q_text:  # SemEval-2016 B holds some of these questions' bodies alone
          ex[DECONTAMINATION_TEXTS] = [q_body]
        examples.append(ex)
      else:
        stats.filter(f"label {label}")
  for rel in CQA2016_GOOD_FILES:
    subtask = rel.split("Subtask_")[1][0]
    examples.extend(_iter_cqa2016(_path(data_dir, rel), subtask, stats, strict))
  return Built(_dedup(examples, stats), stats, list(CQA2015_FILES + CQA2016_GOOD_FILES))


def build_qatar_living_perfect_match(data_dir, *, stats: RowStats, strict: bool = False) -> Built:
  """Question -> a related question labelled PerfectMatch (SemEval 2016 subtask B)."""
  examples = []
  for rel in CQA2016_MATCH_FILES:
    examples.extend(_iter_cqa2016(_path(data_dir, rel), "B", stats, strict))
  return Built(_dedup(examples, stats), stats, list(CQA2016_MATCH_FILES))


# ----------------------------------------------------------------------------
# Answer sentence selection sets: keep the positives.


def build_trecqa(data_dir, *, stats: RowStats, strict: bool = False) -> Built:
  """TREC-QA (Wang et al. 2007, Yao et al. 2013 form): question -> answer sentence with label 1."""
  examples = []
  for rel in TRECQA_FILES:
    reader = RowReader(_path(data_dir, rel), RowFormat("csv", {"inputs": "qtext", "targets": "atext"},
                                                       label_column="label", label_values=("0", "1"),
                                                       keep_labels=("1",)), strict=strict)
    examples.extend(_LineTracker().wrap(reader, stats))
  return Built(_dedup(examples, stats), stats, list(TRECQA_FILES))


def build_wikiqa(data_dir, *, stats: RowStats, strict: bool = False) -> Built:
  """WikiQA: question -> Wikipedia sentence with label 1.

  Reads both the original 7-column layout (QuestionID, Question, DocumentID,
  DocumentTitle, SentenceID, Sentence, Label) and the 5-column layout of the train
  file here, which still has 13 rows in the original layout.
  """
  examples = []
  layouts = {7: (1, 5, 6), 5: (1, 3, 4)}
  for rel in WIKIQA_FILES:
    path = _path(data_dir, rel)
    header = None
    for line, fields in rows_lib.iter_tsv_records(path):
      if header is None:
        header = fields
        continue
      if not stats.is_new(path, line):
        continue
      stats.rows_read += 1
      where = f"{path}:{line}"
      if isinstance(fields, str):
        _bad(stats, strict, where, fields, kind="undecodable bytes")
        continue
      if len(fields) not in layouts:
        _bad(stats, strict, where, f"wrong number of fields: {len(fields)}, expected 5 or 7",
             kind="wrong number of fields")
        continue
      q, s, lab = (fields[i].strip() for i in layouts[len(fields)])
      if lab not in ("0", "1"):
        _bad(stats, strict, where, f"label {lab!r} outside ['0', '1']", kind="label out of range")
        continue
      if not q or not s:
        _bad(stats, strict, where, "empty text", kind="empty text")
        continue
      if lab != "1":
        stats.filter("label 0")
        continue
      examples.append({"inputs": q, "targets": s, "source": where})
    if header is None:
      raise InputFileError(f"Input file {path} has no rows.")
  return Built(_dedup(examples, stats), stats, list(WIKIQA_FILES))


# ----------------------------------------------------------------------------
# NLI triples (premise, entailment, contradiction).


def read_simcse_csv(path: str, *, stats: RowStats, strict: bool = False, split: str | None = None,
                    columns: dict[str, str] | None = None) -> list[dict[str, str]]:
  """SimCSE-format triples `sent0,sent1,hard_neg` (optionally filtered on a `split` column)."""
  fmt = RowFormat("csv", dict(columns or SIMCSE_COLUMNS), label_column="split" if split else None,
                  label_values=("train", "dev", "test", "validation") if split else None,
                  keep_labels=(split,) if split else None)
  return list(_LineTracker().wrap(RowReader(path, fmt, strict=strict), stats))


def iter_nli_jsonl(path: str, *, stats: RowStats, strict: bool = False) -> Iterator[tuple[str, str, str, str]]:
  """(premise, hypothesis, label, where) from SNLI/MultiNLI jsonl (sentence1, sentence2, gold_label)."""
  for line, record in rows_lib.iter_jsonl_records(path):
    stats.rows_read += 1
    where = f"{path}:{line}"
    if isinstance(record, str):
      _bad(stats, strict, where, record, kind=record.split(" (")[0])
      continue
    premise = rows_lib.clean_text(record.get("sentence1"))
    hypothesis = rows_lib.clean_text(record.get("sentence2"))
    label = rows_lib.clean_text(record.get("gold_label"))
    if label == "-":
      stats.filter("no gold label")
      continue
    if _nli_row_ok(premise, hypothesis, label, where, stats=stats, strict=strict):
      yield premise, hypothesis, label, where


def _nli_row_ok(premise: str, hypothesis: str, label: str, where: str, *, stats: RowStats, strict: bool) -> bool:
  """Counts (or, in strict mode, raises on) a labelled NLI pair that cannot be used."""
  if label not in NLI_LABELS:
    _bad(stats, strict, where, f"label {label!r} outside {list(NLI_LABELS)}", kind="label out of range")
    return False
  if not premise or not hypothesis:
    _bad(stats, strict, where, "empty text", kind="empty text")
    return False
  return True


def iter_nli_senteval(directory: str, split: str, *, stats: RowStats,
                      strict: bool = False) -> Iterator[tuple[str, str, str, str]]:
  """SentEval's SNLI layout: parallel files s1.<split>, s2.<split>, labels.<split>."""
  names = [paths.join(directory, f"{p}.{split}") for p in ("s1", "s2", "labels")]
  for name in names:
    if not paths.exists(name):
      raise InputFileError(f"Input file {name} does not exist.")
  columns = [list(rows_lib.iter_lines(n)) for n in names]
  lengths = [len(c) for c in columns]
  if len(set(lengths)) != 1:
    raise InputFileError(f"{', '.join(names)} have different line counts {lengths}; they must be parallel.")
  for (line, s1, e1), (_, s2, e2), (_, lab, e3) in zip(*columns):
    stats.rows_read += 1
    where = f"{names[0]}:{line}"
    error = e1 or e2 or e3
    if error:
      _bad(stats, strict, where, error, kind="undecodable bytes")
      continue
    premise, hypothesis, label = s1.strip(), s2.strip(), lab.strip()
    if _nli_row_ok(premise, hypothesis, label, where, stats=stats, strict=strict):
      yield premise, hypothesis, label, where


def _iter_sick_labelled(path: str, *, stats: RowStats, strict: bool) -> Iterator[tuple[str, str, str, str]]:
  fmt = RowFormat("tsv", {"premise": "sentence_A", "hypothesis": "sentence_B", "label": "entailment_judgment"})
  reader = RowReader(path, fmt, strict=strict)
  for ex in _LineTracker().wrap(reader, stats):
    label = ex["label"].lower()
    if label not in NLI_LABELS:
      _bad(stats, strict, ex["source"], f"label {ex['label']!r} outside {list(NLI_LABELS)}",
           kind="label out of range")
      continue
    yield ex["premise"], ex["hypothesis"], label, ex["source"]


def iter_nli_file(path: str, *, stats: RowStats, strict: bool = False) -> Iterator[tuple[str, str, str, str]]:
  """Any supported raw NLI file: *.jsonl (SNLI/MNLI), SICK *.txt, or a SentEval s1.<split> file."""
  base = os.path.basename(path)
  if base.endswith(".jsonl"):
    return iter_nli_jsonl(path, stats=stats, strict=strict)
  if base.startswith("s1."):
    return iter_nli_senteval(os.path.dirname(path), base[3:], stats=stats, strict=strict)
  if base.startswith("SICK"):
    return _iter_sick_labelled(path, stats=stats, strict=strict)
  raise ValueError(f"Unknown NLI file layout: {path} (expected *.jsonl, SentEval s1.<split>, or SICK_*.txt).")


NLI_TRIPLE_MODES = ("per_entailment", "per_premise")


def nli_triples(pairs: Iterable[tuple[str, str, str, str]], *, stats: RowStats,
                mode: str = "per_entailment") -> list[dict[str, str]]:
  """SimCSE-style triples from labelled NLI pairs.

  Pairs are grouped by premise (first appearance order); premises without both an
  entailment and a contradiction give no triple.
  per_entailment: the i-th entailment of a premise becomes a triple whose hard
    negative is contradiction i mod (number of contradictions). On SNLI dev/test this
    reproduces nli/snli_devtest_triples_derived.csv row for row.
  per_premise: one triple per premise, its first entailment and first contradiction.
    SimCSE reports 314K SNLI+MNLI entailment pairs but 275K triples; on SNLI dev this
    mode keeps 88% of entailments (per_entailment: 95%), i.e. about 277K of 314K.
  """
  if mode not in NLI_TRIPLE_MODES:
    raise ValueError(f"mode must be one of {NLI_TRIPLE_MODES}, got {mode!r}")
  groups: dict[str, dict[str, list]] = {}
  for premise, hypothesis, label, where in pairs:
    group = groups.setdefault(premise, {"entailment": [], "contradiction": []})
    if label in group:
      group[label].append((hypothesis, where))
    else:
      stats.filter(f"label {label}")
  triples = []
  for premise, group in groups.items():
    entail, contra = group["entailment"], group["contradiction"]
    if mode == "per_premise" and entail and contra:
      entail = entail[:1]
      stats.filtered_by_reason["further entailments of the premise (per_premise)"] += len(group["entailment"]) - 1
      stats.rows_filtered += len(group["entailment"]) - 1
    if not contra:
      if entail:
        stats.filtered_by_reason["entailment without a contradiction for its premise"] += len(entail)
        stats.rows_filtered += len(entail)
      continue
    for i, (hypothesis, where) in enumerate(entail):
      triples.append({"inputs": premise, "targets": hypothesis, "negative_targets": contra[i % len(contra)][0],
                      "source": where})
  return triples


def build_nli_triples(paths: Sequence[str], *, stats: RowStats, strict: bool = False,
                      mode: str = "per_entailment") -> list[dict[str, str]]:
  """Triples from raw NLI files (each file grouped on its own, then concatenated)."""
  out = []
  for path in paths:
    out.extend(nli_triples(iter_nli_file(path, stats=stats, strict=strict), stats=stats, mode=mode))
  return out


def write_simcse_csv(triples: Iterable[dict[str, str]], path: str) -> int:
  """Writes triples as SimCSE's `sent0,sent1,hard_neg` CSV; returns the row count."""
  n = 0
  pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
  tmp = f"{path}.tmp"
  with open(tmp, "w", encoding="utf-8", newline="") as f:
    writer = csv.writer(f)
    writer.writerow(["sent0", "sent1", "hard_neg"])
    for t in triples:
      writer.writerow([t["inputs"], t["targets"], t["negative_targets"]])
      n += 1
  os.replace(tmp, path)
  return n


def build_shipped_triples(data_dir, split: str, *, stats: RowStats, strict: bool = False) -> Built:
  """Rows of nli/snli_devtest_triples_derived.csv whose `split` column is `split`."""
  path = _path(data_dir, SNLI_TRIPLES_FILE)
  return Built(read_simcse_csv(path, stats=stats, strict=strict, split=split), stats, [SNLI_TRIPLES_FILE])


def build_simcse_nli(data_dir, *, stats: RowStats, strict: bool = False) -> Built:
  """SimCSE's nli_for_simcse.csv (275K SNLI+MNLI triples) when the user has it."""
  path = _path(data_dir, SIMCSE_NLI_FILE)
  return Built(read_simcse_csv(path, stats=stats, strict=strict), stats, [SIMCSE_NLI_FILE])


BuilderFn = Callable[..., Built]
