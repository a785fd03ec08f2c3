"""Training files with several negatives: {query, pos, neg} JSON lines as a task with K negatives an example,
drawn deterministically per (seed, epoch, row), resumable, bad rows counted; a mined file trains from its gin file."""

import json

import numpy as np
import pytest

from st5_jax import cli, gin_config, partitioning
from st5_jax.data import registry, sources
from st5_jax.data.iterator import make_local_iterator
from st5_jax.data.rows import RowStats
from st5_jax.errors import BadRowError
from st5_jax.features import RIGHT_NEG, negative_features

K = 3


def _row(i, negs, pos=None):
  return json.dumps({"query": f"query {i} about topic {i % 7}", "pos": pos or [f"answer {i}"], "neg": negs})


@pytest.fixture()
def rows_file(tmp_path):
  """40 good rows (row 3: two positives; rows 5 and 6: fewer than K negatives) and five rows that are not examples."""
  lines = [_row(i, [f"neg {i}.{j}" for j in range(6 + i % 3)]) for i in range(40)]
  lines[3] = _row(3, [f"neg 3.{j}" for j in range(6)], pos=["answer 3", "answer 3 again"])
  lines[5] = _row(5, ["neg 5.0", "neg 5.1"])
  lines[6] = _row(6, ["only one", "  "])  # blank strings are dropped
  lines += [json.dumps({"query": "no pos", "neg": ["a"]}),
            json.dumps({"query": "neg not a list", "pos": ["p"], "neg": "a"}),
            "{not json",
            _row(99, []),  # no negatives: filtered, not bad
            json.dumps({"query": "", "pos": ["p"], "neg": ["a"]})]
  path = tmp_path / "train.jsonl"
  path.write_text("\n".join(lines) + "\n")
  return path


def _split(path, **kw):
  return sources.HardNegativesSplit(str(path), num_negatives=K, **kw)


def test_each_example_has_k_negatives_of_its_row_and_bad_rows_are_counted(rows_file):
  stats = RowStats()
  examples = list(_split(rows_file).iter_examples(file_order_seed=11, stats=stats))
  negs = [k for k, _ in negative_features(K)]
  assert negs == ["negative_targets", "negative_targets_1", "negative_targets_2"]
  assert len(examples) == 40 and all(set(ex) == {"inputs", "targets", *negs} for ex in examples)
  for i, ex in enumerate(examples):
    assert ex["inputs"] == f"query {i} about topic {i % 7}"
    drawn = [ex[k] for k in negs]
    if i == 5:  # two negatives: both, and one of them again
      assert sorted(set(drawn)) == ["neg 5.0", "neg 5.1"]
    elif i == 6:
      assert drawn == ["only one"] * 3
    else:
      assert len(set(drawn)) == K and all(d.startswith(f"neg {i}.") for d in drawn)
  assert {ex["targets"] for ex in examples[3:4]} <= {"answer 3", "answer 3 again"}
  # Over the epochs (file_order_seed is the epoch key) row 3's two positives and all of a row's negatives come up.
  epochs = [list(_split(rows_file).iter_examples(file_order_seed=e)) for e in range(12)]
  assert {ep[3]["targets"] for ep in epochs} == {"answer 3", "answer 3 again"}
  assert {ep[0][k] for ep in epochs for k in negs} == {f"neg 0.{j}" for j in range(6)}
  path = str(rows_file)
  assert stats.as_dict() == {
      "rows_read": 45, "rows_skipped": 4, "rows_filtered": 1,
      "skipped_by_reason": {"missing field 'pos'": 1, "field 'neg' is not a list of strings": 1, "invalid JSON": 1,
                            "empty text in field 'query'": 1},
      "filtered_by_reason": {"no negatives": 1},
      "first_skipped": [f"{path}:41: missing field 'pos'", f"{path}:42: field 'neg' is not a list of strings",
                        f"{path}:43: invalid JSON (Expecting property name enclosed in double quotes at column 2)",
                        f"{path}:45: empty text in field 'query'"]}
  # A second epoch counts no row again; strict mode stops at the first bad row with its place.
  list(_split(rows_file).iter_examples(stats=stats))
  assert stats.rows_read == 45 and stats.rows_skipped == 4
  with pytest.raises(BadRowError, match=f"{path}:41: missing field 'pos'"):
    list(_split(rows_file, strict=True).iter_examples())
  assert _split(rows_file).count() == 40 and _split(rows_file).count(shard_index=1, num_shards=2) == 20


def test_the_draw_is_a_function_of_seed_epoch_and_row(rows_file, tmp_path):
  def by_query(examples):
    return {ex["inputs"]: ex for ex in examples}

  first = by_query(_split(rows_file).iter_examples(file_order_seed=7))
  assert first == by_query(_split(rows_file).iter_examples(file_order_seed=7))
  other_epoch = by_query(_split(rows_file).iter_examples(file_order_seed=8))
  other_seed = by_query(_split(rows_file, seed=1).iter_examples(file_order_seed=7))
  changed = lambda a: sum(a[q] != first[q] for q in first)  # noqa: E731
  # Every row its own draw: which of its negatives (by position) each row gets varies over the rows.
  positions = {tuple(ex[k].split(".")[-1] for k in ("negative_targets", "negative_targets_1", "negative_targets_2"))
               for ex in first.values()}
  assert len(positions) > 20
  assert changed(other_epoch) > 20 and changed(other_seed) > 20
  # Not a function of which reader reads the row: two shards of records give the one reader's examples.
  halves = [by_query(_split(rows_file).iter_examples(shard_index=i, num_shards=2, file_order_seed=7)) for i in (0, 1)]
  assert {**halves[0], **halves[1]} == first and len(halves[0]) == len(halves[1]) == 20
  # Nor of the order files are read in: the rows split into three files, read in an order the seed draws.
  lines = rows_file.read_text().splitlines()
  for f in range(3):
    (tmp_path / f"part-{f}.jsonl").write_text("\n".join(lines[f::3]) + "\n")
  split = _split(tmp_path / "part-*.jsonl")
  one_reader = list(split.iter_examples(file_order_seed=7))  # the three files in an order the seed draws ...
  per_file = {}
  for f in range(3):  # ... and each file alone (three readers): the same draws
    per_file.update(by_query(split.iter_examples(shard_index=f, num_shards=3, file_order_seed=7)))
  assert by_query(one_reader) == per_file and per_file.keys() == first.keys()
  in_file_order = [ex["inputs"] for f in range(3) for ex in split.iter_examples(shard_index=f, num_shards=3)]
  assert [ex["inputs"] for ex in one_reader] != in_file_order  # the seed did reorder the files


def _iterator(task, **kw):
  return make_local_iterator(task=task, feature_lengths={"inputs": 12, "targets": 12}, batch_size=4, seed=5,
                             shuffle_buffer_size=16, prefetch=0, **kw)


def _take(it, n):
  return [next(it) for _ in range(n)]


def test_batches_carry_k_negatives_and_resume_mid_epoch(rows_file):
  registry.register_hard_negatives_task("multineg_test", file_pattern=str(rows_file), num_negatives=K, seed=2)
  ref = _take(_iterator("multineg_test"), 25)  # 100 examples: two and a half epochs of 40
  want = {"left_encoder_input_tokens", "right_encoder_input_tokens", RIGHT_NEG, f"{RIGHT_NEG}_1", f"{RIGHT_NEG}_2"}
  assert all(set(b) == want and all(v.shape == (4, 12) and v.dtype == np.int32 for v in b.values()) for b in ref)
  for stop in (3, 13):  # inside the first epoch, and inside the second
    it = _iterator("multineg_test")
    _take(it, stop)
    state = json.loads(json.dumps(it.get_state()))
    resumed = _iterator("multineg_test")
    resumed.set_state(state)
    for got, expected in zip(_take(resumed, 25 - stop), ref[stop:]):
      for k in want:
        np.testing.assert_array_equal(got[k], expected[k])
  # Each epoch draws again: the same query meets other negatives in epoch 2 than in epoch 1.
  seen = {}
  for epoch_batches in (ref[:10], ref[10:20]):
    rows = {tuple(q): tuple(map(tuple, (b[RIGHT_NEG][i], b[f"{RIGHT_NEG}_1"][i], b[f"{RIGHT_NEG}_2"][i])))
            for b in epoch_batches for i, q in enumerate(b["left_encoder_input_tokens"])}
    for q, negs in rows.items():
      seen.setdefault(q, []).append(negs)
  assert sum(a != b for a, b in (v for v in seen.values() if len(v) == 2)) > 20


def test_seqios_pipeline_reads_the_same_examples(rows_file):
  """numpy_path=False: the task through seqio.get_dataset; unshuffled, both paths hand the source epoch key 0."""
  registry.register_hard_negatives_task("multineg_seqio", file_pattern=str(rows_file), num_negatives=K)
  its = [_iterator("multineg_seqio", shuffle=False, numpy_path=path) for path in (True, False)]
  try:
    for a, b in zip(_take(its[0], 12), _take(its[1], 12)):  # past the end of the first epoch (10 batches)
      assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
  finally:
    for it in its:
      it.close()


def _gin_run(tmp_path, mined, *extra):
  gin_config.parse_gin(["mined_tiny_cpu.gin"], [
      f"st5_jax.data.hard_negatives_task.file_pattern = '{mined}'", "TrainConfig.num_train_steps = 2",
      "TrainConfig.global_batch_size = 8", "TrainConfig.eval_every = -1", "TrainConfig.checkpoint_every = 2",
      "TrainConfig.log_every = 1", *extra])
  return gin_config.run_spec()


def test_a_mined_file_trains_from_its_gin_file(tmp_path, monkeypatch):
  """A users' JSON-lines corpus and pairs -> `st5 data mine` -> gin/mined_tiny_cpu.gin (K = 3) -> two steps."""
  topics = ["river", "music", "stone", "paper", "night", "city", "bird", "light"]
  docs = [f"the {t} {w} of the {u}" for t in topics for w in ("story", "song", "road") for u in topics[:3]]
  (tmp_path / "corpus.jsonl").write_text("".join(json.dumps({"id": f"d{i}", "text": d}) + "\n"
                                                 for i, d in enumerate(docs)))
  (tmp_path / "pairs.jsonl").write_text("".join(
      json.dumps({"query": f"what about the {t} {u}", "pos": [f"the {t} story of the {u}"]}) + "\n"
      for t in topics for u in topics[:3]))
  out = tmp_path / "mined"
  assert cli.main(["data", "mine", "--pairs", str(tmp_path / "pairs.jsonl"), "--corpus", str(tmp_path / "corpus.jsonl"),
                   "--out", str(out), "--num_negatives", "4", "--range_min", "1", "--range_max", "20"]) == 0
  counts = json.loads((out / "manifest.json").read_text())["counts"]
  assert counts["queries"] == 24 and counts["mined"] == 96 and counts["short"] == 0

  # The file pattern from the environment when gin names none; none at all is one actionable error.
  monkeypatch.delenv("ST5_USER_HARD_NEGATIVES", raising=False)
  gin_config.parse_gin(["mined_tiny_cpu.gin"], [])
  spec = gin_config.run_spec()
  assert spec.data.task == "st5_user_hard_negatives" and spec.train_config.objective.num_negatives == 3
  mesh = partitioning.make_mesh(spec.mesh)
  with pytest.raises(ValueError, match="bind st5_jax.data.hard_negatives_task.file_pattern .* ST5_USER_HARD_NEGATIVES"):
    spec.data(mesh, 8, 0)
  monkeypatch.setenv("ST5_USER_HARD_NEGATIVES", str(out / "part-*.jsonl"))
  batch = next(spec.data(mesh, 8, 0))
  assert sorted(batch) == sorted(["left_encoder_input_tokens", "right_encoder_input_tokens", RIGHT_NEG,
                                  f"{RIGHT_NEG}_1", f"{RIGHT_NEG}_2"])
  assert all(v.shape == (8, 32) for v in batch.values())

  spec = _gin_run(tmp_path, out / "part-*.jsonl")
  result = gin_config.train_from_gin(workdir=str(tmp_path / "work"), progress=False)
  metrics = [json.loads(line) for line in (tmp_path / "work" / "metrics.jsonl").read_text().splitlines()]
  losses = [m["train/loss"] for m in metrics]
  # Two steps on 8 queries, each against its positive, the other 7 examples' 4 towers and its 3 negatives.
  assert [m["step"] for m in metrics] == [1, 2] and all(np.isfinite(losses)) and result.step == 2, metrics
