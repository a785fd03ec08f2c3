"""Elastic resume (st5_jax.data.elastic): a data state saved by N readers continues on N' readers,
and every example of an interrupted epoch is read exactly once.

Readers are local iterators (one per process on a pod: each process is one reader, and the
state a checkpoint saves holds every reader's cursor, which is what merging the local states
here gives). Each example is identified by its tokens (the cache and the NumPy path hold no
duplicate rows of this task); the reference for "an epoch of reader r of N" is read by a
fresh iterator of that reader.
"""

import collections
import json

import numpy as np
import pytest

from st5_jax.batch_geometry import DataConfigError
from st5_jax.data import cache, tasks
from st5_jax.data.iterator import make_local_iterator
from st5_jax.data.offline import cache_writer

TASK = tasks.STAGE2_SNLI_TRIPLES
LENGTHS = {"inputs": 40, "targets": 40}
KEYS = ("left_encoder_input_tokens", "right_encoder_input_tokens", "right_negative_encoder_input_tokens")
GLOBAL_BATCH = 48


@pytest.fixture(scope="module")
def cache3(data_dir, tmp_path_factory):
  """Three shards: on 2 readers, reader 0 holds two and reader 1 one, so they wrap at different steps."""
  root = tmp_path_factory.mktemp("elastic_cache")
  cache_writer.write_cache(TASK, "validation", cache.task_dir(str(root), TASK, "validation"), 3, LENGTHS)
  return str(root)


def _rows(batch):
  cols = [np.asarray(batch[k]) for k in KEYS]
  return [tuple(tuple(c[i][c[i] != 0].tolist()) for c in cols) for i in range(len(cols[0]))]


class Readers:
  """N local iterators of one global batch: the readers of one run."""

  def __init__(self, n, kw, state=None):
    self.its = [make_local_iterator(reader_id=r, num_readers=n, batch_size=GLOBAL_BATCH // n, **kw)
                for r in range(n)]
    if state is not None:
      for it in self.its:
        it.set_state(json.loads(json.dumps(state)))
    self.rows = [[] for _ in range(n)]

  def steps(self, k):
    for _ in range(k):
      for r, it in enumerate(self.its):
        self.rows[r] += _rows(next(it))

  def state(self):
    """The state every process's collective get_state returns: every reader's cursors."""
    states = [it.get_state() for it in self.its]
    merged = dict(states[0])
    merged["cursors"] = {k: v for s in states for k, v in s["cursors"].items()}
    return merged

  def close(self):
    for it in self.its:
      it.close()


def _epoch(kw, n, r):
  """(multiset, size) of one epoch of reader r of n."""
  it = make_local_iterator(reader_id=r, num_readers=n, batch_size=16, **kw)
  size = it._streams[0].count()  # pylint: disable=protected-access
  rows = []
  while len(rows) < size:
    rows += _rows(next(it))
  it.close()
  return collections.Counter(rows[:size]), size


def _carry_units(readers):
  return [it._streams[0].units for it in readers.its]  # pylint: disable=protected-access


def _split_by_epochs(rows, size):
  return [rows[i:i + size] for i in range(0, len(rows), size)]


@pytest.mark.parametrize("path,old_n,new_n,steps", [
    ("cache", 2, 1, 70), ("cache", 1, 2, 30), ("cache", 2, 3, 70),
    ("numpy", 2, 1, 70), ("numpy", 1, 2, 30), ("numpy", 2, 3, 70), ("seqio", 2, 1, 70)])
def test_each_example_once_per_epoch_across_a_change_of_readers(cache3, path, old_n, new_n, steps):
  kw = dict(task=TASK, split="validation", feature_lengths=LENGTHS, seed=5, shuffle_buffer_size=200,
            cache_dir=cache3 if path == "cache" else None, numpy_path=path != "seqio")
  ref = {(n, r): _epoch(kw, n, r) for n in {old_n, new_n} for r in range(n)}
  everything = collections.Counter()
  for r in range(new_n):
    everything += ref[(new_n, r)][0]
  assert sum(everything.values()) == 3082 and max(everything.values()) == 1  # no duplicates to hide behind

  old = Readers(old_n, kw)
  old.steps(steps)
  state = old.state()
  old.close()
  epochs = {r: state["cursors"][str(r)][TASK][0] for r in range(old_n)}
  if old_n == 2 and path == "cache":  # reader 1 (one shard) has wrapped, reader 0 (two) has not: two epochs
    assert epochs == {0: 0, 1: 1}, epochs
  if old_n == 2 and path != "cache":  # equal halves: both readers have wrapped
    assert epochs == {0: 1, 1: 1}, epochs

  new = Readers(new_n, kw, state)
  units = _carry_units(new)
  assert sorted(u for us in units for u in us) == sorted(
      [old_n, r, *state["cursors"][str(r)][TASK]] for r in range(old_n))
  need = max(sum(ref[(n, r)][1] - skip for n, r, _, skip in us) + ref[(new_n, i)][1] for i, us in enumerate(units))
  new.steps(need // (GLOBAL_BATCH // new_n) + 2)  # the carry and one regular epoch of every new reader

  # The carry: each old reader's unread rest of its epoch, read once by the reader it was dealt to.
  carry = collections.defaultdict(list)
  after = {}
  for r, us in enumerate(units):
    at = 0
    for n, old_r, e, skip in us:
      size = ref[(n, old_r)][1] - skip
      carry[(old_r, e)] += new.rows[r][at:at + size]
      at += size
    after[r] = new.rows[r][at:]
  for r in range(old_n):
    size = ref[(old_n, r)][1]
    for e, part in enumerate(_split_by_epochs(old.rows[r], size)):
      assert collections.Counter(part + carry.get((r, e), [])) == ref[(old_n, r)][0], (r, e)
  # Then every new reader's own epochs of the new sharding, whole, in every epoch.
  union = collections.Counter()
  for r in range(new_n):
    rows, size = after[r], ref[(new_n, r)][1]
    assert len(rows) >= size
    assert collections.Counter(rows[:size]) == ref[(new_n, r)][0], r
    union += collections.Counter(rows[:size])
    # Epochs keep counting from the latest epoch any old reader was in (the carry epoch).
    assert new.its[r].stats["tasks"][TASK]["epoch"] == max(epochs.values()) + 1 + len(rows) // size
  assert union == everything
  new.close()


def test_a_resume_inside_the_carry_epoch_is_exact_on_the_same_or_another_count(cache3):
  kw = dict(task=TASK, split="validation", feature_lengths=LENGTHS, seed=7, shuffle_buffer_size=300,
            cache_dir=cache3)
  old = Readers(2, kw)
  old.steps(25)
  state = old.state()
  one = Readers(1, kw, state)
  one.steps(10)  # inside the carry epoch (two old readers' rests: ~1,900 rows)
  mid = one.state()
  assert mid["elastic"][TASK]["from_readers"] == 2
  assert one.its[0].stats["tasks"][TASK]["elastic"]["in_carry"]
  one.steps(30)  # past the carry
  # The same count continues exactly, from the state saved inside the carry.
  again = Readers(1, kw, mid)
  again.steps(30)
  assert again.rows[0] == one.rows[0][10 * GLOBAL_BATCH:]
  assert "elastic" not in one.state()  # the carry is done: the state drops it
  # Another count inside the carry: the rest of the carry is dealt again (one unit each), and
  # every example of the interrupted epochs is still read once.
  two = Readers(2, kw, mid)
  units = _carry_units(two)
  assert [len(u) for u in units] == [1, 1]
  two.steps(50)
  for old_r in (0, 1):
    (n, r, e, skip), = units[old_r]
    assert (n, r, e) == (2, old_r, 0)
    ref_rows, size = _epoch(kw, 2, old_r)
    from_one = [row for row in one.rows[0][:10 * GLOBAL_BATCH] if row in ref_rows]
    whole = old.rows[old_r] + from_one + two.rows[old_r][:size - skip]
    assert collections.Counter(whole) == ref_rows, old_r
  for readers in (old, one, again, two):
    readers.close()


def test_an_elastic_resume_keeps_the_other_checks():
  kw = dict(task=TASK, split="validation", feature_lengths=LENGTHS, seed=1, shuffle_buffer_size=50)
  it = make_local_iterator(reader_id=0, num_readers=2, batch_size=16, **kw)
  next(it)
  state = it.get_state()
  it.close()
  # The global batch is not elastic (it changes the optimisation).
  with pytest.raises(DataConfigError, match="global_batch_size: saved 32, now 48"):
    make_local_iterator(reader_id=0, num_readers=1, batch_size=48, **kw).set_state(state)
  # A single-epoch iterator (evaluation) has nothing to carry over.
  with pytest.raises(DataConfigError, match="needs a repeating iterator"):
    make_local_iterator(reader_id=0, num_readers=1, batch_size=32, repeat=False, **kw).set_state(
        dict(state, repeat=False))
