"""Row counts of the public raw files, derived without st5_jax (issue 20: counts derived independently).

Each function reads the raw files with the csv / json / xml modules and applies the
dataset's documented rules (DATA.md in the shared data folder, the datasets' own READMEs) with its
own normalisation, never the builders' code. The tests compare the builders' counts (and
the literals written in docs/data.md) with these.
"""

from __future__ import annotations

import collections
import csv
import functools
import json
import re
import xml.etree.ElementTree as ET

# The splits training reads: test splits are evaluation-only (the retrieval sets read them).
TRECQA_SPLITS = ("train", "dev")
WIKIQA_SPLITS = ("train",)
CQA2015_SPLITS = ("devel", "trial")
CQA2016_SPLITS = {"A": ("VAL",), "C": ("VAL",), "B": ("TRAIN", "VAL")}


def _norm(text: str) -> str:
  """Case and whitespace runs do not make a new text (the rule used for duplicates below)."""
  return " ".join(text.lower().split())


def _dict_rows(path, **kw) -> list[dict[str, str]]:
  with open(path, newline="", encoding="utf-8") as f:
    return list(csv.DictReader(f, **kw))


@functools.cache
def trecqa(data_dir) -> dict[str, int]:
  """rows (training splits), positives (label 1), distinct positive (question, answer) pairs."""
  rows = [r for s in TRECQA_SPLITS for r in _dict_rows(f"{data_dir}/qa_pairs/trecqa_wang/{s}.csv")]
  positives = [(r["qtext"], r["atext"]) for r in rows if r["label"] == "1"]
  return {"rows": len(rows), "positives": len(positives),
          "distinct_positives": len({(_norm(q), _norm(a)) for q, a in positives})}


@functools.cache
def wikiqa(data_dir) -> dict[str, int]:
  """WikiQA: tab-separated, header line, the label is the last field in both layouts (7 and 5 columns)."""
  out = {"rows": 0, "positives": 0}
  pairs = set()
  for split in WIKIQA_SPLITS:
    with open(f"{data_dir}/qa_pairs/wikiqa/WikiQA-{split}.tsv", encoding="utf-8", newline="") as f:
      lines = f.read().split("\n")[1:]
    records = [line.rstrip("\r").split("\t") for line in lines if line.strip()]
    positives = [(r[1], r[-2]) for r in records if r[-1].strip() == "1"]  # Question, Sentence
    out["rows"] += len(records)
    out[f"{split}_positives"] = len(positives)
    out["positives"] += len(positives)
    pairs |= {(_norm(q), _norm(s)) for q, s in positives}
  out["distinct_positives"] = len(pairs)
  return out


@functools.cache
def qatar_living(data_dir) -> dict[str, int]:
  """Comments and Good labels (2015 XML: CGOLD, trial file ANNOTATION; 2016 CSV `labels`), PerfectMatch rows."""
  out = collections.Counter()
  good_pairs = set()
  letters = lambda t: re.sub(r"[\W_]+", "", (t or "").lower())  # noqa: E731
  for split in CQA2015_SPLITS:
    root = ET.parse(f"{data_dir}/semeval2015_task3_cqa/CQA-QL-{split}.xml").getroot()
    for question in root.iter("Question"):
      body = question.findtext("QBody") or question.findtext("Full_Question")
      for comment in question.iter("Comment"):
        out["comments"] += 1
        if (comment.get("CGOLD") or comment.get("ANNOTATION") or "").strip().lower() == "good":
          out["good"] += 1
          good_pairs.add((letters(body), letters(comment.findtext("CBody") or comment.findtext("Body"))))
  for task, target in (("A", "answer"), ("C", "answer"), ("B", "rel_question")):
    for split in CQA2016_SPLITS[task]:
      rows = _dict_rows(f"{data_dir}/semeval2016_task3_cqa_cleaned/Subtask_{task}_{split}-BASE.csv")
      if task == "B":
        out["match_rows"] += len(rows)
        out["perfect_match"] += sum(r["labels"] == "PerfectMatch" for r in rows)
        continue
      out["comments"] += len(rows)
      goods = [r for r in rows if r["labels"] == "Good"]
      out["good"] += len(goods)
      good_pairs |= {(letters(r["question"]), letters(r[target])) for r in goods}
  # Letters and digits only: pairs that differ in punctuation or quoting alone count once here.
  out["distinct_good_letters_only"] = len(good_pairs)
  return dict(out)


@functools.cache
def squad_dev(data_dir) -> dict[str, int]:
  with open(f"{data_dir}/squad_v1.1_dev/dev-v1.1.reconstructed.json", encoding="utf-8") as f:
    data = json.load(f)["data"]
  paragraphs = [p for a in data for p in a["paragraphs"]]
  return {"articles": len(data), "paragraphs": len(paragraphs), "questions": sum(len(p["qas"]) for p in paragraphs)}


@functools.cache
def snli_senteval(data_dir, split: str) -> dict[str, int]:
  """SentEval's parallel s1/s2/labels files: pairs, and SimCSE-style triples per entailment and per premise."""
  cols = [open(f"{data_dir}/nli/snli_senteval_devtest/{p}.{split}", encoding="utf-8").read().split("\n")
          for p in ("s1", "s2", "labels")]
  labels = collections.defaultdict(collections.Counter)
  pairs = 0
  for s1, _, label in zip(*cols):
    if label.strip():
      pairs += 1
      labels[s1.strip()][label.strip()] += 1
  with_contra = [c for c in labels.values() if c["contradiction"]]
  return {"pairs": pairs, "per_entailment": sum(c["entailment"] for c in with_contra),
          "per_premise": sum(1 for c in with_contra if c["entailment"])}


@functools.cache
def shipped_triples(data_dir) -> dict[str, int]:
  rows = _dict_rows(f"{data_dir}/nli/snli_devtest_triples_derived.csv")
  return {"all": len(rows), **collections.Counter(r["split"] for r in rows)}


@functools.cache
def sick_triples(data_dir) -> dict[str, int]:
  """SICK train (tab-separated, no quoting): entailment pairs whose premise also has a contradiction."""
  with open(f"{data_dir}/sick/senteval/SICK_train.txt", encoding="utf-8", newline="") as f:
    rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
  labels = collections.defaultdict(collections.Counter)
  for r in rows:
    labels[r["sentence_A"].strip()][r["entailment_judgment"].lower()] += 1
  return {"rows": len(rows), "per_entailment": sum(c["entailment"] for c in labels.values() if c["contradiction"])}
