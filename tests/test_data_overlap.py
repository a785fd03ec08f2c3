"""No evaluation text in the training data: `st5 data overlap`, decontaminated public tasks, the QNLI leak.

Overlaps are re-derived here with a normalisation written independently of
st5_jax.data.overlap / offline.overlap_report (NFKC, lower case, drop everything but letters and digits).
"""

import csv
import json
import re
import unicodedata

import pytest
import seqio

import tfds_local
from st5_jax import cli
from st5_jax.data import builders, overlap, registry, tasks
from st5_jax.data.offline import overlap_report
from st5_jax.data.rows import RowStats
from st5_jax.evaluation import harness


def _norm(text):
  return re.sub(r"[\W_]+", "", unicodedata.normalize("NFKC", text).lower())


@pytest.fixture(scope="module")
def eval_texts(data_dir):
  out = {}
  for name, spec in harness.TASKS.items():
    out[name] = {n for n in map(_norm, spec.build(str(data_dir))[0]) if n}
  return out


@pytest.fixture(scope="module")
def catalogue(data_dir, tmp_path_factory):
  return tfds_local.build(data_dir, tmp_path_factory.mktemp("tfds"))


def test_every_shipped_mixture_is_free_of_evaluation_texts(catalogue, monkeypatch, capsys):
  shipped = {n for n in seqio.MixtureRegistry.names() if n.startswith("st5_")}
  assert shipped == set(tasks.MIXTURES)
  # The TFDS mixture reads a local stand-in for the catalogue (SNLI dev/test pairs as snli/multi_nli train).
  monkeypatch.setenv("TFDS_DATA_DIR", str(catalogue))
  for mixture in sorted(shipped):
    rc = cli.main(["data", "overlap", "--tasks", mixture])
    out = capsys.readouterr().out
    assert rc == 0 and "No overlap" in out and "not checked" not in out, (mixture, out)


def test_public_tasks_drop_examples_that_share_an_evaluation_text(data_dir, eval_texts, monkeypatch):
  every = set().union(*eval_texts.values())
  source = seqio.get_mixture_or_task(tasks.TRECQA).source
  raw = source.build("train", decontaminate=False).examples
  built = source.build("train", decontaminate=True)
  clean = [ex for ex in raw if not {_norm(ex["inputs"]), _norm(ex["targets"])} & every]
  assert [(e["inputs"], e["targets"]) for e in built.examples] == [(e["inputs"], e["targets"]) for e in clean]
  removed = {k: v for k, v in built.stats.filtered_by_reason.items() if k.startswith("text in evaluation set")}
  assert sum(removed.values()) == len(raw) - len(clean) > 0
  # TREC-QA's questions are TREC QA-track questions; the dev split's (read for training) are the queries of
  # TREC-QA-dev, the retrieval set in-training selection uses, so its examples go too.
  assert set(removed) == {"text in evaluation set TREC", "text in evaluation set TREC-QA-dev"}
  # The switch is honoured when tasks are read, and counted in the iterator's build stats.
  monkeypatch.setenv("ST5_DATA_DECONTAMINATE", "0")
  assert len(source.examples("train")) == len(raw)
  monkeypatch.setenv("ST5_DATA_DECONTAMINATE", "1")
  assert len(source.examples("train")) == len(clean)


def test_tf_decontamination_equals_the_python_one(catalogue, data_dir, monkeypatch):
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  from st5_jax.data import tfds_tasks  # pylint: disable=g-import-not-at-top
  triples = tfds_tasks.nli_triples(tfds.builder("snli:1.1.0", data_dir=str(catalogue)).as_dataset(split="train"))
  features = ("inputs", "targets", "negative_targets")
  rows = [{k: v.decode() for k, v in ex.items()} for ex in triples.as_numpy_iterator()]
  kept, missing = overlap.decontaminate(rows, features, data_dir=str(data_dir), stats=RowStats())
  tf_kept = [{k: v.decode() for k, v in ex.items()}
             for ex in overlap.decontaminate_tf(triples, features, data_dir=str(data_dir)).as_numpy_iterator()]
  assert not missing and tf_kept == kept and 0 < len(rows) - len(kept) < 0.1 * len(rows)


def test_squad_dev_leaks_into_qnli_and_the_command_says_so(data_dir, eval_texts, capsys, monkeypatch):
  # What the default stage-1 mixture used to contain: ReQA pairs from SQuAD *dev*, not decontaminated.
  monkeypatch.setenv("ST5_DATA_DECONTAMINATE", "0")
  name = "test_reqa_squad_dev"
  registry.register_public_task(name, {"train": lambda d, **kw: builders.build_reqa_squad(
      d, files=builders.SQUAD_DEV_RECONSTRUCTED, **kw)})
  examples = seqio.get_mixture_or_task(name).source.examples("train")
  found, _ = overlap_report.find_overlaps([name], data_dir=str(data_dir), evaluations="SentGLUE-QNLI")
  texts = {_norm(t) for ex in examples for t in (ex["inputs"], ex["targets"])}
  assert [(o.evaluation, o.count) for o in found] == [("SentGLUE-QNLI", len(texts & eval_texts["SentGLUE-QNLI"]))]
  # From the raw files: every QNLI dev question is a SQuAD dev question (verbatim, too).
  with open(data_dir / "squad_v1.1_dev" / "dev-v1.1.reconstructed.json", encoding="utf-8") as f:
    squad_q = {_norm(q["question"]) for a in json.load(f)["data"] for p in a["paragraphs"] for q in p["qas"]}
  with open(data_dir / "glue" / "QNLI" / "dev.tsv", encoding="utf-8") as f:
    qnli = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
  assert len(qnli) == 5463 and sum(_norm(r["question"]) in squad_q for r in qnli) == 5463
  rc = cli.main(["data", "overlap", "--tasks", name, "--eval", "SentGLUE-QNLI,TREC", "--json"])
  report = json.loads(capsys.readouterr().out)
  assert rc == 1 and {o["evaluation"] for o in report["overlaps"]} == {"SentGLUE-QNLI", "TREC"}
  # The contamination check (st5_jax.data.offline.contamination) on the same task: its exact matches are these
  # overlaps, its near duplicates (Jaccard >= 0.9 of character 5-grams) come on top, each verified here.
  rc = cli.main(["data", "overlap", "--tasks", name, "--eval", "SentGLUE-QNLI", "--near_threshold", "0.9", "--json"])
  (test_set,) = json.loads(capsys.readouterr().out)["test_sets"]
  side = test_set["sides"]["texts"]
  assert rc == 1 and test_set["name"] == "SentGLUE-QNLI" and side["total"] == len(eval_texts["SentGLUE-QNLI"])
  assert side["exact"] == len(texts & eval_texts["SentGLUE-QNLI"]) == found[0].count
  grams = lambda n: {n[i:i + 5] for i in range(len(n) - 4)} or {n}
  assert side["near"] > 0 and side["near_examples"]  # QNLI's sentences cut differently from ReQA's (10, docs/data.md)
  for e in side["near_examples"]:
    a, b = grams(_norm(e["training_text"])), grams(_norm(e["test_text"]))
    assert _norm(e["training_text"]) != _norm(e["test_text"]) and len(a & b) / len(a | b) >= 0.9


def test_stage1_mixture_has_no_squad_and_reqa_needs_squad_train(data_dir):
  mixture = seqio.get_mixture_or_task(tasks.STAGE1_PUBLIC_QA_MIXTURE)
  assert tasks.REQA_SQUAD not in {t.name for t in mixture.tasks}
  with pytest.raises(FileNotFoundError, match="SQuAD v1.1 train only"):
    seqio.get_mixture_or_task(tasks.REQA_SQUAD).source.build("train")
