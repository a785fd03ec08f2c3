"""MTEB's names for what a model was trained on: our training tasks, BEIR folders, our evaluation sets.

mteb's `ModelMeta.training_datasets` lists the datasets a model was trained on, by the names mteb
uses, so that the leaderboard can tell a zero-shot score from one on a test set the model saw
(mteb #1372). Two kinds of names go in it, both checked against mteb 2.26.24 by tests/test_mteb.py:

* an MTEB task name (`mteb.get_task(name)` finds it), for data MTEB evaluates on: ConSERT's
  transductive STS sentences are the STS12-16 / STSBenchmark / SICK-R test texts;
* for data MTEB has no task of, the name mteb's own model metas use for it (at least one of
  `mteb.get_model_metas()` lists it): "SNLI", "MNLI", "SQuAD", "WikiQA" (mteb's own
  sentence-t5 metas list {"SNLI", "Community QA"}).

A task mapped to () is known to hold nothing MTEB names (TREC-QA, Qatar Living, C4). A task absent
from TASK_NAMES (users' tasks, UNKNOWN_TASKS: their data is whatever the user points them at) is unknown:
it adds no name; check it with `st5 data overlap` and give the report to `st5 export --contamination_report`,
whose test sets with any contamination are listed as trained on (`report_names`).

Light: no mteb, seqio or TensorFlow import (the model card reads it).
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

_STS = ("STS12", "STS13", "STS14", "STS15", "STS16", "STSBenchmark", "SICK-R")

# Our training tasks and mixtures -> the MTEB names of the datasets they are built from.
TASK_NAMES: dict[str, tuple[str, ...]] = {
    # stage 1 (st5_jax/data/tasks.py)
    "st5_reqa_squad_sentences": ("SQuAD",),  # SQuAD v1.1 train
    "st5_tfds_reqa_squad": ("SQuAD",),
    "st5_qatar_living_good_answers": (),  # SemEval-2016 task 3 (Qatar Living): no MTEB name
    "st5_qatar_living_perfect_match": (),
    "st5_trecqa_positives": (),  # TREC-QA (Wang et al. 2007): no MTEB name
    "st5_wikiqa_positives": ("WikiQA",),
    "st5_stage1_public_qa": ("WikiQA",),  # the four above
    # stage 2
    "st5_snli_devtest_triples": ("SNLI",),
    "st5_simcse_nli_triples": ("SNLI", "MNLI"),  # SimCSE's nli_for_simcse.csv: SNLI + MultiNLI train
    "st5_tfds_snli_triples": ("SNLI",),
    "st5_tfds_multi_nli_triples": ("MNLI",),
    "st5_tfds_nli_triples": ("SNLI", "MNLI"),
    # the objectives' tasks
    "consert_sts_sentences": _STS,  # the evaluation sets' own sentences (ConSERT's transductive protocol)
    "consert_snli_devtest_pairs": ("SNLI",),
    "consert_snli_mnli_pairs": ("SNLI", "MNLI"),
    "st5_seed_qa_text": ("WikiQA", "SQuAD"),  # the stage-1 QA texts, SQuAD train paragraphs when present
    "st5_seed_tfds_c4": (),
}

# The registered tasks whose data is the user's: no name can be known here.
UNKNOWN_TASKS = ("st5_user_qa_pairs", "st5_user_nli_triples", "st5_user_hard_negatives", "st5_seed_user_text",
                 "st5_distill")

# BEIR's dataset folders (the names of its download archives) -> the MTEB retrieval task of the same data.
# bioasq, signal1m, trec-news and robust04 have no MTEB task.
BEIR_NAMES: dict[str, str] = {
    "msmarco": "MSMARCO", "trec-covid": "TRECCOVID", "nfcorpus": "NFCorpus", "nq": "NQ", "hotpotqa": "HotpotQA",
    "fiqa": "FiQA2018", "arguana": "ArguAna", "webis-touche2020": "Touche2020", "quora": "QuoraRetrieval",
    "dbpedia-entity": "DBPedia", "scidocs": "SCIDOCS", "fever": "FEVER", "climate-fever": "ClimateFEVER",
    "scifact": "SciFact",
    **{f"cqadupstack/{forum}": f"CQADupstack{forum.capitalize()}Retrieval"
       for forum in ("android", "english", "gaming", "gis", "mathematica", "physics", "programmers", "stats", "tex",
                     "unix", "webmasters", "wordpress")},
}

# Our evaluation sets (st5_jax/evaluation/sets.py) -> the MTEB task of the same data (STS-B dev counts as
# STSBenchmark: trained on, the dataset is not zero-shot).
EVAL_NAMES: dict[str, str] = {
    "STS12": "STS12", "STS13": "STS13", "STS14": "STS14", "STS15": "STS15", "STS16": "STS16",
    "STSBenchmark": "STSBenchmark", "STSBenchmarkDev": "STSBenchmark", "SentGLUE-STSB": "STSBenchmark",
    "SICKRelatedness": "SICK-R",
}


def beir_name(folder_name: str) -> str | None:
  """The MTEB task of a BEIR folder named `folder_name` ("scifact", "cqadupstack/android"), if any."""
  return BEIR_NAMES.get(folder_name.lower())


def task_names(tasks: Iterable[str]) -> tuple[set[str], list[str]]:
  """(MTEB names of the training tasks, the tasks with no mapping)."""
  names: set[str] = set()
  unknown = []
  for task in tasks:
    if task in TASK_NAMES:
      names.update(TASK_NAMES[task])
    else:
      unknown.append(task)
  return names, unknown


def report_names(report: Mapping[str, Any] | None) -> set[str]:
  """MTEB names of a contamination report's test sets with any contamination (exact or near, on any side)."""
  out = set()
  for test_set in (report or {}).get("test_sets", []):
    if test_set.get("mteb_name") and any(s.get("contaminated", 0) > 0 for s in test_set.get("sides", {}).values()):
      out.add(test_set["mteb_name"])
  return out


def training_datasets(tasks: Iterable[str], report: Mapping[str, Any] | None = None) -> set[str] | None:
  """`ModelMeta.training_datasets`: the mapped names of the tasks, plus the report's contaminated test sets.

  None (mteb's "not known") when no task maps to anything known and there is no report."""
  tasks = list(tasks)
  names, unknown = task_names(tasks)
  if report is None and len(unknown) == len(tasks):
    return None
  return names | report_names(report)
