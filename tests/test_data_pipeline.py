"""From tasks to batches: determinism, resume, sharding over hosts and the mesh, dedup."""

import collections
import csv
import itertools
import json
import os

import gin
import jax
import numpy as np
import pytest
import raw_counts

import seqio
import sentencepiece as spm

from st5_jax import batch_geometry as geometry
from st5_jax import vocab
from st5_jax.batch_geometry import DataConfigError
from st5_jax.data import builders, convert, dedup, mixing, tasks
from st5_jax.data.iterator import make_local_iterator, make_train_iterator


@pytest.fixture(autouse=True)
def _raw_public_tasks(monkeypatch):
  # These tests check the pipeline on the public tasks as built from the raw files (their counts
  # are DATA.md's); decontamination against the evaluation sets is tested in test_data_overlap.py.
  monkeypatch.setenv("ST5_DATA_DECONTAMINATE", "0")


QA_LENGTHS = {"inputs": 48, "targets": 48}
NLI_LENGTHS = {"inputs": 40, "targets": 40}


def _take(it, n):
  return [{k: np.asarray(v) for k, v in next(it).items()} for _ in range(n)]


def _assert_same(batches_a, batches_b):
  assert len(batches_a) == len(batches_b)
  for a, b in zip(batches_a, batches_b):
    assert a.keys() == b.keys()
    for k in a:
      np.testing.assert_array_equal(a[k], b[k])


def _rows(batches, key):
  return [tuple(r[r != 0].tolist()) for b in batches for r in b[key]]


@pytest.fixture(scope="module")
def tokenizer(vocab_path):
  return vocab.Tokenizer(vocab_path)


def test_same_seed_same_batches_other_seed_differs(data_dir):
  kw = dict(task=tasks.STAGE2_SNLI_TRIPLES, feature_lengths=NLI_LENGTHS, batch_size=16)
  a = _take(make_local_iterator(seed=3, **kw), 3)
  b = _take(make_local_iterator(seed=3, **kw), 3)
  c = _take(make_local_iterator(seed=4, **kw), 3)
  _assert_same(a, b)
  assert not np.array_equal(a[0]["left_encoder_input_tokens"], c[0]["left_encoder_input_tokens"])
  assert set(a[0]) == {"left_encoder_input_tokens", "right_encoder_input_tokens",
                       "right_negative_encoder_input_tokens"}
  assert all(v.dtype == np.int32 and v.shape == (16, 40) for v in a[0].values())


def test_resume_mid_epoch_and_across_epochs_is_exact(data_dir):
  # TREC-QA has 569 pairs (train + dev): at batch 64 an epoch is 8.9 batches, so step 3 is in epoch 0 and
  # steps 20-24 (1,280-1,536 examples) in epoch 2.
  kw = dict(task=tasks.TRECQA, feature_lengths=QA_LENGTHS, batch_size=64, seed=7)
  it = make_local_iterator(**kw)
  _take(it, 3)
  state_3 = json.loads(json.dumps(it.get_state()))
  ref_4_to_20 = _take(it, 17)
  state_20 = json.loads(json.dumps(it.get_state()))
  ref_21_to_24 = _take(it, 4)
  assert state_20["step"] == 20 and state_20["positions"][tasks.TRECQA] == 20 * 64

  resumed = make_local_iterator(**kw)
  resumed.set_state(state_3)
  _assert_same(_take(resumed, 17), ref_4_to_20)

  # A reader restoring a state without its epoch-size hint (e.g. saved by another
  # process) counts its shard and lands on the same batches.
  state_20["epoch_sizes"] = {}
  resumed = make_local_iterator(**kw)
  resumed.set_state(state_20)
  _assert_same(_take(resumed, 4), ref_21_to_24)
  assert resumed.stats["tasks"][tasks.TRECQA]["epoch"] == 2


def test_epochs_are_reshuffled_permutations(data_dir):
  assert raw_counts.qatar_living(data_dir)["perfect_match"] == 234 == 9 * 26
  it = make_local_iterator(task=tasks.QATAR_LIVING_PERFECT_MATCH, feature_lengths=QA_LENGTHS,
                                    batch_size=26, seed=1)  # 234 pairs = 9 batches per epoch
  epoch0 = _rows(_take(it, 9), "left_encoder_input_tokens")
  epoch1 = _rows(_take(it, 9), "left_encoder_input_tokens")
  assert collections.Counter(epoch0) == collections.Counter(epoch1)
  assert epoch0 != epoch1


def test_mixture_resume_and_proportions(data_dir):
  kw = dict(task=tasks.STAGE1_PUBLIC_QA_MIXTURE, feature_lengths=QA_LENGTHS, batch_size=32, seed=0)
  it = make_local_iterator(**kw)
  _take(it, 5)
  state = it.get_state()
  ref = _take(it, 5)
  resumed = make_local_iterator(**kw)
  resumed.set_state(state)
  _assert_same(_take(resumed, 5), ref)
  # Rates are proportional to task sizes: positions track size shares within one example.
  sizes = {t: it.stats["tasks"][t]["examples_consumed"] for t in tasks.STAGE1_PUBLIC_TASKS}
  total = sum(sizes.values())
  assert total == 10 * 32
  # Task sizes from the raw files (tests/raw_counts.py); Qatar Living Good's 3033 is bounded there
  # and checked against the builder in test_data_builders.py::test_qatar_living_counts.
  n = {tasks.QATAR_LIVING_GOOD: 3033,
       tasks.QATAR_LIVING_PERFECT_MATCH: raw_counts.qatar_living(data_dir)["perfect_match"],
       tasks.TRECQA: raw_counts.trecqa(data_dir)["distinct_positives"],
       tasks.WIKIQA: raw_counts.wikiqa(data_dir)["distinct_positives"]}
  for t, consumed in sizes.items():
    assert abs(consumed - total * n[t] / sum(n.values())) <= 1.0, (t, consumed)


def test_state_mismatch_is_an_error(data_dir):
  it = make_local_iterator(task=tasks.TRECQA, feature_lengths=QA_LENGTHS, batch_size=8)
  next(it)
  state = it.get_state()
  other = make_local_iterator(task=tasks.TRECQA, feature_lengths=QA_LENGTHS, batch_size=8, seed=1)
  with pytest.raises(DataConfigError, match="seed: saved 0, now 1"):
    other.set_state(state)


def test_two_hosts_partition_the_split(data_dir, tokenizer):
  kw = dict(task=tasks.STAGE2_SNLI_TRIPLES, feature_lengths={"inputs": 128, "targets": 128}, batch_size=61,
            num_readers=2, repeat=False)
  seen = []
  for reader in (0, 1):
    it = make_local_iterator(reader_id=reader, **kw)
    batches = list(it)
    # 3172 triples: 1586 per reader = 26 batches of 61, nothing dropped.
    assert len(batches) == 26
    seen.append(collections.Counter(zip(_rows(batches, "left_encoder_input_tokens"),
                                        _rows(batches, "right_encoder_input_tokens"),
                                        _rows(batches, "right_negative_encoder_input_tokens"))))
  # Multiset equality: every row once, none twice (the split itself repeats one triple).
  with open(data_dir / "nli" / "snli_devtest_triples_derived.csv", newline="", encoding="utf-8") as f:
    rows = [r for r in csv.DictReader(f) if r["split"] == "dev"]
  expected = collections.Counter(
      tuple(tuple(tokenizer.encode([r[c]], max_length=128)[0]) for c in ("sent0", "sent1", "hard_neg"))
      for r in rows)
  assert seen[0] + seen[1] == expected
  assert sum(seen[0].values()) + sum(seen[1].values()) == len(rows) == 3172
  assert len(rows) == raw_counts.snli_senteval(data_dir, "dev")["per_entailment"]  # from the raw SNLI pairs
  # By row identity (provenance), the two readers' shards are disjoint and complete.
  source = seqio.get_mixture_or_task(tasks.STAGE2_SNLI_TRIPLES).source
  shard_rows = [list(source.iter_examples("train", shard_index=i, num_shards=2)) for i in (0, 1)]
  assert len(shard_rows[0]) == len(shard_rows[1]) == 1586


def test_global_arrays_on_the_mesh(data_dir):
  mesh = jax.make_mesh((8,), ("data",))
  it = make_train_iterator(task=tasks.STAGE2_SNLI_TRIPLES, feature_lengths={"inputs": 32, "targets": 24},
                                    global_batch_size=16, mesh=mesh)
  batch = next(it)
  assert set(batch) == {"left_encoder_input_tokens", "right_encoder_input_tokens",
                        "right_negative_encoder_input_tokens"}
  left = batch["left_encoder_input_tokens"]
  assert isinstance(left, jax.Array) and left.shape == (16, 32) and left.dtype == np.int32
  assert batch["right_negative_encoder_input_tokens"].shape == (16, 24)  # defaults to the targets length
  assert left.sharding.spec == jax.sharding.PartitionSpec(("data",), None)
  assert {s.data.shape for s in left.addressable_shards} == {(2, 32)}
  # The global array holds exactly what the single reader produced.
  local = make_local_iterator(task=tasks.STAGE2_SNLI_TRIPLES, feature_lengths={"inputs": 32, "targets": 24},
                                       batch_size=16)
  np.testing.assert_array_equal(np.asarray(left), next(local)["left_encoder_input_tokens"])


def test_batch_over_two_data_axes_replicated_over_model(data_dir):
  mesh = jax.make_mesh((2, 2, 2), ("data", "fsdp", "model"))
  it = make_train_iterator(task=tasks.TRECQA, feature_lengths=QA_LENGTHS, global_batch_size=8,
                                    mesh=mesh, data_axes=("data", "fsdp"))
  left = next(it)["left_encoder_input_tokens"]
  assert left.sharding.spec == jax.sharding.PartitionSpec(("data", "fsdp"), None)
  shards = {s.device: s.data.shape for s in left.addressable_shards}
  assert set(shards.values()) == {(2, 48)} and len(shards) == 8  # 4 batch shards, each on 2 model devices


def test_indivisible_batch_fails_before_any_data_work():
  mesh = jax.make_mesh((8,), ("data",))
  with pytest.raises(DataConfigError, match=r"global_batch_size=12 is not divisible by the number of data shards 8"):
    make_train_iterator(task="no_such_task_checked_later", feature_lengths=QA_LENGTHS,
                                 global_batch_size=12, mesh=mesh)
  with pytest.raises(DataConfigError, match="not divisible by the number of processes 3"):
    geometry.check_global_batch_size(16, mesh=jax.make_mesh((2,), ("data",), devices=jax.devices()[:2]),
                                     data_axes=("data",), process_count=3)
  with pytest.raises(DataConfigError, match="mesh lacks"):
    geometry.check_global_batch_size(16, mesh=mesh, data_axes=("batch",))


def test_batch_size_check_counts_every_data_axis():
  # data x fsdp = 2 x 2 = 4 batch shards (model replicates the batch): 6 rows cannot split 4 ways, 12 can.
  mesh = jax.make_mesh((2, 2, 2), ("data", "fsdp", "model"))
  with pytest.raises(DataConfigError, match="not divisible by the number of data shards 4"):
    geometry.check_global_batch_size(6, mesh=mesh, data_axes=("data", "fsdp"), process_count=1)
  geometry.check_global_batch_size(12, mesh=mesh, data_axes=("data", "fsdp"), process_count=1)


def test_unknown_task_lists_known_ones():
  mesh = jax.make_mesh((8,), ("data",))
  with pytest.raises(DataConfigError, match="st5_stage1_public_qa"):
    make_train_iterator(task="st5_nope", feature_lengths=QA_LENGTHS, global_batch_size=8, mesh=mesh)


def test_dedup_removes_duplicates_and_resumes_exactly(data_dir):
  # Each SNLI premise has ~1-2 triples: without dedup, batches of 64 of the 3172
  # triples regularly hold the same premise twice.
  kw = dict(task=tasks.STAGE2_SNLI_TRIPLES, feature_lengths=NLI_LENGTHS, batch_size=64, seed=5)
  plain = _take(make_local_iterator(**kw), 12)
  dups = sum(64 - len(set(map(bytes, b["left_encoder_input_tokens"]))) for b in plain)
  assert dups > 0
  it = make_local_iterator(dedup=True, **kw)
  batches = _take(it, 6)
  state = it.get_state()  # step 6 is inside the second window of 4 batches
  assert state["block_start_step"] == 4
  rest = _take(it, 6)
  for b in batches + rest:
    assert len(set(map(bytes, b["left_encoder_input_tokens"]))) == 64
    right = list(map(bytes, b["right_encoder_input_tokens"])) + list(map(bytes, b["right_negative_encoder_input_tokens"]))
    assert len(set(right)) == len(right)
  # Same examples overall, only rearranged within windows.
  assert collections.Counter(_rows(plain[:12], "left_encoder_input_tokens")) == collections.Counter(
      _rows(batches + rest, "left_encoder_input_tokens"))
  assert it.stats["dedup_moved"] > 0 and it.stats["dedup_unresolved"] == 0
  resumed = make_local_iterator(dedup=True, **kw)
  resumed.set_state(state)
  _assert_same(_take(resumed, 6), rest)


def test_dedup_assign_reports_unresolvable_duplicates():
  left = np.array([[5, 1], [5, 1], [5, 1], [6, 1]], np.int32)
  right = np.array([[7, 1], [8, 1], [9, 1], [7, 1]], np.int32)
  batches, moved, unresolved = dedup.dedup_assign(left, [right], batch_size=2, num_batches=2)
  assert sorted(len(b) for b in batches) == [2, 2]
  assert unresolved == 1 and moved >= 1


def test_dedup_assign_swaps_a_row_into_a_full_batch():
  # Rows (left text, right text): (A,p) (C,q) fill batch 0; (B,r) opens batch 1; (B,s) clashes with batch 1
  # and batch 0 is full. Swapping (A,p) out to batch 1 and (B,s) into batch 0 resolves it: two rows moved.
  A, B, C = [5, 1], [7, 1], [6, 1]
  left = np.array([A, C, B, B], np.int32)
  right = np.array([[10, 1], [11, 1], [12, 1], [13, 1]], np.int32)
  batches, moved, unresolved = dedup.dedup_assign(left, [right], batch_size=2, num_batches=2)
  assert unresolved == 0 and moved == 2
  assert [sorted(b.tolist()) for b in batches] == [[1, 3], [0, 2]]


def test_schedule_is_proportional_and_position_based():
  rates = np.array([3.0, 1.0])
  ids = mixing.schedule(np.zeros(2, np.int64), rates, 8)
  assert ids.tolist() == [0, 0, 1, 0, 0, 0, 1, 0]
  # Continuing from positions gives the same continuation as one long schedule.
  long = mixing.schedule(np.zeros(2, np.int64), rates, 20)
  head = long[:7]
  pos = np.bincount(head, minlength=2)
  np.testing.assert_array_equal(mixing.schedule(pos, rates, 13), long[7:])
  assert mixing.schedule(np.array([2, 0]), rates, 5, limits=np.array([2, 3])).tolist() == [1, 1, 1]


def test_decoded_tokens_are_the_source_text(data_dir, tokenizer):
  it = make_local_iterator(task=tasks.TRECQA, feature_lengths={"inputs": 128, "targets": 128},
                                    batch_size=4, shuffle=False)
  batch = next(it)
  source = tasks.get_vocabulary()  # the seqio vocabulary decodes the same ids
  with open(data_dir / "qa_pairs" / "trecqa_wang" / "train.csv", newline="", encoding="utf-8") as f:
    first = [r for r in csv.DictReader(f) if r["label"] == "1"][0]
  left = batch["left_encoder_input_tokens"][0]
  right = batch["right_encoder_input_tokens"][0]
  assert left[left != 0].tolist() == tokenizer.encode([first["qtext"]], max_length=128)[0]
  assert source.decode(right[right != 0].tolist()) == tokenizer.decode(tokenizer.encode([first["atext"]], max_length=128)[0])
  assert source.decode(left[left != 0].tolist()).startswith("Who is the author of the book")


def test_truncation_keeps_eos_and_pads(data_dir):
  it = make_local_iterator(task=tasks.QATAR_LIVING_GOOD, feature_lengths={"inputs": 8, "targets": 6},
                                    batch_size=16)
  b = next(it)
  left, right = b["left_encoder_input_tokens"], b["right_encoder_input_tokens"]
  assert left.shape == (16, 8) and right.shape == (16, 6)
  for row in list(left) + list(right):
    n = int((row != 0).sum())
    assert row[n - 1] == vocab.EOS_ID and not row[n:].any()


def test_repeat_false_one_epoch(data_dir):
  it = make_local_iterator(task=tasks.QATAR_LIVING_PERFECT_MATCH, feature_lengths=QA_LENGTHS,
                                    batch_size=100, repeat=False)
  assert len(list(it)) == 2  # 234 pairs (subtask B TRAIN + VAL), last partial batch of 34 dropped


def test_gin_data_config_is_the_entry_point(data_dir):
  """The trainer's DataConfig (bound by gin, as the run files do) builds the global iterator."""
  from st5_jax import gin_config, partitioning  # pylint: disable=g-import-not-at-top
  from st5_jax.train import DataConfig  # pylint: disable=g-import-not-at-top
  gin_config.register()
  gin.clear_config()
  gin.parse_config("""
    TASK_FEATURE_LENGTHS = {"inputs": 24, "targets": 16}
    DataConfig.task = "st5_trecqa_positives"
    DataConfig.feature_lengths = %TASK_FEATURE_LENGTHS
  """)
  try:
    config = gin.get_configurable("DataConfig")()
    assert isinstance(config, DataConfig)
    mesh = partitioning.make_mesh(partitioning.MeshConfig(data=4, fsdp=2, model=1))
    b = next(config(mesh, 8, 0))
    assert b["left_encoder_input_tokens"].shape == (8, 24) and b["right_encoder_input_tokens"].shape == (8, 16)
    assert b["left_encoder_input_tokens"].sharding.spec == jax.sharding.PartitionSpec(("data", "fsdp"), None)
  finally:
    gin.clear_config()


def test_reader_assignment_for_multi_process_layouts():
  # 2 processes x 4 devices, batch 16 sharded 8 ways: process p holds rows [8p, 8p+8).
  rows = {0: [(0, 2), (2, 4), (4, 6), (6, 8)], 1: [(8, 10), (10, 12), (12, 14), (14, 16)]}
  assert geometry.assign_readers(rows, 1) == geometry.ReaderAssignment(1, 2, 8)
  # Model parallelism across the two processes: both hold every row, so both read shard 0 of 1.
  rows = {0: [(0, 8), (8, 16)], 1: [(0, 8), (8, 16)]}
  assert geometry.assign_readers(rows, 1) == geometry.ReaderAssignment(0, 1, 16)
  # 4 processes, pairs replicate the same half of the batch.
  rows = {0: [(0, 8)], 1: [(0, 8)], 2: [(8, 16)], 3: [(8, 16)]}
  assert [geometry.assign_readers(rows, p).reader_id for p in range(4)] == [0, 0, 1, 1]
  with pytest.raises(DataConfigError, match="non-contiguous"):
    geometry.assign_readers({0: [(0, 4), (8, 12)], 1: [(4, 8), (12, 16)]}, 0)
  mesh = jax.make_mesh((4, 2), ("data", "model"))
  assert geometry.reader_assignment(mesh=mesh, data_axes=("data",), global_batch_size=8) == (
      geometry.ReaderAssignment(0, 1, 8))


def test_shuffled_row_traces_back_to_its_raw_line(data_dir, tokenizer):
  it = make_local_iterator(task=tasks.QATAR_LIVING_PERFECT_MATCH, feature_lengths={"inputs": 256,
                                                                                           "targets": 256},
                                    batch_size=8, seed=11)
  batch = next(it)
  source = seqio.get_mixture_or_task(tasks.QATAR_LIVING_PERFECT_MATCH).source
  by_tokens = {tuple(tokenizer.encode([ex["inputs"]], max_length=256)[0]) +
               tuple(tokenizer.encode([ex["targets"]], max_length=256)[0]): ex for ex in source.examples("train")}
  vocab_ = tasks.get_vocabulary()
  for left, right in zip(batch["left_encoder_input_tokens"], batch["right_encoder_input_tokens"]):
    ex = by_tokens[tuple(left[left != 0]) + tuple(right[right != 0])]
    path, line = ex["source"].rsplit(":", 1)
    with open(path, newline="", encoding="utf-8") as f:  # the record that starts at that physical line
      record = next(csv.reader(itertools.islice(f, int(line) - 1, None)))
    assert record[3] == "PerfectMatch"
    raw_question = builders.clean_cqa_text(record[2])
    assert vocab_.decode(right[right != 0].tolist()) == tokenizer.decode(
        tokenizer.encode([raw_question], max_length=256)[0])


def test_encode_block_truncates_leaving_room_for_eos_only_when_there_is_one():
  # Re-derived with SentencePiece directly: ids[:L-1] + [EOS] with EOS, ids[:L] without.
  sp = spm.SentencePieceProcessor(model_file=os.environ["ST5_VOCAB"])
  texts = ["A man is playing a large guitar on the stage tonight.", "Hi.", ""]
  L = 6
  for eos in (1, None):
    want = np.zeros((len(texts), L), np.int32)
    for i, t in enumerate(texts):
      ids = sp.encode(t, out_type=int)
      row = ids[:L - 1] + [eos] if eos is not None else ids[:L]
      want[i, :len(row)] = row
    np.testing.assert_array_equal(convert.encode_block(texts, sp, L, eos), want, err_msg=f"eos={eos}")
