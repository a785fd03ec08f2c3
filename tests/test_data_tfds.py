"""TFDS: the catalogue's snli / multi_nli / squad as Sentence-T5 tasks, and `st5 data prepare --tfds`.

The catalogue datasets are read from a local TFDS folder that TFDS's own builders wrote
(tests/tfds_local.py: same names, versions and features as gs://tfds-data); what is
checked against is re-derived here from the raw files of ../shared/data.
"""

import collections
import json

import pytest
import seqio
import tensorflow as tf
import tensorflow_datasets as tfds

import tfds_local
from st5_jax.data import builders, tasks, tfds_tasks
from st5_jax.data.offline import prepare, tfds_builders
from st5_jax.data.iterator import make_local_iterator
from st5_jax.data.rows import RowStats


@pytest.fixture(scope="module")
def catalogue(data_dir, tmp_path_factory):
  return tfds_local.build(data_dir, tmp_path_factory.mktemp("tfds"))


@pytest.fixture
def tfds_env(catalogue, monkeypatch):
  monkeypatch.setenv("TFDS_DATA_DIR", str(catalogue))
  monkeypatch.setenv("ST5_DATA_DECONTAMINATE", "0")  # decontamination: test_data_overlap.py
  return catalogue


def _squad(data_dir):
  with open(data_dir / "squad_v1.1_dev" / "dev-v1.1.reconstructed.json", encoding="utf-8") as f:
    return json.load(f)["data"]


def test_tf_sentence_splitter_equals_the_python_one_on_all_of_squad_dev(data_dir):
  contexts = [p["context"] for a in _squad(data_dir) for p in a["paragraphs"]]
  contexts += ["Dr. Smith met J. K. Rowling in the U.S. Army base. It rained! Then 3 people left? \"Yes,\" she said.",
               "  Leading space. Then (e.g. this) Mr. X.   ", "The winner.:245 There were [3] notes.[3] And more.\xa0Next.",
               "A. B. C. D.", "end.) Next", "x", "Prices rose 2.5 percent. The U.N. met. (Hello.) \u201cQuoted.\u201d Done."]
  ds = tf.data.Dataset.from_tensor_slices(contexts).map(lambda c: tfds_tasks.sentence_pieces(c)[1:])
  got = [list(zip(s.tolist(), e.tolist())) for s, e in ds.as_numpy_iterator()]
  want = [builders.split_sentences(c) for c in contexts]
  assert len(contexts) == 2067 + 7
  assert got == want
  assert sum(len(w) for w in want) > 2 * len(contexts)  # paragraphs do split into sentences


def test_reqa_preprocessor_gives_the_python_builders_pairs(catalogue, data_dir):
  stats = RowStats()
  python = builders.build_reqa_squad(data_dir, stats=stats, files=builders.SQUAD_DEV_RECONSTRUCTED)
  source = tfds.builder("squad/v1.1:3.0.0", data_dir=str(catalogue)).as_dataset(split="train")
  pairs = [(ex["inputs"].decode(), ex["targets"].decode())
           for ex in tfds_tasks.reqa_sentences(source).as_numpy_iterator()]
  # The same pairs; the Python builder also drops duplicates up to case and spacing (the TF one keeps them).
  key = lambda q, t: (" ".join(q.lower().split()), " ".join(t.lower().split()))  # noqa: E731
  assert {key(q, t) for q, t in pairs} == {key(ex["inputs"], ex["targets"]) for ex in python.examples}
  assert {(ex["inputs"], ex["targets"]) for ex in python.examples} <= set(pairs)
  crossing = stats.filtered_by_reason["answer crosses a sentence boundary"]
  assert len(pairs) == 10570 - crossing - stats.rows_skipped
  # Duplicates up to case and spacing, counted here from the TF pairs.
  duplicates = len(pairs) - len({key(q, t) for q, t in pairs})
  assert len(pairs) - len(python.examples) == stats.filtered_by_reason["duplicate pair"] == duplicates > 0


def _raw_groups(data_dir, split):
  groups = collections.defaultdict(lambda: {"entailment": set(), "contradiction": set()})
  for premise, hypothesis, label in tfds_local._senteval_pairs(data_dir, split):  # pylint: disable=protected-access
    if label in ("entailment", "contradiction"):
      groups[premise][label].add(hypothesis)
  return {p: g for p, g in groups.items() if g["entailment"] and g["contradiction"]}


def test_nli_triples_one_per_premise_independent_of_order(catalogue, data_dir):
  groups = _raw_groups(data_dir, "dev")  # the stand-in snli train split is SNLI dev
  builder = tfds.builder("snli:1.1.0", data_dir=str(catalogue))

  def triples(ds):
    return sorted((e["inputs"].decode(), e["targets"].decode(), e["negative_targets"].decode())
                  for e in tfds_tasks.nli_triples(ds).as_numpy_iterator())

  got = triples(builder.as_dataset(split="train"))
  assert len(got) == len(groups) == 2943  # premises with an entailment and a contradiction (docs/data.md)
  for premise, entail, contra in got:
    assert entail in groups[premise]["entailment"] and contra in groups[premise]["contradiction"]
  # Which entailment/contradiction is kept does not depend on the order pairs are read in.
  assert triples(builder.as_dataset(split="train").shuffle(20000, seed=3)) == got


def test_catalogue_tasks_train_from_the_tfds_folder(tfds_env):
  it = make_local_iterator(task=tasks.TFDS_NLI_TRIPLES_MIXTURE, feature_lengths={"inputs": 24, "targets": 24},
                           batch_size=32, seed=1)
  batches = [next(it) for _ in range(4)]
  assert set(batches[0]) == {"left_encoder_input_tokens", "right_encoder_input_tokens",
                             "right_negative_encoder_input_tokens"}
  consumed = {t: s["examples_consumed"] for t, s in it.stats["tasks"].items()}
  # Rates are the catalogue's pair counts (seqio.mixing_rate_num_examples): 9842 vs 9824.
  assert consumed == {tasks.TFDS_MULTI_NLI_TRIPLES: 64, tasks.TFDS_SNLI_TRIPLES: 64}
  # Each rate is its dataset's size, counted here by reading the TFDS split (a rate of 1.0, or the
  # other task's size, fails: the sizes differ).
  mixture = seqio.get_mixture_or_task(tasks.TFDS_NLI_TRIPLES_MIXTURE)
  sizes = {}
  for t in mixture.tasks:
    builder = tfds.builder(t.source.tfds_dataset.name, data_dir=str(tfds_env))
    sizes[t.name] = sum(1 for _ in builder.as_dataset(split="train"))
    assert mixture.get_rate(t) == sizes[t.name], t.name
  assert len(set(sizes.values())) == 2 and min(sizes.values()) > 9000
  it.close()
  squad = make_local_iterator(task=tasks.TFDS_REQA_SQUAD, feature_lengths={"inputs": 24, "targets": 48},
                              batch_size=8)
  assert next(squad)["right_encoder_input_tokens"].shape == (8, 48)
  assert seqio.get_mixture_or_task(tasks.TFDS_REQA_SQUAD).splits == ("train",)  # never SQuAD dev


def test_prepare_writes_tfds_datasets_that_tfds_and_seqio_read(data_dir, tmp_path, monkeypatch):
  monkeypatch.setenv("ST5_DATA_DECONTAMINATE", "0")
  out = tmp_path / "data"
  report = prepare.prepare(out_dir=str(out), source_dir=str(data_dir), datasets=["wikiqa", "snli_triples_derived"],
                           offline=True, progress=False, tfds=True)
  assert report.ok, report.summary()
  assert {(t, name) for t, name, _, _ in report.tfds} == {
      ("st5_wikiqa_positives", "st5_qa_pairs/wikiqa_positives:1.0.0"),
      ("st5_snli_devtest_triples", "st5_nli_triples/snli_devtest_triples:1.0.0")}
  jsonl = [json.loads(line) for line in (out / "prepared" / "st5_wikiqa_positives" / "train.jsonl").open()]
  # The TFDS folder describes itself: read it as a user would, without st5_jax's builder classes.
  reader = tfds.builder_from_directory(str(out / "tfds" / "st5_qa_pairs" / "wikiqa_positives" / "1.0.0"))
  rows = [{k: v.decode() for k, v in ex.items()} for ex in reader.as_dataset(split="train").as_numpy_iterator()]
  assert sorted(json.dumps(r, sort_keys=True) for r in rows) == sorted(
      json.dumps({k: r[k] for k in ("inputs", "targets", "source")}, sort_keys=True) for r in jsonl)
  triples = tfds.builder("st5_nli_triples/snli_devtest_triples:1.0.0", data_dir=str(out / "tfds"))
  assert {k: v.num_examples for k, v in triples.info.splits.items()} == {"train": 3172, "validation": 3167}
  # TFDS's own "all" is the task's "all" split (the union).
  assert sum(1 for _ in tfds.load("st5_nli_triples/snli_devtest_triples", split="all",
                                  data_dir=str(out / "tfds"))) == 6339
  # A seqio TfdsDataSource task over it trains (seqio path).
  name = "test_tfds_prepared_wikiqa"
  seqio.TaskRegistry.remove(name)
  seqio.TaskRegistry.add(name, source=seqio.TfdsDataSource(tfds_builders.tfds_name("st5_wikiqa_positives"),
                                                           tfds_data_dir=str(out / "tfds")),
                         preprocessors=[seqio.preprocessors.tokenize, seqio.preprocessors.append_eos_after_trim],
                         output_features={k: seqio.Feature(vocabulary=tasks.get_vocabulary(), add_eos=True)
                                          for k in ("inputs", "targets")})
  it = make_local_iterator(task=name, feature_lengths={"inputs": 16, "targets": 16}, batch_size=len(jsonl),
                           shuffle=False, repeat=False)
  batch = next(it)
  vocab = tasks.get_vocabulary()
  decoded = sorted(vocab.decode([int(t) for t in row if t > 1]) for row in batch["left_encoder_input_tokens"])
  assert decoded == sorted(vocab.decode(vocab.encode(r["inputs"])[:15]) for r in jsonl)
  # Idempotent: a second run keeps the TFDS datasets.
  again = prepare.prepare(out_dir=str(out), source_dir=str(data_dir), datasets=["wikiqa", "snli_triples_derived"],
                          offline=True, progress=False, tfds=True)
  assert {status for _, _, _, status in again.tfds} == {"up to date"}
