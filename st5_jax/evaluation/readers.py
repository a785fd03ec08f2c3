"""Readers for the evaluation data, in the folder `st5 data prepare --out DIR` writes (docs/data.md).

Every reader takes the data folder and returns plain lists and arrays in file order.
Texts are whitespace-normalised (`" ".join(s.split())`, as SentEval's split/join
does) and an empty text becomes "." (SentEval's convention for empty lines, which CR
and MPQA contain). Files are split on tabs by hand, never with the csv module:
quotes in STS-B, MRPC and GLUE are literal text.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from st5_jax import paths

# SentEval's subset lists (senteval/sts.py); STS13 has no SMT input (licensing).
STS_SUBSETS = {
    2012: ("MSRpar", "MSRvid", "SMTeuroparl", "surprise.OnWN", "surprise.SMTnews"),
    2013: ("FNWN", "headlines", "OnWN"),
    2014: ("deft-forum", "deft-news", "headlines", "images", "OnWN", "tweet-news"),
    2015: ("answers-forums", "answers-students", "belief", "headlines", "images"),
    2016: ("answer-answer", "headlines", "plagiarism", "postediting", "question-question"),
}
BINARY_FILES = {  # task -> (positive file, negative file), label 1 for the first.
    "MR": ("MR/rt-polarity.pos", "MR/rt-polarity.neg"),
    "CR": ("CR/custrev.pos", "CR/custrev.neg"),
    "SUBJ": ("SUBJ/subj.objective", "SUBJ/subj.subjective"),  # SentEval: objective = 1.
    "MPQA": ("MPQA/mpqa.pos", "MPQA/mpqa.neg"),
}
TREC_CLASSES = ("ABBR", "DESC", "ENTY", "HUM", "LOC", "NUM")


@dataclasses.dataclass(frozen=True)
class PairScores:
  """Sentence pairs with gold similarity scores; `subsets[i]` names pair i's source."""
  sents1: list[str]
  sents2: list[str]
  scores: np.ndarray  # float64 [N]
  subsets: list[str]

  def __len__(self):
    return len(self.sents1)


@dataclasses.dataclass(frozen=True)
class Labeled:
  """Single texts with integer labels."""
  texts: list[str]
  labels: np.ndarray  # int64 [N]

  def __len__(self):
    return len(self.texts)


@dataclasses.dataclass(frozen=True)
class LabeledPairs:
  """Text pairs with integer labels (paraphrase, entailment)."""
  sents1: list[str]
  sents2: list[str]
  labels: np.ndarray  # int64 [N]

  def __len__(self):
    return len(self.sents1)


def clean(text: str) -> str:
  return " ".join(text.split()) or "."


def _root(data_dir) -> paths.Path:
  return paths.data_dir(data_dir)  # local or gs://


def _lines(path: paths.Path, encoding: str = "utf-8") -> list[str]:
  if not paths.is_file(path):
    raise paths.MissingFileError(f"Evaluation file {path} is missing; the data folder should be in {paths.LAYOUT_HINT}.")
  # No newline translation: \r inside fields stays visible to rstrip below; "utf-8-sig" drops a BOM.
  text = paths.read_text(path, encoding)
  return [line.rstrip("\r") for line in text.split("\n")][: -1 if text.endswith("\n") else None]


def _tsv(path: paths.Path, *, header: bool, encoding: str = "utf-8-sig") -> list[list[str]]:
  rows = [line.split("\t") for line in _lines(path, encoding)]
  return rows[1:] if header else rows


# ---------------------------------------------------------------------------- STS


def read_sts(data_dir=None, *, year: int, tokenized: bool = False) -> PairScores:
  """STS 2012-2016 English test sets: all scored pairs of SentEval's subsets, in order.

  `tokenized=False` reads sts12-16/original (the official text); True reads the
  tokenised, lower-cased copy SentEval ships. Pairs whose gold line is blank are
  unscored and dropped, as SentEval does.
  """
  if year not in STS_SUBSETS:
    raise ValueError(f"STS year must be one of {sorted(STS_SUBSETS)}, got {year}")
  copy = "senteval_tokenized" if tokenized else "original"
  folder = _root(data_dir) / "sts12-16" / copy / f"STS{year % 100}-en-test"
  prefix = "STS2016" if (year == 2016 and not tokenized) else "STS"
  s1, s2, scores, subsets = [], [], [], []
  for subset in STS_SUBSETS[year]:
    inputs = _lines(folder / f"{prefix}.input.{subset}.txt")
    gold = _lines(folder / f"{prefix}.gs.{subset}.txt")
    if len(inputs) != len(gold):
      raise ValueError(f"{folder}/{subset}: {len(inputs)} input lines but {len(gold)} gold lines")
    for line, score in zip(inputs, gold):
      if not score.strip():
        continue
      # STS16 originals carry two extra source columns after the sentences.
      fields = line.split("\t")
      s1.append(clean(fields[0]))
      s2.append(clean(fields[1]))
      scores.append(float(score))
      subsets.append(subset)
  return PairScores(s1, s2, np.asarray(scores, np.float64), subsets)


def read_stsb(data_dir=None, *, split: str, tokenized: bool = False) -> PairScores:
  """STS Benchmark (stsb/original/sts-{split}.csv): columns 4 score, 5-6 sentences."""
  if split not in ("train", "dev", "test"):
    raise ValueError(f"STS-B split must be train, dev or test, got {split!r}")
  path = _root(data_dir) / "stsb" / ("senteval_tokenized" if tokenized else "original") / f"sts-{split}.csv"
  rows = _tsv(path, header=False)
  return PairScores([clean(r[5]) for r in rows], [clean(r[6]) for r in rows],
                    np.asarray([float(r[4]) for r in rows], np.float64), [r[0] for r in rows])


def read_sick(data_dir=None, *, split: str, tokenized: bool = False) -> PairScores:
  """SICK relatedness. Default: sick/brmson_semeval2014 (untokenised SemEval text)."""
  names = {"train": "SICK_train.txt", "trial": "SICK_trial.txt", "test": "SICK_test_annotated.txt"}
  if split not in names:
    raise ValueError(f"SICK split must be one of {sorted(names)}, got {split!r}")
  path = _root(data_dir) / "sick" / ("senteval" if tokenized else "brmson_semeval2014") / names[split]
  rows = _tsv(path, header=True)
  return PairScores([clean(r[1]) for r in rows], [clean(r[2]) for r in rows],
                    np.asarray([float(r[3]) for r in rows], np.float64), [r[4] for r in rows])


# ------------------------------------------------------------------ SentEval transfer


def read_binary(data_dir=None, *, task: str) -> Labeled:
  """MR, CR, SUBJ, MPQA: one text per line, positives (label 1) then negatives.

  Blank lines are kept (as "."), like SentEval: the published sizes (CR 3775, MPQA
  10606) count them.
  """
  if task not in BINARY_FILES:
    raise ValueError(f"binary task must be one of {sorted(BINARY_FILES)}, got {task!r}")
  root = _root(data_dir) / "senteval_transfer"
  pos, neg = (_lines(root / name) for name in BINARY_FILES[task])
  return Labeled([clean(t) for t in pos + neg], np.asarray([1] * len(pos) + [0] * len(neg), np.int64))


def read_sst2(data_dir=None, *, split: str) -> Labeled:
  """SentEval SST-2 (senteval_transfer/SST/binary/sentiment-{train,dev,test}): text<TAB>label."""
  if split not in ("train", "dev", "test"):
    raise ValueError(f"SST-2 split must be train, dev or test, got {split!r}")
  rows = _tsv(_root(data_dir) / "senteval_transfer" / "SST" / "binary" / f"sentiment-{split}", header=False)
  return Labeled([clean(r[0]) for r in rows], np.asarray([int(r[1]) for r in rows], np.int64))


def read_trec(data_dir=None, *, split: str) -> Labeled:
  """TREC question types, 6 coarse classes (train_5500.label / TREC_10.label).

  The train file is Latin-1 (one 0xF0 byte), so both are read as Latin-1 like SentEval.
  """
  names = {"train": "train_5500.label", "test": "TREC_10.label"}
  if split not in names:
    raise ValueError(f"TREC split must be train or test, got {split!r}")
  texts, labels = [], []
  for line in _lines(_root(data_dir) / "senteval_transfer" / "TREC" / names[split], encoding="latin-1"):
    coarse, rest = line.strip().split(":", 1)
    texts.append(clean(rest.split(" ", 1)[1]))
    labels.append(TREC_CLASSES.index(coarse))
  return Labeled(texts, np.asarray(labels, np.int64))


def read_mrpc(data_dir=None, *, split: str) -> LabeledPairs:
  """SentEval MRPC (msr_paraphrase_{train,test}.txt): Quality, #1 ID, #2 ID, #1 String, #2 String."""
  if split not in ("train", "test"):
    raise ValueError(f"MRPC split must be train or test, got {split!r}")
  rows = _tsv(_root(data_dir) / "senteval_transfer" / "MRPC" / f"msr_paraphrase_{split}.txt", header=True)
  return LabeledPairs([clean(r[3]) for r in rows], [clean(r[4]) for r in rows],
                      np.asarray([int(r[0]) for r in rows], np.int64))


# ------------------------------------------------------------------------- GLUE

GLUE_SPLITS = {
    "CoLA": ("train", "dev", "dev_ood"),
    "SST-2": ("train", "dev"),
    "MRPC": ("train", "dev"),
    "STS-B": ("train", "dev"),
    "RTE": ("train", "dev"),
    "QNLI": ("dev",),
}
_ENTAILMENT = {"entailment": 1, "not_entailment": 0}


def read_glue(data_dir=None, *, task: str, split: str):
  """A labelled GLUE split: Labeled (CoLA, SST-2), LabeledPairs (MRPC, RTE, QNLI) or PairScores (STS-B).

  GLUE test files have no labels and are not read. CoLA's `dev` here is the in-domain
  file (527 rows); `dev_ood` is out_of_domain_dev.tsv (516); GLUE's CoLA dev is both.
  RTE and QNLI labels: entailment = 1, not_entailment = 0.
  """
  if task not in GLUE_SPLITS or split not in GLUE_SPLITS[task]:
    raise ValueError(f"unknown GLUE task/split {task}/{split}; labelled ones are {GLUE_SPLITS}")
  folder = _root(data_dir) / "glue" / task
  if task == "CoLA":  # no header: source, label, original mark, sentence.
    rows = _tsv(folder / ("out_of_domain_dev.tsv" if split == "dev_ood" else f"{split}.tsv"), header=False)
    return Labeled([clean(r[3]) for r in rows], np.asarray([int(r[1]) for r in rows], np.int64))
  rows = _tsv(folder / f"{split}.tsv", header=True)
  if task == "SST-2":
    return Labeled([clean(r[0]) for r in rows], np.asarray([int(r[1]) for r in rows], np.int64))
  if task == "MRPC":
    return LabeledPairs([clean(r[3]) for r in rows], [clean(r[4]) for r in rows],
                        np.asarray([int(r[0]) for r in rows], np.int64))
  if task == "STS-B":
    return PairScores([clean(r[7]) for r in rows], [clean(r[8]) for r in rows],
                      np.asarray([float(r[9]) for r in rows], np.float64), [r[1] for r in rows])
  # RTE: index, sentence1, sentence2, label; QNLI: index, question, sentence, label.
  return LabeledPairs([clean(r[1]) for r in rows], [clean(r[2]) for r in rows],
                      np.asarray([_ENTAILMENT[r[3]] for r in rows], np.int64))
