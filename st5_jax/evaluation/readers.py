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
from st5_jax.errors import BadRowError

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
  try:
    text = paths.read_text(path, encoding)
  except UnicodeDecodeError as e:
    line = e.object[:e.start].count(b"\n") + 1
    raise BadRowError(f"{path}:{line}: not valid {encoding} ({e.reason} at byte {e.start}); "
                      "the file is corrupt or not the published one") from None
  if not text:
    return []  # an empty file has no lines (not one empty one)
  return [line.rstrip("\r") for line in text.split("\n")][: -1 if text.endswith("\n") else None]


def _tsv(path: paths.Path, *, header: bool, encoding: str = "utf-8-sig") -> list[list[str]]:
  rows = [line.split("\t") for line in _lines(path, encoding)]
  return rows[1:] if header else rows


def _parse(path: paths.Path, rows, parse, *, first_line: int = 1) -> list:
  """`parse(row)` for each row; a row that does not parse is a BadRowError naming file:line.

  Evaluation sets are never read partially (a skipped row would change the benchmark).
  """
  out = []
  for i, row in enumerate(rows):
    try:
      out.append(parse(row))
    except (IndexError, ValueError, KeyError) as e:
      what = "too few tab-separated fields" if isinstance(e, IndexError) else f"{type(e).__name__}: {e}"
      raise BadRowError(f"{path}:{first_line + i}: {what}; the file is corrupt or not the published one") from None
  return out


def _columns(records: list, n: int) -> list[list]:
  """The n columns of a list of n-tuples (n empty lists when there are none)."""
  return [list(c) for c in zip(*records)] if records else [[] for _ in range(n)]


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
    input_file, gold_file = folder / f"{prefix}.input.{subset}.txt", folder / f"{prefix}.gs.{subset}.txt"
    inputs = _lines(input_file)
    gold = _lines(gold_file)
    if len(inputs) != len(gold):
      raise ValueError(f"{input_file} has {len(inputs)} lines but {gold_file} has {len(gold)}; they must be parallel")
    gold_scores = _parse(gold_file, gold, lambda score: float(score) if score.strip() else None)
    # STS16 originals carry two extra source columns after the sentences.
    pairs = _parse(input_file, list(zip(inputs, gold_scores)),
                   lambda r: None if r[1] is None else (r[0].split("\t")[0], r[0].split("\t")[1], r[1]))
    for a, b, score in filter(None, pairs):
      s1.append(clean(a))
      s2.append(clean(b))
      scores.append(score)
      subsets.append(subset)
  return PairScores(s1, s2, np.asarray(scores, np.float64), subsets)


def read_stsb(data_dir=None, *, split: str, tokenized: bool = False) -> PairScores:
  """STS Benchmark (stsb/original/sts-{split}.csv): columns 4 score, 5-6 sentences."""
  if split not in ("train", "dev", "test"):
    raise ValueError(f"STS-B split must be train, dev or test, got {split!r}")
  path = _root(data_dir) / "stsb" / ("senteval_tokenized" if tokenized else "original") / f"sts-{split}.csv"
  s1, s2, scores, genres = _columns(_parse(path, _tsv(path, header=False),
                                           lambda r: (clean(r[5]), clean(r[6]), float(r[4]), r[0])), 4)
  return PairScores(s1, s2, np.asarray(scores, np.float64), genres)


def read_sick(data_dir=None, *, split: str, tokenized: bool = False) -> PairScores:
  """SICK relatedness. Default: sick/brmson_semeval2014 (untokenised SemEval text)."""
  names = {"train": "SICK_train.txt", "trial": "SICK_trial.txt", "test": "SICK_test_annotated.txt"}
  if split not in names:
    raise ValueError(f"SICK split must be one of {sorted(names)}, got {split!r}")
  path = _root(data_dir) / "sick" / ("senteval" if tokenized else "brmson_semeval2014") / names[split]
  s1, s2, scores, ids = _columns(_parse(path, _tsv(path, header=True),
                                        lambda r: (clean(r[1]), clean(r[2]), float(r[3]), r[4]), first_line=2), 4)
  return PairScores(s1, s2, np.asarray(scores, np.float64), ids)


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
  path = _root(data_dir) / "senteval_transfer" / "SST" / "binary" / f"sentiment-{split}"
  texts, labels = _columns(_parse(path, _tsv(path, header=False), lambda r: (clean(r[0]), int(r[1]))), 2)
  return Labeled(texts, np.asarray(labels, np.int64))


def read_trec(data_dir=None, *, split: str) -> Labeled:
  """TREC question types, 6 coarse classes (train_5500.label / TREC_10.label).

  The train file is Latin-1 (one 0xF0 byte), so both are read as Latin-1 like SentEval.
  """
  names = {"train": "train_5500.label", "test": "TREC_10.label"}
  if split not in names:
    raise ValueError(f"TREC split must be train or test, got {split!r}")
  path = _root(data_dir) / "senteval_transfer" / "TREC" / names[split]

  def parse(line):
    coarse, rest = line.strip().split(":", 1)  # "DESC:manner How did ...": ValueError without a colon
    return clean(rest.split(" ", 1)[1]), TREC_CLASSES.index(coarse)

  texts, labels = _columns(_parse(path, _lines(path, encoding="latin-1"), parse), 2)
  return Labeled(texts, np.asarray(labels, np.int64))


def read_mrpc(data_dir=None, *, split: str) -> LabeledPairs:
  """SentEval MRPC (msr_paraphrase_{train,test}.txt): Quality, #1 ID, #2 ID, #1 String, #2 String."""
  if split not in ("train", "test"):
    raise ValueError(f"MRPC split must be train or test, got {split!r}")
  path = _root(data_dir) / "senteval_transfer" / "MRPC" / f"msr_paraphrase_{split}.txt"
  s1, s2, labels = _columns(_parse(path, _tsv(path, header=True),
                                   lambda r: (clean(r[3]), clean(r[4]), int(r[0])), first_line=2), 3)
  return LabeledPairs(s1, s2, np.asarray(labels, np.int64))


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
    path = folder / ("out_of_domain_dev.tsv" if split == "dev_ood" else f"{split}.tsv")
    texts, labels = _columns(_parse(path, _tsv(path, header=False), lambda r: (clean(r[3]), int(r[1]))), 2)
    return Labeled(texts, np.asarray(labels, np.int64))
  path = folder / f"{split}.tsv"
  rows = _tsv(path, header=True)
  if task == "SST-2":
    texts, labels = _columns(_parse(path, rows, lambda r: (clean(r[0]), int(r[1])), first_line=2), 2)
    return Labeled(texts, np.asarray(labels, np.int64))
  if task == "STS-B":
    s1, s2, scores, genres = _columns(_parse(path, rows, lambda r: (clean(r[7]), clean(r[8]), float(r[9]), r[1]),
                                             first_line=2), 4)
    return PairScores(s1, s2, np.asarray(scores, np.float64), genres)
  if task == "MRPC":
    parse = lambda r: (clean(r[3]), clean(r[4]), int(r[0]))  # noqa: E731
  else:  # RTE: index, sentence1, sentence2, label; QNLI: index, question, sentence, label.
    parse = lambda r: (clean(r[1]), clean(r[2]), _ENTAILMENT[r[3]])  # noqa: E731
  s1, s2, labels = _columns(_parse(path, rows, parse, first_line=2), 3)
  return LabeledPairs(s1, s2, np.asarray(labels, np.int64))
