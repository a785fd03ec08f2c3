"""The token cache (format and reader st5_jax.data.cache, writer st5_jax.data.offline.cache_writer): same examples as
the in-memory path, exact and cheap resume, clear errors."""

import collections
import hashlib
import json
import os
import random
import shutil

import numpy as np
import pytest
import seqio
import tensorflow as tf

from xla_env import xla_flags
from st5_jax import cli
from st5_jax.data import cache, convert, overlap, tasks
from st5_jax.data.offline import cache_writer
from st5_jax.data.iterator import make_local_iterator

TASK = tasks.STAGE2_SNLI_TRIPLES
LENGTHS = {"inputs": 40, "targets": 40}
KEYS = ("left_encoder_input_tokens", "right_encoder_input_tokens", "right_negative_encoder_input_tokens")


def _take(it, n):
  return [{k: np.asarray(v) for k, v in next(it).items()} for _ in range(n)]


def _assert_same(a, b):
  assert len(a) == len(b)
  for x, y in zip(a, b):
    assert x.keys() == y.keys()
    for k in x:
      np.testing.assert_array_equal(x[k], y[k])


def _row_counter(batch):
  return collections.Counter(zip(*[map(lambda r: tuple(r[r != 0].tolist()), batch[k]) for k in KEYS]))


@pytest.fixture(scope="module")
def cache_root(data_dir, tmp_path_factory):
  root = tmp_path_factory.mktemp("cache")
  for split in ("train", "validation"):
    cache_writer.write_cache(TASK, split, cache.task_dir(str(root), TASK, split), 4, LENGTHS)
  return str(root)


def _row_list(batch):
  cols = [np.asarray(batch[k]) for k in KEYS]
  return [tuple(tuple(c[i][c[i] != 0].tolist()) for c in cols) for i in range(len(cols[0]))]


def _manifest(root, split="validation"):
  return json.loads(open(os.path.join(cache.task_dir(root, TASK, split), cache.MANIFEST)).read())


@pytest.mark.parametrize("split", ["train", "validation"])
@pytest.mark.parametrize("lengths", [LENGTHS, {"inputs": 12, "targets": 20}])
def test_cache_holds_the_in_memory_paths_examples_without_duplicates(cache_root, split, lengths, vocab_path):
  """Same rows (filters and decontamination included) and tokens as the NumPy path, first of each text kept."""
  source = seqio.get_mixture_or_task(TASK).source
  examples = list(source.open(split).iter_examples())
  n = len(examples)
  # The existing path, unshuffled: one batch of the whole split in source order.
  ref = next(make_local_iterator(task=TASK, split=split, feature_lengths=lengths, batch_size=n, shuffle=False,
                                 repeat=False, prefetch=0))
  features = ("inputs", "targets", "negative_targets")
  seen, keep = set(), []
  for i, ex in enumerate(examples):
    key = tuple(overlap.normalize(ex[f]) for f in features)
    if key not in seen:
      seen.add(key)
      keep.append(i)
  want = _row_counter({k: v[keep] for k, v in ref.items()})
  # Read back through the training stream: one epoch, unshuffled, shorter lengths re-truncated from the cache's.
  m = _manifest(cache_root, split)
  got_it = make_local_iterator(task=TASK, split=split, feature_lengths=lengths, batch_size=m["num_examples"],
                               shuffle=False, repeat=False, prefetch=0, cache_dir=cache_root)
  batches = list(got_it)
  assert len(batches) == 1
  assert _row_counter(batches[0]) == want
  stats = m["stats"]
  assert stats["rows_in"] == n and stats["examples"] == m["num_examples"] == len(keep)
  assert stats["dropped_duplicates"] == n - len(keep)
  if split == "train":
    assert stats["dropped_duplicates"] >= 1  # docs/data.md: one dev triple occurs twice
  build = source.open(split).build_stats
  assert stats["dropped_contaminated"] == sum(v for k, v in build["filtered_by_reason"].items()
                                              if k.startswith("text in evaluation set")) > 0
  assert m["decontaminated"] is True
  tok = tasks.get_vocabulary().tokenizer
  trimmed = sum(any(len(tok.encode(examples[i][f])) > LENGTHS[f.replace("negative_", "")] - 1 for f in features)
                for i in keep)
  assert stats["trimmed"] == trimmed > 0


def test_written_bytes_are_a_pure_function_of_the_examples(cache_root, tmp_path):
  m = _manifest(cache_root)
  folder = cache.task_dir(cache_root, TASK, "validation")
  again = str(tmp_path / "again")
  m2 = cache_writer.write_cache(TASK, "validation", again, 4, LENGTHS)
  assert cache_writer.manifest_bytes(m2) == open(os.path.join(folder, cache.MANIFEST), "rb").read()
  for entry in m["shards"]:
    data = open(os.path.join(folder, entry["file"]), "rb").read()
    assert data == open(os.path.join(again, entry["file"]), "rb").read()
    assert len(data) == entry["bytes"] and hashlib.sha256(data).hexdigest() == entry["sha256"]
    # Any writer that emits the same (key, record) pairs in any order makes the same file.
    records = list(cache.CacheReader(folder).iter_shard(m["shards"].index(entry)))
    assert len(records) == entry["examples"]
    assert all(tf.train.Example.FromString(r).features.feature["inputs"].int64_list.value[-1] == 1 for r in records)
    # Standard TFRecord framing: TensorFlow's own reader agrees.
    assert sum(1 for _ in tf.data.TFRecordDataset(os.path.join(folder, entry["file"]))) == entry["examples"]
  # encode_shard is order independent: keys recomputed from the tokens' shard order check out.
  reader = cache.CacheReader(folder)
  recs = list(reader.iter_shard(0))
  keyed = [(hashlib.sha256(r).digest(), r) for r in recs]
  shuffled = keyed[:]
  random.Random(0).shuffle(shuffled)
  assert cache_writer.encode_shard(shuffled) == cache_writer.encode_shard(keyed)
  # The dedup key is the normalised text: spacing, case and punctuation do not make a new example.
  assert cache_writer.dedup_key(["A man is running .", "x"]) == cache_writer.dedup_key(["a man is running.", "X"])
  assert cache_writer.dedup_key(["a man", "is running"]) != cache_writer.dedup_key(["a man is", "running"])


def test_seqio_path_writes_the_same_bytes_when_nothing_is_trimmed(data_dir):
  """Any seqio task goes through its own pipeline; on a project task (long lengths) it matches the NumPy path."""
  task = seqio.get_mixture_or_task(TASK)
  layout = convert.batch_layout([task], {"inputs": 128, "targets": 128})
  shards_np, m_np = cache_writer.build_cache(task, "train", layout, num_shards=2)
  shards_tf, m_tf = cache_writer.build_cache(task, "train", layout, num_shards=2, numpy_path=False)
  assert (m_np["pipeline"], m_tf["pipeline"]) == ("numpy", "seqio")
  assert m_np["stats"]["trimmed"] == 0 and m_tf["stats"]["trimmed"] is None
  assert m_tf["stats"]["dropped_duplicates"] == m_np["stats"]["dropped_duplicates"] >= 1
  assert shards_tf == shards_np and m_tf["shards"] == m_np["shards"]


def _resume_check(kw, steps, total, cache_dir):
  it = make_local_iterator(cache_dir=cache_dir, **kw)
  states, ref = {}, []
  for s in range(total):
    if s in steps:
      states[s] = json.loads(json.dumps(it.get_state()))
    ref.append({k: np.asarray(v) for k, v in next(it).items()})
  for s in steps:
    resumed = make_local_iterator(cache_dir=cache_dir, **kw)
    resumed.set_state(states[s])
    _assert_same(_take(resumed, total - s), ref[s:])
    yield s, states[s], resumed


@pytest.mark.parametrize("dedup", [False, True])
def test_resume_is_exact_and_reads_at_most_one_shard(cache_root, dedup):
  m = _manifest(cache_root)
  counts = [s["examples"] for s in m["shards"]]
  batch = 64
  per_epoch = m["num_examples"] / batch  # 3,082 rows: epoch 1 starts in batch 48
  steps = [0, 3, 10, 27, 47, 48, 49] + ([6, 45, 53] if dedup else [])
  kw = dict(task=TASK, split="validation", feature_lengths=LENGTHS, batch_size=batch, seed=3, dedup=dedup,
            shuffle_buffer_size=100)  # a bounded in-shard buffer, smaller than every shard
  positions = set()
  for s, state, resumed in _resume_check(kw, sorted(steps), 56, cache_root):
    stream = resumed._streams[0]  # pylint: disable=protected-access
    epoch, offset = state["cursors"]["0"][TASK]
    e, pos, record = stream.position((epoch, offset))
    positions.add((e, pos, record > 0))
    shard = stream.shards[stream.shard_order(e)[pos]]
    # Whole shards before the position are skipped by their counts: what was read to get there is
    # at most the shard holding it (its prefix up to the position plus the shuffle buffer's fill).
    assert stream.resume_records_read <= counts[shard], (s, stream.resume_records_read, counts[shard])
    if dedup:
      assert state["block_start_step"] == s - s % 4
  assert any(e == 1 for e, _, _ in positions) and any(p > 0 and mid for _, p, mid in positions)
  assert per_epoch < 49


def test_mixture_cached_by_the_command_resumes_exactly(data_dir, tmp_path, capsys):
  root = str(tmp_path / "mix")
  rc = cli.main(["data", "cache", "--task", tasks.STAGE1_PUBLIC_QA_MIXTURE, "--out", root, "--num_shards", "3",
                 "--feature_lengths", "inputs=32,targets=32"])
  assert rc == 0
  out = capsys.readouterr().out
  assert out.count("examples in 3 shards") == len(tasks.STAGE1_PUBLIC_TASKS)
  kw = dict(task=tasks.STAGE1_PUBLIC_QA_MIXTURE, feature_lengths={"inputs": 32, "targets": 32}, batch_size=128,
            seed=1, shuffle_buffer_size=50)
  for _, state, resumed in _resume_check(kw, [0, 7, 19], 26, root):
    assert set(state["streams"].values()) == {"cache"}
    assert resumed.stats["tasks"][tasks.TRECQA]["epoch"] >= 0


def test_two_readers_own_disjoint_shards_and_restore_from_the_others_state(cache_root):
  kw = dict(task=TASK, split="validation", feature_lengths=LENGTHS, batch_size=32, num_readers=2, seed=2,
            shuffle_buffer_size=64, cache_dir=cache_root)
  epoch = {}
  for r in (0, 1):
    it = make_local_iterator(reader_id=r, repeat=False, **kw)
    assert it._streams[0].shards == [r, r + 2]  # pylint: disable=protected-access
    epoch[r] = sum((_row_counter(b) for b in it), collections.Counter())
  assert not set(epoch[0]) & set(epoch[1])
  # Reader 1 restores a state saved by reader 0 only (as when the primary host saves it): it places
  # itself from the manifest's counts, with no counting pass, and continues as if never stopped.
  one = make_local_iterator(reader_id=1, **kw)
  ref = _take(one, 70)  # past reader 1's epoch
  zero = make_local_iterator(reader_id=0, **kw)
  _take(zero, 40)
  state = zero.get_state()
  assert set(state["cursors"]) == {"0"}
  resumed = make_local_iterator(reader_id=1, **kw)
  resumed.set_state(state)
  _assert_same(_take(resumed, 30), ref[40:])
  with pytest.raises(cache.CacheError, match="has 4 shards for 5 data readers"):
    make_local_iterator(task=TASK, split="validation", feature_lengths=LENGTHS, batch_size=8, num_readers=5,
                        cache_dir=cache_root)


def _copy(cache_root, tmp_path):
  root = tmp_path / "copy"
  shutil.copytree(cache.task_dir(cache_root, TASK, "validation"), cache.task_dir(str(root), TASK, "validation"))
  return str(root), cache.task_dir(str(root), TASK, "validation")


def _edit_manifest(folder, fn):
  path = os.path.join(folder, cache.MANIFEST)
  m = json.loads(open(path).read())
  fn(m)
  open(path, "w").write(json.dumps(m))


def _error(fn, match):
  with pytest.raises(cache.CacheError, match=match) as e:
    fn()
  assert "\n" not in str(e.value)
  return str(e.value)


def test_corrupt_truncated_or_mismatched_caches_are_one_line_errors(cache_root, tmp_path):
  kw = dict(task=TASK, split="validation", feature_lengths=LENGTHS, batch_size=64, shuffle=False, prefetch=0)
  root, folder = _copy(cache_root, tmp_path)
  shard0 = os.path.join(folder, cache.shard_name(0, 4))
  data = open(shard0, "rb").read()

  open(shard0, "wb").write(data[:-7])  # truncated
  _error(lambda: make_local_iterator(cache_dir=root, **kw), r"shard-00000-of-00004.tfrecord is \d+ bytes, the "
         r"manifest says \d+: truncated")

  bad = bytearray(data)
  bad[len(data) // 2] ^= 0xFF  # same size, one flipped byte: the record checksum catches it when read
  open(shard0, "wb").write(bytes(bad))
  it = make_local_iterator(cache_dir=root, **kw)
  _error(lambda: _take(it, 20), r"checksum mismatch\) at record \d+; rewrite the cache")

  open(shard0, "wb").write(data)
  _edit_manifest(folder, lambda m: (m["shards"][0].update(examples=m["shards"][0]["examples"] + 1),
                                    m.update(num_examples=m["num_examples"] + 1)))
  _error(lambda: list(cache.CacheReader(folder).iter_shard(0)), r"holds \d+ records, the manifest says \d+")
  _edit_manifest(folder, lambda m: m.update(num_examples=m["num_examples"] + 5))
  _error(lambda: cache.CacheReader(folder), "inconsistent")

  root, folder = _copy(cache_root, tmp_path / "b")
  _edit_manifest(folder, lambda m: m.update(vocabulary_sha256="0" * 64))
  _error(lambda: make_local_iterator(cache_dir=root, **kw), "tokenised with vocabulary sha256 000000000000")

  root, folder = _copy(cache_root, tmp_path / "c")
  _error(lambda: make_local_iterator(cache_dir=root, **{**kw, "feature_lengths": {"inputs": 64, "targets": 40}}),
         "truncated to 40 tokens; this run asks for 64")
  _error(lambda: make_local_iterator(cache_dir=str(tmp_path / "none"), **kw), "No cache at .*st5 data cache")
  # A state of another cache (other contents or shard count: its shards' checksums) is refused.
  it = make_local_iterator(cache_dir=cache_root, **kw)
  next(it)
  _edit_manifest(folder, lambda m: m["shards"][0].update(sha256="0" * 64))
  with pytest.raises(ValueError, match="caches: saved"):
    make_local_iterator(cache_dir=root, **kw).set_state(it.get_state())
  # A state from the source path does not restore onto the cache (another order), nor vice versa.
  plain = make_local_iterator(task=TASK, split="validation", feature_lengths=LENGTHS, batch_size=8)
  next(plain)
  with pytest.raises(ValueError, match="streams"):
    make_local_iterator(cache_dir=root, **kw).set_state(plain.get_state())


def test_command_errors_are_one_line(tmp_path, capsys):
  for argv, match in [
      (["--task", "st5_no_such_task"], "Unknown task or mixture 'st5_no_such_task'"),
      (["--task", TASK, "--feature_lengths", "inputs"], "is not FEATURE=LENGTH"),
      (["--task", TASK, "--split", "nope"], "has no split 'nope'"),
      (["--task", TASK, "--num_shards", "0"], "at least 1"),
  ]:
    rc = cli.main(["data", "cache", "--out", str(tmp_path)] + argv)
    assert rc == cli.USER_ERROR_EXIT
    err = [l for l in capsys.readouterr().err.splitlines() if l.startswith("st5 data cache: error: ")]
    assert len(err) == 1 and match in err[0], err
  assert not os.listdir(tmp_path)


def test_two_processes_read_their_own_shards_and_resume_together_or_on_one(cache_root, tmp_path):
  """Two processes x 2 CPU devices (gloo): process p reads shards p, p+2; the gathered state resumes both."""
  import socket  # pylint: disable=g-import-not-at-top
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  worker = os.path.join(os.path.dirname(__file__), "cache_multihost_worker.py")
  outs = [tmp_path / f"p{i}.json" for i in range(2)]
  procs = [subprocess.Popen([sys.executable, worker, cache_root, str(outs[i])],
                            env=dict(os.environ, JAX_PLATFORMS="cpu",
                                     XLA_FLAGS=xla_flags(2),
                                     JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES="2",
                                     JAX_PROCESS_ID=str(i)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE) for i in range(2)]
  for p in procs:
    _, err = p.communicate(timeout=600)
    assert p.returncode == 0, err.decode()[-4000:]
  got = [json.loads(o.read_text()) for o in outs]
  for i, g in enumerate(got):
    assert (g["process"], g["processes"], g["reader"], g["shards"]) == (i, 2, i, [i, i + 2])
    assert g["resume_same"] and g["cursor_readers"] == ["0", "1"]
    assert g["resume_records_read"] <= max(s["examples"] for s in _manifest(cache_root)["shards"])
  assert got[0]["batches"] == got[1]["batches"]
  # The global batch is reader 0's rows then reader 1's, as one process per reader makes them.
  kw = dict(task=TASK, split="validation", feature_lengths=LENGTHS, batch_size=16, num_readers=2, seed=4,
            shuffle_buffer_size=64, cache_dir=cache_root)
  local = [_take(make_local_iterator(reader_id=r, **kw), 12) for r in (0, 1)]
  for step, batch in enumerate(got[0]["batches"]):
    for k, rows in batch.items():
      np.testing.assert_array_equal(np.asarray(rows), np.concatenate([local[0][step][k], local[1][step][k]]))
  # The state both processes saved after 5 steps resumes on one process (an elastic resume, 2 -> 1):
  # the two readers' unread rest of the epoch, then whole epochs; no example twice, none lost.
  state = got[0]["state"]
  assert state == got[1]["state"] and state["num_readers"] == 2
  one = make_local_iterator(task=TASK, split="validation", feature_lengths=LENGTHS, batch_size=32, seed=4,
                            shuffle_buffer_size=64, cache_dir=cache_root)
  one.set_state(state)
  total = _manifest(cache_root)["num_examples"]
  before = [row for b in got[0]["batches"][:5] for row in _row_list(b)]
  after = [row for b in _take(one, -(-2 * total // 32)) for row in _row_list(b)]
  carry, epoch = after[:total - len(before)], after[total - len(before):2 * total - len(before)]
  assert len(set(epoch)) == total and collections.Counter(before + carry) == collections.Counter(epoch)


def test_cache_on_gcs_reads_as_the_local_one(cache_root, gcs):
  url = gcs.url("cache", "root")
  m = cache_writer.write_cache(TASK, "validation", cache.task_dir(url, TASK, "validation"), 4, LENGTHS)
  assert m == _manifest(cache_root)
  kw = dict(task=TASK, split="validation", feature_lengths=LENGTHS, batch_size=64, seed=9, shuffle_buffer_size=50)
  it = make_local_iterator(cache_dir=url, **kw)
  _take(it, 3)
  state = it.get_state()
  ref = _take(make_local_iterator(cache_dir=cache_root, **kw), 6)[3:]
  resumed = make_local_iterator(cache_dir=url, **kw)
  resumed.set_state(state)
  _assert_same(_take(resumed, 3), ref)


def test_chunked_shard_reads_cross_record_boundaries(cache_root):
  import io  # pylint: disable=g-import-not-at-top
  from st5_jax.data.rows import iter_tfrecord_payloads  # pylint: disable=g-import-not-at-top
  data = open(os.path.join(cache.task_dir(cache_root, TASK, "validation"), cache.shard_name(1, 4)), "rb").read()
  want = list(iter_tfrecord_payloads(io.BytesIO(data)))
  chunked = cache._ChunkReader  # pylint: disable=protected-access
  for chunk in (1, 7, 4096):
    assert list(iter_tfrecord_payloads(chunked(io.BytesIO(data), chunk))) == want
  assert list(iter_tfrecord_payloads(chunked(io.BytesIO(data[:-3]), 7)))[-1] == "truncated record"
