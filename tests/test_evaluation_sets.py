"""The evaluation sets' table (st5_jax.evaluation.sets): its texts, its one-place registration, the input errors.

The light module is what the harness, decontamination (st5_jax.data.overlap) and the
objectives' tasks share; tests/test_imports.py checks that it stays light and that data and
evaluation depend on each other only through it.
"""

import hashlib

import numpy as np
import pytest

from st5_jax import cli, errors
from st5_jax.data import overlap, rows
from st5_jax.evaluation import harness, readers, sets

# (number of texts, sha256 of "\n".join(texts)[:16]) of every set, in table order, as the harness
# computed them before the sets moved into st5_jax.evaluation.sets (code of 850f070): the same
# sets, texts and order.
TEXTS = {
    "STS12": (6216, "6d24b0fb208d8aaf"),
    "STS13": (3000, "25e9699442aff339"),
    "STS14": (7500, "52e4597968e076af"),
    "STS15": (6000, "250ef6b92333fa49"),
    "STS16": (2372, "8466bc0885ec3d70"),
    "STSBenchmark": (2758, "2e953dfdd7302cc9"),
    "SICKRelatedness": (9854, "16cd73aa2d2afecf"),
    "MR": (10662, "905ad67d686c0647"),
    "CR": (3775, "692d8d30b9e071b2"),
    "SUBJ": (10000, "23fb656cdd9fe0f6"),
    "MPQA": (10606, "83207538349fc240"),
    "SST2": (70042, "ec068e00824a13ec"),
    "TREC": (5952, "da9a7a23c5c99efe"),
    "MRPC": (11602, "937b00481a364715"),
    "SentGLUE-CoLA": (9594, "4e8155665414a821"),
    "SentGLUE-SST2": (68221, "ae0222dc15dbcbfa"),
    "SentGLUE-MRPC": (8150, "05286e1c724b2253"),
    "SentGLUE-STSB": (14498, "638e702b3758d5f8"),
    "SentGLUE-RTE": (5534, "b086481e35290f3b"),
    "SentGLUE-QNLI": (10926, "0810305da847362d"),
    "AlignUniform": (2551, "90f1b5577da25c29"),
    # The retrieval sets (queries, then each relevant document once), pinned with the code of d54166e.
    "ReQA-SQuAD": (17489, "c55bd905c03d6300"),
    "SQuAD-paragraphs": (12637, "19dd3fbbe009f73e"),
    "SemEval2016-B": (238, "ad917949f3c8c154"),  # without its 39 self-pairs (282, 7a0e5fb1bcb756e0 with them)
    "WikiQA": (535, "54634a613a51a663"),
    "TREC-QA": (354, "70a6697b8eb0b813"),
    "STSBenchmarkDev": (3000, "49a8f4332d2a8ece"),
    "TREC-QA-dev": (276, "608b8a1780048d7e"),
    "SemEval2016-B-dev": (244, "024a2c30107e4d1a"),
}


def _digest(texts):
  return len(texts), hashlib.sha256("\n".join(texts).encode("utf-8")).hexdigest()[:16]


def test_every_set_encodes_the_same_texts_in_the_same_order(data_dir):
  assert list(sets.SETS) == list(TEXTS) == list(harness.TASKS)
  got = {name: _digest(sets.texts(name, data_dir)) for name in sets.SETS}
  assert got == TEXTS
  # The harness encodes exactly these (its tasks read through the table).
  texts, _ = harness.TASKS["TREC"].build(data_dir, kfold=3)
  assert _digest(texts) == TEXTS["TREC"]


def test_senteval_order_sorts_by_token_counts_then_label_stably():
  single = readers.Labeled(["b c d", "a", "x y", "z", "p q"], np.array([0, 1, 1, 0, 1]))
  out = sets.senteval_sorted(single)
  assert out.texts == ["z", "a", "x y", "p q", "b c d"] and out.labels.tolist() == [0, 1, 1, 1, 0]
  pairs = readers.LabeledPairs(["a b", "a", "a", "c"], ["x", "y z", "y", "w"], np.array([1, 1, 0, 0]))
  out = sets.senteval_sorted(pairs)
  assert out.sents1 == ["a", "c", "a", "a b"] and out.sents2 == ["y", "w", "y z", "x"]
  assert out.labels.tolist() == [0, 0, 1, 1]


def test_a_set_added_to_the_table_joins_decontamination_and_needs_a_scorer(data_dir, monkeypatch):
  # A new set is one row in sets.SETS, read -> (texts, data); an "encode" set also needs a scorer.
  question = "Which zoo keeps the oldest koala, Qwerty-7?"
  assert overlap.normalize(question) not in overlap.evaluation_index(str(data_dir))
  new = sets.EvalSet("ToyRetrieval", "retrieval", lambda root: ([question, "Zoo Qwerty-7 does."], None), "toy/none")
  monkeypatch.setitem(sets.SETS, new.name, new)
  overlap.evaluation_index.cache_clear()
  try:
    assert overlap.evaluation_sets("all")[-1] == "ToyRetrieval"
    assert overlap.evaluation_texts(str(data_dir))["ToyRetrieval"] == {"whichzookeepstheoldestkoalaqwerty7",
                                                                       "zooqwerty7does"}
    stats = rows.RowStats()
    kept, missing = overlap.decontaminate([{"inputs": "which zoo keeps the OLDEST koala , qwerty 7 ?", "targets": "x"},
                                           {"inputs": "unrelated words", "targets": "nothing here"}],
                                          ["inputs", "targets"], data_dir=str(data_dir), stats=stats)
    assert [ex["inputs"] for ex in kept] == ["unrelated words"] and not missing
    assert dict(stats.filtered_by_reason) == {"text in evaluation set ToyRetrieval": 1}
    with pytest.raises(RuntimeError, match=r"without a scorer: \['ToyRetrieval'\]"):
      harness._tasks()  # pylint: disable=protected-access
  finally:
    overlap.evaluation_index.cache_clear()


def test_input_errors_live_on_the_ground_floor_and_stay_user_errors():
  assert rows.BadRowError is errors.BadRowError and rows.InputFileError is errors.InputFileError
  assert issubclass(errors.BadRowError, ValueError) and issubclass(errors.InputFileError, FileNotFoundError)
  # Raised here, outside the package: classified by their module (st5_jax.errors), one line unchanged.
  for exc_type, message in ((errors.BadRowError, "a.tsv:3: too few fields (strict mode)"),
                            (errors.InputFileError, "Input file a.tsv is empty.")):
    try:
      raise exc_type(message)
    except exc_type as e:
      assert cli.is_user_error(e) and cli.one_line(e) == message


def test_readers_raise_the_ground_floor_error(tmp_path):
  (tmp_path / "stsb" / "original").mkdir(parents=True)
  (tmp_path / "stsb" / "original" / "sts-dev.csv").write_text("main\tx\t2012\t1\tnot-a-score\ta\tb\n")
  with pytest.raises(errors.BadRowError, match=r"sts-dev\.csv:1: ValueError"):
    sets.texts("STSBenchmarkDev", tmp_path)
