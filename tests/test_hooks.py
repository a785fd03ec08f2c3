"""The training loop's hooks (st5_jax/hooks.py) and its metric writer (st5_jax/metric_writer.py)."""

import json
import math
import types

import numpy as np
import pytest
import tensorflow as tf
from tensorboardX import event_file_writer

from st5_jax import hooks, metric_writer, paths


def _info(step, *, last=False, stopping=False, loss=1.0, grad_norm=1.0):
  return hooks.StepInfo(step=step, state=None, metrics={"loss": np.float32(loss), "grad_norm": np.float32(grad_norm)},
                        batch={}, last=last, stopping=stopping)


def test_hooks_run_at_their_periods_in_order_and_at_the_end():
  calls = []
  h = hooks.Hooks()
  h.add_hook(lambda i: calls.append(("every", i.step)), every=1)
  h.add_hook(lambda i: calls.append(("log", i.step)), every=(3, 4), at_end=True)
  h.add_hook(lambda i: calls.append(("eval", i.step)), every=5)
  h.add_hook(lambda i: calls.append(("never", i.step)), every=0)  # eval_every 0 / -1: not periodic
  h.add_hook(lambda i: calls.append(("never", i.step)), every=-1)
  for step in range(1, 8):
    h.run(_info(step, last=step == 7))
  assert [c for c in calls if c[0] == "every"] == [("every", s) for s in range(1, 8)]
  assert [s for n, s in calls if n == "log"] == [3, 4, 6, 7]  # multiples of 3 or 4, and the last step
  assert [s for n, s in calls if n == "eval"] == [5]
  assert not [c for c in calls if c[0] == "never"]
  assert calls[calls.index(("log", 3)) - 1] == ("every", 3)  # added first, runs first


class _Mngr:
  directory = "/ckpt"

  def __init__(self):
    self.waited = 0

  def wait_until_finished(self):
    self.waited += 1

  def latest_step(self):
    return 4


def test_nan_guard_names_the_step_it_happened_not_the_step_it_was_seen():
  mngr = _Mngr()
  guard = hooks.NanGuard(mngr)
  for step, loss in [(5, 1.0), (6, math.nan), (7, 2.0)]:
    guard.record(_info(step, loss=loss))
  with pytest.raises(hooks.NonFiniteLossError, match=r"at step 6;.*last good checkpoint is step 4 in /ckpt"):
    guard.check(_info(7))
  assert mngr.waited == 1  # pending async saves finish before the error
  guard.record(_info(8, grad_norm=math.inf))
  with pytest.raises(hooks.NonFiniteLossError, match=r"gradient norm \(inf\) at step 8"):
    guard.check(_info(8))
  guard.record(_info(9))
  guard.check(_info(9))  # finite: nothing raised, nothing kept
  assert guard.unchecked == []


def _read_events(path):
  out = {}
  for e in tf.compat.v1.train.summary_iterator(path):
    for v in e.summary.value:
      out[(v.tag, e.step)] = v.simple_value
  return out


def test_metric_writer_on_gcs_writes_the_work_dir_directly_and_appends_on_resume(gcs, tmp_path, monkeypatch):
  """gs:// work dir: metrics.jsonl and the event file are objects in the work dir, no local mirror."""
  # Both runs in the same second (tensorboardX names event files by the second): still one file each.
  monkeypatch.setattr(event_file_writer, "time", types.SimpleNamespace(time=lambda: 1796107965.0))
  wd = gcs.url("hooks", "wd")
  w = metric_writer.MetricWriter(wd)
  w.write(1, {"loss": 2.5})
  w.write(2, {"loss": 2.0})
  w.flush()  # the trainer flushes at every checkpoint
  rows = [json.loads(l) for l in paths.read_text(f"{wd}/metrics.jsonl").splitlines()]
  assert [(r["step"], r["train/loss"]) for r in rows] == [(1, 2.5), (2, 2.0)]
  w.write(3, {"stsb_dev_spearman": 61.5}, prefix="eval")
  w.close()
  w2 = metric_writer.MetricWriter(wd)  # a resumed run appends to the same file
  w2.write(4, {"loss": 1.5})
  w2.close()
  rows = [json.loads(l) for l in paths.read_text(f"{wd}/metrics.jsonl").splitlines()]
  assert [r["step"] for r in rows] == [1, 2, 3, 4] and rows[2]["eval/stsb_dev_spearman"] == 61.5
  events = paths.glob(f"{wd}/tensorboard/events.out.tfevents.*")
  assert len(events) == 2  # one event file per run, as locally
  scalars = {}
  for i, url in enumerate(events):
    local = tmp_path / f"ev{i}"
    local.write_bytes(paths.read_bytes(url))
    scalars.update(_read_events(str(local)))
  assert scalars == {("train/loss", 1): 2.5, ("train/loss", 2): 2.0, ("eval/stsb_dev_spearman", 3): 61.5,
                     ("train/loss", 4): 1.5}


def test_abandoned_metric_writer_on_a_full_disk_leaves_nothing_for_exit(tmp_path, monkeypatch):
  # A run that failed on a full disk: the event file's final flush fails as well. abandon()
  # must not raise it again, and tensorboardX's atexit cleanup (event_writer.close()) must have
  # nothing left to flush, or it prints the error as a traceback after the run's one-line error.
  w = metric_writer.MetricWriter(tmp_path / "wd")
  w.write(1, {"loss": 3.0})

  def full_disk(self):
    raise OSError(28, "No space left on device")

  monkeypatch.setattr(event_file_writer.EventsWriter, "flush", full_disk)
  with pytest.raises(OSError):
    w.tb.flush()  # the disk refuses the event file's flush
  event_writers = [f.event_writer for f in w.tb.all_writers.values()]
  w.abandon()
  w.abandon()  # and again (the trainer's failure path may meet a writer closed half-way)
  assert event_writers
  for events in event_writers:
    events.close()  # what tensorboardX's atexit cleanup calls: a no-op now


def test_metric_writer_local_rows_are_on_disk_at_once_and_disabled_writes_nothing(tmp_path):
  w = metric_writer.MetricWriter(tmp_path / "wd")
  w.write(1, {"loss": 3.0})
  assert json.loads((tmp_path / "wd" / "metrics.jsonl").read_text())["train/loss"] == 3.0  # before any flush
  w.close()
  off = metric_writer.MetricWriter(tmp_path / "other", enabled=False)  # processes other than 0
  off.write(1, {"loss": 3.0})
  off.flush()
  off.close()
  assert not (tmp_path / "other").exists()
