"""The evaluation sets: what each one reads and every text it encodes; task, suite and alias names.

One row of `SETS` per evaluation set: name, suite, files, and `read(data_dir) -> (texts, data)`
where `texts` is every text the set's evaluation encodes (both sides of pairs, classifier
training parts included) in the order it encodes them, and `data` is what its scoring needs
(st5_jax.evaluation.harness.SCORERS, keyed by the same names). Decontamination
(st5_jax.data.overlap) indexes the texts of every row, so a new evaluation set joins the
training data's decontamination by adding its row here (and its scorer to the harness).

Retrieval sets (`kind="retrieval"`, st5_jax/evaluation/retrieval_readers.py, BEIR folders by
`beir:FOLDER[:split]`) encode queries and documents each with their side's encoder, so their
`texts` are what decontamination must exclude -- the queries and the relevant documents, not
the whole corpus -- and the harness does not encode them up front.

Light on purpose (NumPy and the readers; no scikit-learn, TensorFlow or JAX): the data
pipeline and the objectives' tasks import it, and it imports neither of them.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Sequence

import numpy as np

from st5_jax import paths
from st5_jax.evaluation import readers, retrieval_readers

# data folder -> (every text the evaluation encodes, in order; the parsed data its scoring takes)
Read = Callable[[Any], tuple[list[str], Any]]


@dataclasses.dataclass(frozen=True)
class EvalSet:
  name: str
  suite: str
  read: Read
  files: str  # what the number is computed from, relative to the data folder.
  kind: str = "encode"  # "retrieval": queries and documents encoded by side (module doc)


def senteval_sorted(data: readers.Labeled | readers.LabeledPairs) -> readers.Labeled | readers.LabeledPairs:
  """The rows in SentEval's order: sorted by (token count of each text..., label), stably.

  SentEval sorts its samples so before splitting folds, which fixes what each fold holds.
  """
  if isinstance(data, readers.Labeled):
    keys = [(len(t.split()), int(label)) for t, label in zip(data.texts, data.labels)]
  else:
    keys = [(len(a.split()), len(b.split()), int(label)) for a, b, label in zip(data.sents1, data.sents2, data.labels)]
  order = np.array(sorted(range(len(keys)), key=lambda i: keys[i]), np.int64)
  if isinstance(data, readers.Labeled):
    return readers.Labeled([data.texts[i] for i in order], data.labels[order])
  return readers.LabeledPairs([data.sents1[i] for i in order], [data.sents2[i] for i in order], data.labels[order])


def _texts(part) -> list[str]:
  """A part's texts as its evaluation encodes them: single texts, or all first sides then all second sides."""
  return list(part.texts) if isinstance(part, readers.Labeled) else part.sents1 + part.sents2


def _identity(data):
  return data


def _one(read_data: Callable, prepare: Callable = _identity) -> Read:
  """A set read from one part (e.g. an STS test file)."""
  def read(root):
    data = prepare(read_data(root))
    return _texts(data), data
  return read


def _parts(read_split: Callable, splits: Sequence[str], prepare: Callable = _identity) -> Read:
  """A set of several splits ({split: data}, in `splits` order); texts split after split."""
  def read(root):
    parts = {split: prepare(read_split(root, split=split)) for split in splits}
    return [t for part in parts.values() for t in _texts(part)], parts
  return read


def _distinct_sentences(read_data: Callable) -> Read:
  """Pairs whose evaluation encodes each distinct sentence once (alignment and uniformity)."""
  def read(root):
    data = read_data(root)
    return list(dict.fromkeys(data.sents1 + data.sents2)), data
  return read


def _sts(year: int) -> Read:
  return _one(functools.partial(readers.read_sts, year=year))


def _glue(task: str, splits: Sequence[str]) -> Read:
  return _parts(functools.partial(readers.read_glue, task=task), splits)


def _retrieval(read_data: Callable) -> Read:
  """A retrieval set: (its queries and relevant documents, RetrievalData)."""
  def read(root):
    data = read_data(root)
    if isinstance(data, tuple):  # (RetrievalData, what reading found)
      data = data[0]
    relevant = dict.fromkeys(d for docs in data.qrels.values() for d, grade in docs.items() if grade > 0)
    return list(data.queries.values()) + [data.corpus[d] for d in relevant], data
  return read


_STS_FILES = "sts12-16/original/STS{yy}-en-test/{prefix}.input|gs.<subset>.txt"
SETS: dict[str, EvalSet] = {s.name: s for s in [
    EvalSet("STS12", "sts", _sts(2012), _STS_FILES.format(yy=12, prefix="STS")),
    EvalSet("STS13", "sts", _sts(2013), _STS_FILES.format(yy=13, prefix="STS") + " (no SMT)"),
    EvalSet("STS14", "sts", _sts(2014), _STS_FILES.format(yy=14, prefix="STS")),
    EvalSet("STS15", "sts", _sts(2015), _STS_FILES.format(yy=15, prefix="STS")),
    EvalSet("STS16", "sts", _sts(2016), _STS_FILES.format(yy=16, prefix="STS2016")),
    EvalSet("STSBenchmark", "sts", _one(functools.partial(readers.read_stsb, split="test")),
            "stsb/original/sts-test.csv"),
    EvalSet("SICKRelatedness", "sts", _one(functools.partial(readers.read_sick, split="test")),
            "sick/brmson_semeval2014/SICK_test_annotated.txt"),
    EvalSet("MR", "transfer", _one(functools.partial(readers.read_binary, task="MR"), senteval_sorted),
            "senteval_transfer/MR/rt-polarity.{pos,neg}"),
    EvalSet("CR", "transfer", _one(functools.partial(readers.read_binary, task="CR"), senteval_sorted),
            "senteval_transfer/CR/custrev.{pos,neg}"),
    EvalSet("SUBJ", "transfer", _one(functools.partial(readers.read_binary, task="SUBJ"), senteval_sorted),
            "senteval_transfer/SUBJ/subj.{objective,subjective}"),
    EvalSet("MPQA", "transfer", _one(functools.partial(readers.read_binary, task="MPQA"), senteval_sorted),
            "senteval_transfer/MPQA/mpqa.{pos,neg}"),
    EvalSet("SST2", "transfer", _parts(readers.read_sst2, ("train", "dev", "test")),
            "senteval_transfer/SST/binary/sentiment-{train,dev,test}"),
    EvalSet("TREC", "transfer", _parts(readers.read_trec, ("train", "test"), senteval_sorted),
            "senteval_transfer/TREC/{train_5500,TREC_10}.label"),
    EvalSet("MRPC", "transfer", _parts(readers.read_mrpc, ("train", "test"), senteval_sorted),
            "senteval_transfer/MRPC/msr_paraphrase_{train,test}.txt"),
    EvalSet("SentGLUE-CoLA", "sentglue", _glue("CoLA", ("train", "dev", "dev_ood")),
            "glue/CoLA/{train,dev,out_of_domain_dev}.tsv"),
    EvalSet("SentGLUE-SST2", "sentglue", _glue("SST-2", ("train", "dev")), "glue/SST-2/{train,dev}.tsv"),
    EvalSet("SentGLUE-MRPC", "sentglue", _glue("MRPC", ("train", "dev")), "glue/MRPC/{train,dev}.tsv"),
    EvalSet("SentGLUE-STSB", "sentglue", _glue("STS-B", ("train", "dev")), "glue/STS-B/{train,dev}.tsv"),
    EvalSet("SentGLUE-RTE", "sentglue", _glue("RTE", ("train", "dev")), "glue/RTE/{train,dev}.tsv"),
    EvalSet("SentGLUE-QNLI", "sentglue", _one(functools.partial(readers.read_glue, task="QNLI", split="dev")),
            "glue/QNLI/dev.tsv (two halves)"),
    EvalSet("AlignUniform", "geometry", _distinct_sentences(functools.partial(readers.read_stsb, split="test")),
            "stsb/original/sts-test.csv"),
    EvalSet("ReQA-SQuAD", "retrieval", _retrieval(retrieval_readers.read_squad),
            f"{retrieval_readers.SQUAD_OFFICIAL_DEV}, else {retrieval_readers.SQUAD_RECONSTRUCTED_DEV}", "retrieval"),
    EvalSet("SQuAD-paragraphs", "retrieval",
            _retrieval(functools.partial(retrieval_readers.read_squad, level="paragraph")),
            f"{retrieval_readers.SQUAD_OFFICIAL_DEV}, else {retrieval_readers.SQUAD_RECONSTRUCTED_DEV}", "retrieval"),
    EvalSet("SemEval2016-B", "retrieval", _retrieval(retrieval_readers.read_semeval_b),
            retrieval_readers.SEMEVAL_B.format(split="TEST"), "retrieval"),
    EvalSet("WikiQA", "retrieval", _retrieval(retrieval_readers.read_wikiqa),
            retrieval_readers.WIKIQA.format(split="test"), "retrieval"),
    EvalSet("TREC-QA", "retrieval", _retrieval(retrieval_readers.read_trecqa),
            retrieval_readers.TRECQA.format(split="test"), "retrieval"),
    EvalSet("STSBenchmarkDev", "dev", _one(functools.partial(readers.read_stsb, split="dev")),
            "stsb/original/sts-dev.csv"),
    EvalSet("TREC-QA-dev", "dev", _retrieval(functools.partial(retrieval_readers.read_trecqa, split="dev")),
            retrieval_readers.TRECQA.format(split="dev"), "retrieval"),
    EvalSet("SemEval2016-B-dev", "dev", _retrieval(functools.partial(retrieval_readers.read_semeval_b, split="VAL")),
            retrieval_readers.SEMEVAL_B.format(split="VAL"), "retrieval"),
]}
SUITES = {suite: [s.name for s in SETS.values() if s.suite == suite]
          for suite in dict.fromkeys(s.suite for s in SETS.values())}
SUITES["all"] = [s.name for s in SETS.values() if s.suite != "dev"]
ALIASES = {"sts-b": "STSBenchmark", "stsb": "STSBenchmark", "sick-r": "SICKRelatedness", "sickr": "SICKRelatedness",
           "sst-2": "SST2", "geometry": "AlignUniform", "reqa": "ReQA-SQuAD", "trecqa": "TREC-QA",
           "semeval2016b": "SemEval2016-B"}
BEIR_PREFIX = "beir:"


def beir_set(spec: str) -> EvalSet:
  """The evaluation set of a BEIR folder, named `beir:FOLDER[:split]` (split default test; local or gs://)."""
  from st5_jax.retrieval import beir  # pylint: disable=g-import-not-at-top  (read only when a BEIR set is named)

  folder, split = spec[len(BEIR_PREFIX):], "test"
  head, _, tail = folder.rpartition(":")
  if head and tail and "/" not in tail:  # FOLDER:split (a gs:// scheme's colon is followed by "//")
    folder, split = head, tail

  def read(root):
    del root  # a BEIR folder is its own data
    return beir.load_beir(folder, split)

  return EvalSet(f"{BEIR_PREFIX}{folder}" + (f":{split}" if split != "test" else ""), "retrieval", _retrieval(read),
                 f"{folder} (corpus.jsonl, queries.jsonl, qrels/{split}.tsv)", "retrieval")


def get_set(name: str) -> EvalSet:
  """A registered evaluation set, or the set of a BEIR folder (`beir:FOLDER[:split]`)."""
  if name.startswith(BEIR_PREFIX):
    return beir_set(name)
  return SETS[name]


def resolve_tasks(tasks: str | Sequence[str]) -> list[str]:
  """Task and suite names (case-insensitive, comma-separated or a list) -> task names, in order."""
  if isinstance(tasks, str):
    tasks = [tasks]
  lower = {name.lower(): name for name in SETS}
  out = []
  for item in (t.strip() for entry in tasks for t in entry.split(",")):
    if not item:
      continue
    key = item.lower()
    if key.startswith(BEIR_PREFIX):
      out.append(beir_set(item).name)
    elif key in SUITES:
      out += SUITES[key]
    elif key in lower:
      out.append(lower[key])
    elif key in ALIASES:
      out.append(ALIASES[key])
    else:
      raise ValueError(f"unknown task or suite {item!r}; suites: {sorted(SUITES)}, tasks: {list(SETS)}")
  return list(dict.fromkeys(out))


def texts(name: str, data_dir=None) -> list[str]:
  """Every text evaluation set `name` encodes, in order (data_dir: default $ST5_DATA_DIR)."""
  return get_set(name).read(paths.data_dir(data_dir))[0]
