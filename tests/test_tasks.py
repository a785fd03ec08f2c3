"""The `tasks` package: registration, vocabulary, seqio compatibility, users' files."""

import json

import numpy as np
import pytest
import raw_counts
import seqio

from st5_jax import paths
from st5_jax.data import feature_converters, registry, tasks, vocabulary
from st5_jax.data.iterator import make_local_iterator


@pytest.fixture(autouse=True)
def _raw_public_tasks(monkeypatch):
  # These tests check the pipeline on the public tasks as built from the raw files (their counts
  # are DATA.md's); decontamination against the evaluation sets is tested in test_data_overlap.py.
  monkeypatch.setenv("ST5_DATA_DECONTAMINATE", "0")


def test_tasks_register_on_import():
  names = set(seqio.TaskRegistry.names())
  for name in tasks.ALL_TASKS:
    assert name in names
  mixture = seqio.get_mixture_or_task(tasks.STAGE1_PUBLIC_QA_MIXTURE)
  assert sorted(t.name for t in mixture.tasks) == sorted(tasks.STAGE1_PUBLIC_TASKS)
  qa = seqio.get_mixture_or_task(tasks.TRECQA)
  nli = seqio.get_mixture_or_task(tasks.STAGE2_SNLI_TRIPLES)
  assert set(qa.output_features) == {"inputs", "targets"}
  assert set(nli.output_features) == {"inputs", "targets", "negative_targets"}
  assert nli.splits == ("train", "validation", "all")
  assert all(f.add_eos for f in nli.output_features.values())


def test_vocabulary_is_t5_with_100_extra_ids(vocab_path):
  vocab = tasks.get_vocabulary()
  assert isinstance(vocab, seqio.SentencePieceVocabulary)
  assert vocab.extra_ids == 100 and vocab.vocab_size == 32100
  assert vocab.encode("Hello world") == [8774, 296]
  assert vocab.eos_id == 1 and vocab.pad_id == 0


def test_missing_vocabulary_is_a_clear_error(tmp_path, monkeypatch):
  monkeypatch.setenv("ST5_VOCAB", str(tmp_path / "nope.model"))
  monkeypatch.setenv("ST5_DATA_DIR", str(tmp_path))
  with pytest.raises(paths.MissingFileError, match="ST5_VOCAB"):
    vocabulary.T5Vocabulary().encode("x")


def test_missing_data_dir_is_a_clear_error(monkeypatch):
  monkeypatch.delenv("ST5_DATA_DIR")
  with pytest.raises(paths.MissingFileError, match="ST5_DATA_DIR"):
    make_local_iterator(task=tasks.TRECQA, feature_lengths={"inputs": 8, "targets": 8}, batch_size=2)


def _seqio_rows(task_name, lengths, n, split="train"):
  task = seqio.get_mixture_or_task(task_name)
  negatives = "negative_targets" in task.output_features
  lengths = feature_converters.complete_feature_lengths(lengths, negatives=negatives)
  ds = seqio.get_dataset(task_name, task_feature_lengths=lengths, dataset_split=split, shuffle=False,
                         feature_converter=feature_converters.DualEncoderFeatureConverter(negatives=negatives))
  return [ex for _, ex in zip(range(n), ds.as_numpy_iterator())]


@pytest.mark.parametrize("task_name,lengths", [
    (tasks.QATAR_LIVING_GOOD, {"inputs": 24, "targets": 64}),
    (tasks.STAGE2_SNLI_TRIPLES, {"inputs": 32, "targets": 16}),
])
def test_training_pipeline_equals_seqio_get_dataset(task_name, lengths):
  # t5x users get the same tokens through seqio.get_dataset + the feature converter.
  expected = _seqio_rows(task_name, lengths, 96)
  it = make_local_iterator(task=task_name, feature_lengths=lengths, batch_size=96, shuffle=False)
  batch = next(it)
  for key in batch:
    np.testing.assert_array_equal(batch[key], np.stack([e[key] for e in expected]))


def test_seqio_sharding_uses_shard_info():
  task = seqio.get_mixture_or_task(tasks.TRECQA)
  shards = [list(task.source.get_dataset("train", shuffle=False, shard_info=seqio.ShardInfo(i, 2))
                 .as_numpy_iterator()) for i in (0, 1)]
  # TREC-QA train + dev: 569 distinct positive pairs (853 when test was read too); shard 0 takes the odd one.
  assert len(shards[0]) + len(shards[1]) == 569 and len(shards[0]) == 285


@pytest.fixture(scope="module")
def prepared_dir(data_dir, tmp_path_factory):
  from st5_jax.data.offline import prepare  # pylint: disable=g-import-not-at-top
  out = tmp_path_factory.mktemp("prepared")
  report = prepare.prepare(out_dir=str(out), source_dir=str(data_dir), datasets=["wikiqa", "snli_triples_derived"],
                           progress=False, offline=True)
  assert report.ok, report.summary()
  return out


def test_prepared_files_equal_in_memory_build(prepared_dir, data_dir, monkeypatch):
  for name in (tasks.WIKIQA, tasks.STAGE2_SNLI_TRIPLES):
    source = seqio.get_mixture_or_task(name).source
    for split in source.splits:
      # `prepare` decontaminates against the evaluation sets in its folder: here only WikiQA test (the WikiQA
      # retrieval set), so the in-memory build it must equal is the one on that folder, decontaminated.
      built = source.build(split, data_dir=str(prepared_dir), decontaminate=True)
      memory = [{f: ex[f] for f in source.features} for ex in built.examples]
      removed = {k: v for k, v in built.stats.filtered_by_reason.items() if k.startswith("text in evaluation set")}
      assert len(source.examples(split)) - len(memory) == sum(removed.values())
      assert set(removed) == ({"text in evaluation set WikiQA"} if name == tasks.WIKIQA else set())
      monkeypatch.setenv("ST5_DATA_DIR", str(prepared_dir))
      assert source.open(split).description.endswith(f"prepared/{name}/{split}.jsonl")
      prepared = list(source.iter_examples(split))
      monkeypatch.setenv("ST5_DATA_DIR", str(data_dir))
      assert prepared == memory
  # And the iterator reads them, with the build counts from the manifest.
  monkeypatch.setenv("ST5_DATA_DIR", str(prepared_dir))
  it = make_local_iterator(task=tasks.WIKIQA, feature_lengths={"inputs": 16, "targets": 16}, batch_size=4)
  next(it)
  # WikiQA train only (26,525 with test).
  assert it.stats["tasks"][tasks.WIKIQA]["build"]["rows_read"] == 20360 == raw_counts.wikiqa(data_dir)["rows"]


def test_register_user_task_jsonl_glob(tmp_path):
  for i in range(3):
    with open(tmp_path / f"part-{i}.jsonl", "w") as f:
      for j in range(5):
        f.write(json.dumps({"q": f"question {i} {j}", "a": f"answer {i} {j}"}) + "\n")
  registry.register_user_task("test_user_jsonl", file_pattern=str(tmp_path / "part-*.jsonl"),
                              columns={"inputs": "q", "targets": "a"})
  it = make_local_iterator(task="test_user_jsonl", feature_lengths={"inputs": 8, "targets": 8},
                                    batch_size=5, repeat=False)
  assert len(list(it)) == 3
  vocab = tasks.get_vocabulary()
  # File-level sharding over 2 readers: reader 0 owns parts 0 and 2.
  rows = list(seqio.get_mixture_or_task("test_user_jsonl").source.iter_examples("train", shard_index=0,
                                                                                   num_shards=2))
  assert sorted({r["inputs"].split()[1] for r in rows}) == ["0", "2"]
  assert vocab.decode(vocab.encode(rows[0]["targets"])) == rows[0]["targets"]


def test_user_task_from_tfrecords(tmp_path):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  path = str(tmp_path / "triples.tfrecord")
  with tf.io.TFRecordWriter(path) as w:
    for i in range(6):
      ex = tf.train.Example(features=tf.train.Features(feature={
          k: tf.train.Feature(bytes_list=tf.train.BytesList(value=[f"{k} {i}".encode()]))
          for k in ("premise", "pos", "neg")}))
      w.write(ex.SerializeToString())
  registry.register_user_task("test_user_tfrecord", file_pattern=path,
                              columns={"inputs": "premise", "targets": "pos", "negative_targets": "neg"})
  it = make_local_iterator(task="test_user_tfrecord", feature_lengths={"inputs": 8, "targets": 8},
                                    batch_size=3, shuffle=False)
  batch = next(it)
  vocab = tasks.get_vocabulary()
  row = batch["right_negative_encoder_input_tokens"][0]
  assert vocab.decode(row[row != 0].tolist()) == "neg 0"


def test_gin_and_env_configured_user_tasks(tmp_path, monkeypatch):
  import gin  # pylint: disable=g-import-not-at-top
  path = tmp_path / "qa.tsv"
  path.write_text("q\tlabel\ta\nwhat is up\t1\tthe sky\nwho\t0\tnobody\nwhere\t1\there\n")
  gin.clear_config()
  gin.parse_config(f"""
    st5_jax.data.user_qa_pairs.file_pattern = "{path}"
    st5_jax.data.user_qa_pairs.columns = {{"inputs": "q", "targets": "a"}}
    st5_jax.data.user_qa_pairs.label_column = "label"
    st5_jax.data.user_qa_pairs.keep_labels = ["1"]
  """)
  try:
    rows = list(seqio.get_mixture_or_task(tasks.USER_QA_PAIRS).source.iter_examples("train"))
    assert rows == [{"inputs": "what is up", "targets": "the sky"}, {"inputs": "where", "targets": "here"}]
  finally:
    gin.clear_config()
  with pytest.raises(ValueError, match="ST5_USER_NLI_TRIPLES"):
    seqio.get_mixture_or_task(tasks.USER_NLI_TRIPLES).source.open("train")
  triples = tmp_path / "t.csv"
  triples.write_text("sent0,sent1,hard_neg\na,b,c\n")
  monkeypatch.setenv("ST5_USER_NLI_TRIPLES", f"train={triples}")
  assert list(seqio.get_mixture_or_task(tasks.USER_NLI_TRIPLES).source.iter_examples("train")) == [
      {"inputs": "a", "targets": "b", "negative_targets": "c"}]


def test_parse_split_patterns_and_columns():
  assert registry.parse_split_patterns("gs://b/x=1/*.tsv") == {"train": "gs://b/x=1/*.tsv"}
  assert registry.parse_split_patterns("train=gs://b/t*.tsv;validation=/d/v.tsv") == {
      "train": "gs://b/t*.tsv", "validation": "/d/v.tsv"}
  assert registry.parse_columns("inputs=0,targets=question") == {"inputs": 0, "targets": "question"}


def test_users_files_on_gcs_read_like_local_ones(data_dir, tmp_path, gcs):
  """A users' task over gs:// (the emulator) yields exactly what the same files give locally."""
  for name in ("train.csv", "dev.csv"):
    (tmp_path / name).write_bytes((data_dir / "qa_pairs" / "trecqa_wang" / name).read_bytes())
  remote = gcs.upload(tmp_path, "users", "trecqa")
  kw = dict(columns={"inputs": "qtext", "targets": "atext"}, label_column="label", label_values=("0", "1"),
            keep_labels=("1",))
  registry.register_user_task("test_local_csv", file_pattern=f"{tmp_path}/*.csv", **kw)
  registry.register_user_task("test_remote_csv", file_pattern=f"{remote}/*.csv", **kw)
  source = seqio.get_mixture_or_task("test_remote_csv").source
  assert source.open("train").files == [f"{remote}/dev.csv", f"{remote}/train.csv"]
  local = list(seqio.get_mixture_or_task("test_local_csv").source.iter_examples("train"))
  assert list(source.iter_examples("train")) == local
  # Independent count: rows labelled 1 in the raw CSVs.
  import csv  # pylint: disable=g-import-not-at-top
  expected = sum(row["label"] == "1" for name in ("train.csv", "dev.csv")
                 for row in csv.DictReader(open(tmp_path / name, encoding="utf-8", newline="")))
  assert len(local) == expected > 0
