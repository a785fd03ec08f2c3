"""Any seqio Task or Mixture as training input: seqio's own sources and preprocessors, generic features."""

import collections
import csv
import functools
import json

import jax
import numpy as np
import pytest
import seqio
import tensorflow as tf

from st5_jax import features, vocab
from st5_jax.data import feature_converters, tasks
from st5_jax.batch_geometry import DataConfigError
from st5_jax.data.iterator import make_local_iterator, make_train_iterator


def _take(it, n):
  return [{k: np.asarray(v) for k, v in next(it).items()} for _ in range(n)]


def _same(a, b):
  assert len(a) == len(b)
  for x, y in zip(a, b):
    assert x.keys() == y.keys()
    for k in x:
      np.testing.assert_array_equal(x[k], y[k], err_msg=k)


def _rows(batches, key):
  return [tuple(r[r != 0].tolist()) for b in batches for r in b[key]]


@pytest.fixture(scope="module")
def tokenizer(vocab_path):
  return vocab.Tokenizer(vocab_path)


@pytest.fixture(scope="module")
def trec_pairs(data_dir):
  """TREC-QA positive (question, answer) pairs of train.csv, read here with the csv module."""
  with open(data_dir / "qa_pairs" / "trecqa_wang" / "train.csv", newline="", encoding="utf-8") as f:
    return [(r["qtext"].strip(), r["atext"].strip()) for r in csv.DictReader(f) if r["label"] == "1"]


@seqio.map_over_dataset
def _parse_tsv(line):
  question, answer = tf.io.decode_csv(line, record_defaults=["", ""], field_delim="\t", use_quote_delim=False)
  return {"question": question, "answer": answer}


def _lowercase(ds):
  return ds.map(lambda ex: {k: tf.strings.lower(v, encoding="utf-8") for k, v in ex.items()})


def _text_feature():
  return seqio.Feature(vocabulary=tasks.get_vocabulary(), add_eos=True, required=True)


STANDARD = [seqio.preprocessors.tokenize, seqio.preprocessors.append_eos_after_trim]


@pytest.fixture(scope="module")
def textline_task(trec_pairs, tmp_path_factory):
  """A user's Task: TextLineDataSource over a TSV, custom parse + rekey + lowercase preprocessors."""
  path = tmp_path_factory.mktemp("tsv") / "pairs.tsv"
  path.write_text("".join(f"{q}\t{a}\n" for q, a in trec_pairs), encoding="utf-8")
  name = "test_textline_lowercase"
  seqio.TaskRegistry.remove(name)
  seqio.TaskRegistry.add(
      name, source=seqio.TextLineDataSource({"train": str(path)}),
      preprocessors=[_parse_tsv, functools.partial(seqio.preprocessors.rekey,
                                                   key_map={"inputs": "question", "targets": "answer"}),
                     _lowercase, *STANDARD],
      output_features={"inputs": _text_feature(), "targets": _text_feature()}, shuffle_buffer_size=1000)
  return name


def test_textline_task_with_custom_preprocessors_trains(textline_task, trec_pairs, tokenizer):
  lengths = {"inputs": 32, "targets": 48}
  it = make_local_iterator(task=textline_task, feature_lengths=lengths, batch_size=29, seed=2)
  epoch = _take(it, 12)  # 348 pairs = 12 batches of 29
  assert it.stats["tasks"][textline_task]["path"] == "seqio"
  # Every row is a lower-cased pair of the file, tokenised, truncated with EOS kept, padded: the whole epoch.
  want = collections.Counter((tuple(tokenizer.encode([q.lower()], max_length=32)[0]),
                              tuple(tokenizer.encode([a.lower()], max_length=48)[0])) for q, a in trec_pairs)
  got = collections.Counter(zip(_rows(epoch, "left_encoder_input_tokens"), _rows(epoch, "right_encoder_input_tokens")))
  assert got == want and sum(got.values()) == len(trec_pairs) == 348
  assert epoch[0]["right_encoder_input_tokens"].shape == (29, 48)
  # Epoch 2 is the same multiset, reshuffled.
  second = _take(it, 12)
  assert collections.Counter(_rows(second, "left_encoder_input_tokens")) == collections.Counter(
      _rows(epoch, "left_encoder_input_tokens"))
  assert _rows(second, "left_encoder_input_tokens") != _rows(epoch, "left_encoder_input_tokens")


def test_seqio_path_is_deterministic_and_resumes_exactly(textline_task):
  kw = dict(task=textline_task, feature_lengths={"inputs": 16, "targets": 16}, batch_size=16, seed=7)
  it = make_local_iterator(**kw)
  _take(it, 18)
  state = json.loads(json.dumps(it.get_state()))
  ref = _take(it, 8)  # crosses into epoch 2 (348 pairs = 21.75 batches)
  assert state["cursors"] == {"0": {textline_task: [0, 288]}} and state["streams"] == {textline_task: "seqio"}
  assert it.stats["tasks"][textline_task]["epoch"] == 1 and it.stats["tasks"][textline_task]["epoch_offset"] == 68
  _same(_take(make_local_iterator(**kw), 26)[18:], ref)
  resumed = make_local_iterator(**kw)
  resumed.set_state(state)
  _same(_take(resumed, 8), ref)
  # A state without this reader's cursor (saved by another reader) is located by counting the shard.
  del state["cursors"]["0"]
  resumed = make_local_iterator(**kw)
  resumed.set_state(state)
  _same(_take(resumed, 8), ref)
  other = _take(make_local_iterator(**{**kw, "seed": 8}), 1)
  assert not np.array_equal(other[0]["left_encoder_input_tokens"], ref[0]["left_encoder_input_tokens"])


def test_seqio_readers_partition_the_data(textline_task, trec_pairs, tokenizer):
  kw = dict(task=textline_task, feature_lengths={"inputs": 64, "targets": 64}, batch_size=29, num_readers=2,
            repeat=False, shuffle=False)
  shards = [_rows(list(make_local_iterator(reader_id=r, **kw)), "left_encoder_input_tokens") for r in (0, 1)]
  # One file, two readers: seqio shards the examples, reader r gets lines r, r+2, ... (174 each = 6 x 29).
  lines = [tuple(t) for t in tokenizer.encode([q.lower() for q, _ in trec_pairs], max_length=64)]
  assert shards[0] == lines[0::2] and shards[1] == lines[1::2]


def test_numpy_and_seqio_paths_give_the_same_tokens(data_dir):
  # Unshuffled, both paths read the rows in source order: the batches must be identical.
  kw = dict(task=tasks.STAGE2_SNLI_TRIPLES, feature_lengths={"inputs": 24, "targets": 20}, batch_size=64,
            shuffle=False)
  _same(_take(make_local_iterator(numpy_path=True, **kw), 5), _take(make_local_iterator(numpy_path=False, **kw), 5))
  mixed = make_local_iterator(numpy_path=False, task=tasks.STAGE2_SNLI_TRIPLES,
                              feature_lengths={"inputs": 24, "targets": 20}, batch_size=8)
  numpy_state = make_local_iterator(task=tasks.STAGE2_SNLI_TRIPLES, feature_lengths={"inputs": 24, "targets": 20},
                                    batch_size=8).get_state()
  with pytest.raises(DataConfigError, match="streams: saved .*numpy.*now .*seqio"):
    mixed.set_state(numpy_state)


SENTENCES = ["A man is playing a guitar.", "Two dogs run on the beach.", "The cat sleeps.", "It rains in Paris.",
             "A child reads a book.", "Birds fly south in winter.", "She bought bread.", "The train is late."]
NLI = [("A man sings.", "A person sings.", 1), ("A dog runs.", "A cat sleeps.", 0), ("Kids play.", "Children play.", 1),
       ("It is sunny.", "It is raining.", 0), ("A woman cooks.", "Someone cooks.", 1), ("A car drives.", "A car.", 2)]


@pytest.fixture(scope="module")
def generic_tasks():
  def sentences(split, shuffle_files, seed=None):
    del split, shuffle_files, seed
    return tf.data.Dataset.from_tensor_slices({"inputs": SENTENCES})

  def pairs(split, shuffle_files, seed=None):
    del split, shuffle_files, seed
    p, h, lab = zip(*NLI)
    return tf.data.Dataset.from_tensor_slices({"inputs": list(p), "targets": list(h),
                                               "label": tf.constant(lab, tf.int32)})

  for name in ("test_single_sentences", "test_nli_labels"):
    seqio.TaskRegistry.remove(name)
  seqio.TaskRegistry.add("test_single_sentences", source=seqio.FunctionDataSource(sentences, splits=["train"]),
                         preprocessors=STANDARD, output_features={"inputs": _text_feature()})
  seqio.TaskRegistry.add("test_nli_labels", source=seqio.FunctionDataSource(pairs, splits=["train"]),
                         preprocessors=STANDARD,
                         output_features={"inputs": _text_feature(), "targets": _text_feature(),
                                          "label": seqio.ContinuousFeature(dtype=tf.int32, rank=0)})
  return "test_single_sentences", "test_nli_labels"


def test_single_sentence_task_batches_only_its_feature(generic_tasks, tokenizer):
  # TASK_FEATURE_LENGTHS shared with pair tasks: lengths of features the task lacks are ignored.
  it = make_local_iterator(task=generic_tasks[0], feature_lengths={"inputs": 12, "targets": 12}, batch_size=4,
                           repeat=False, shuffle=False)
  batches = list(it)
  assert [set(b) for b in batches] == [{"left_encoder_input_tokens"}] * 2
  assert batches[0]["left_encoder_input_tokens"].shape == (4, 12)
  assert _rows(batches, "left_encoder_input_tokens") == [tuple(t) for t in tokenizer.encode(SENTENCES, max_length=12)]


def test_int_label_feature_is_passed_through(generic_tasks, tokenizer):
  lengths = {"inputs": 10, "targets": 10}
  it = make_local_iterator(task=generic_tasks[1], feature_lengths=lengths, batch_size=3, seed=4,
                           model_feature_names={"label": "labels"})
  batch = next(it)
  assert set(batch) == {"left_encoder_input_tokens", "right_encoder_input_tokens", "labels"}
  assert batch["labels"].shape == (3,) and batch["labels"].dtype == np.int32
  by_premise = {tuple(tokenizer.encode([p], max_length=10)[0]): lab for p, _, lab in NLI}
  for row, label in zip(batch["left_encoder_input_tokens"], batch["labels"]):
    assert by_premise[tuple(row[row != 0].tolist())] == label  # each label stays with its own row
  # The same converter serves t5x-style seqio.get_dataset.
  converter = feature_converters.DualEncoderFeatureConverter.for_task(generic_tasks[1], lengths)
  assert converter.task_feature_lengths == {"inputs": 10, "label": None, "targets": 10}
  ds = seqio.get_dataset(generic_tasks[1], task_feature_lengths=converter.task_feature_lengths,
                         feature_converter=converter, shuffle=False)
  first = next(ds.as_numpy_iterator())
  # The task's `label` is the model's LABELS feature (st5_jax.features), on both paths.
  assert first["labels"] == NLI[0][2] and first["left_encoder_input_tokens"].shape == (10,)


def test_scalar_features_on_the_mesh(generic_tasks):
  mesh = jax.make_mesh((4, 2), ("data", "model"))
  it = make_train_iterator(task=generic_tasks[1], feature_lengths={"inputs": 8, "targets": 8}, global_batch_size=4,
                           mesh=mesh)
  batch = next(it)
  assert batch["labels"].shape == (4,) and batch["labels"].sharding.spec == jax.sharding.PartitionSpec(("data",))
  assert batch["left_encoder_input_tokens"].sharding.spec == jax.sharding.PartitionSpec(("data",), None)
  assert it.element_spec == {"left_encoder_input_tokens": (4, 8), "labels": (4,), "right_encoder_input_tokens": (4, 8)}


def test_mixture_of_numpy_and_seqio_tasks(textline_task, data_dir):
  name = "test_mixed_paths"
  seqio.MixtureRegistry.remove(name)
  seqio.MixtureRegistry.add(name, [(tasks.TRECQA, 3.0), (textline_task, 1.0)])
  kw = dict(task=name, feature_lengths={"inputs": 16, "targets": 16}, batch_size=32, seed=1)
  it = make_local_iterator(**kw)
  _take(it, 5)
  state = it.get_state()
  ref = _take(it, 5)
  assert it.get_state()["streams"] == {tasks.TRECQA: "numpy", textline_task: "seqio"}
  consumed = {t: s["examples_consumed"] for t, s in it.stats["tasks"].items()}
  assert consumed == {tasks.TRECQA: 240, textline_task: 80}  # 10 batches x 32 at rates 3:1
  resumed = make_local_iterator(**kw)
  resumed.set_state(state)
  _same(_take(resumed, 5), ref)


def test_missing_length_and_mismatched_mixture_are_errors(generic_tasks):
  with pytest.raises(DataConfigError, match="token feature 'targets' but feature_lengths"):
    make_local_iterator(task=generic_tasks[1], feature_lengths={"inputs": 8}, batch_size=2)
  # seqio checks that a mixture's tasks have the same feature names; the batch also needs the same kinds.
  float_labels = "test_nli_float_labels"
  seqio.TaskRegistry.remove(float_labels)
  source = seqio.get_mixture_or_task(generic_tasks[1]).source
  seqio.TaskRegistry.add(float_labels, source=source, preprocessors=STANDARD + [
      seqio.map_over_dataset(lambda ex: {**ex, "label": tf.cast(ex["label"], tf.float32)})],
                         output_features={"inputs": _text_feature(), "targets": _text_feature(),
                                          "label": seqio.ContinuousFeature(dtype=tf.float32, rank=0)})
  name = "test_bad_mixture"
  seqio.MixtureRegistry.remove(name)
  seqio.MixtureRegistry.add(name, [(generic_tasks[1], 1.0), (float_labels, 1.0)])
  with pytest.raises(DataConfigError, match="must yield the same batch features"):
    make_local_iterator(task=name, feature_lengths={"inputs": 8, "targets": 8}, batch_size=2)


def test_negative_targets_take_the_targets_length_by_default(data_dir):
  # TASK_FEATURE_LENGTHS without a negative_targets length: hard negatives are answers, so
  # they are cut like the targets (t5x_retrieval's convention), not like the inputs.
  for numpy_path in (True, False):
    batch = next(make_local_iterator(task=tasks.STAGE2_SNLI_TRIPLES, feature_lengths={"inputs": 24, "targets": 20},
                                     batch_size=8, shuffle=False, numpy_path=numpy_path))
    assert batch[features.LEFT].shape == (8, 24) and batch[features.RIGHT].shape == (8, 20)
    assert batch[features.RIGHT_NEG].shape == (8, 20), numpy_path
