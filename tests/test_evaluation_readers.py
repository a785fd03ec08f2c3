"""Every reader against the row counts of ../shared/data/DATA.md (and the datasets' published sizes)."""

import numpy as np
import pytest

from st5_jax import paths
from st5_jax.evaluation import readers


def _nonblank_gold(data_dir, year):
  folder = data_dir / "sts12-16" / "original" / f"STS{year % 100}-en-test"
  prefix = "STS2016" if year == 2016 else "STS"
  return sum(sum(1 for line in open(folder / f"{prefix}.gs.{s}.txt", encoding="utf-8") if line.strip())
             for s in readers.STS_SUBSETS[year])


# DATA.md gives no per-year STS12-16 counts; these are the scored pairs SentEval and MTEB
# use (STS13 without SMT), and the test also recounts the non-blank gold lines.
@pytest.mark.parametrize("year,pairs", [(2012, 3108), (2013, 1500), (2014, 3750), (2015, 3000), (2016, 1186)])
def test_sts_years(data_dir, year, pairs):
  original = readers.read_sts(data_dir, year=year)
  tokenized = readers.read_sts(data_dir, year=year, tokenized=True)
  assert len(original) == len(tokenized) == pairs == _nonblank_gold(data_dir, year)
  np.testing.assert_array_equal(original.scores, tokenized.scores)  # same pairs, same order
  assert original.scores.min() >= 0 and original.scores.max() <= 5
  assert list(dict.fromkeys(original.subsets)) == list(readers.STS_SUBSETS[year])
  assert all(original.sents1) and all(original.sents2)
  assert original.sents1 != tokenized.sents1  # original text, not SentEval's lower-cased tokens


def test_stsb(data_dir):
  # DATA.md: STS Benchmark train/dev/test 5749/1500/1379.
  for split, n in (("train", 5749), ("dev", 1500), ("test", 1379)):
    data = readers.read_stsb(data_dir, split=split)
    assert len(data) == n == len(readers.read_stsb(data_dir, split=split, tokenized=True))
    assert data.scores.min() >= 0 and data.scores.max() <= 5 and all(data.sents2)


def test_sick(data_dir):
  # DATA.md: SICK train/trial/test 4500/500/4927, "same pairs and scores" in both copies.
  for split, n in (("train", 4500), ("trial", 500), ("test", 4927)):
    data = readers.read_sick(data_dir, split=split)
    tok = readers.read_sick(data_dir, split=split, tokenized=True)
    assert len(data) == len(tok) == n
    np.testing.assert_array_equal(data.scores, tok.scores)
    assert data.scores.min() >= 1 and data.scores.max() <= 5
    assert not any("\r" in s for s in data.sents2)  # the test file has CRLF line ends


@pytest.mark.parametrize("task,pos,neg", [("MR", 5331, 5331), ("CR", 2407, 1368), ("SUBJ", 5000, 5000),
                                          ("MPQA", 3312, 7294)])
def test_binary(data_dir, task, pos, neg):
  # DATA.md: MR 5331+5331, CR 2407+1368, SUBJ 5000+5000, MPQA 3312+7294 (blank lines included).
  data = readers.read_binary(data_dir, task=task)
  assert len(data) == pos + neg
  assert int(data.labels.sum()) == pos
  assert all(data.texts)  # blank lines become "."


def test_sst2_trec_mrpc(data_dir):
  # DATA.md: SST-2 67349/872/1821, TREC 5452/500.
  for split, n in (("train", 67349), ("dev", 872), ("test", 1821)):
    data = readers.read_sst2(data_dir, split=split)
    assert len(data) == n and set(np.unique(data.labels)) == {0, 1}
  for split, n in (("train", 5452), ("test", 500)):
    data = readers.read_trec(data_dir, split=split)
    assert len(data) == n and set(np.unique(data.labels)) == set(range(6))
  # DATA.md: MRPC 4077/1726 -- those are line counts; one of them is the header, so
  # 4076/1725 pairs (the sizes of the MSR Paraphrase Corpus).
  for split, n in (("train", 4076), ("test", 1725)):
    data = readers.read_mrpc(data_dir, split=split)
    assert len(data) == n and set(np.unique(data.labels)) == {0, 1}


def test_glue(data_dir):
  # DATA.md: "row counts match GLUE except MRPC train (3667, one short)". GLUE's sizes:
  # CoLA train 8551, dev 1043 (= in-domain 527 + out-of-domain 516), SST-2 67349/872,
  # MRPC 3668/408, STS-B 5749/1500, RTE 2490/277, QNLI dev 5463.
  expected = {("CoLA", "train"): 8551, ("CoLA", "dev"): 527, ("CoLA", "dev_ood"): 516, ("SST-2", "train"): 67349,
              ("SST-2", "dev"): 872, ("MRPC", "train"): 3667, ("MRPC", "dev"): 408, ("STS-B", "train"): 5749,
              ("STS-B", "dev"): 1500, ("RTE", "train"): 2490, ("RTE", "dev"): 277, ("QNLI", "dev"): 5463}
  assert expected[("CoLA", "dev")] + expected[("CoLA", "dev_ood")] == 1043
  for (task, split), n in expected.items():
    data = readers.read_glue(data_dir, task=task, split=split)
    assert len(data) == n, (task, split)
    if task != "STS-B":
      assert set(np.unique(data.labels)) == {0, 1}


def test_missing_data_fails_loudly(tmp_path):
  with pytest.raises(paths.MissingFileError, match="sts-dev.csv"):
    readers.read_stsb(tmp_path, split="dev")
  with pytest.raises(paths.MissingFileError):
    readers.read_stsb(tmp_path / "absent", split="dev")
