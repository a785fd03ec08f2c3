"""One trainer per work dir (st5_jax/checkpoints/lease.py): a second one is refused (local and gs://), `--takeover`
takes over, a stale lease is taken over, and a trainer that lost its lease stops before it writes."""

import json
import os
import socket
import subprocess
import threading
import time

import gin
import pytest

import synthetic
from st5_jax import cli, configs, hooks, optim, partitioning, train
from st5_jax.checkpoints import lease as lease_lib
from st5_jax.checkpoints import native

TINY = configs.ST5Config(t5=configs.t5_size("t5_tiny", dropout_rate=0.0, vocab_size=384), embedding_dim=16)

gin.external_configurable(synthetic.factory, "lease_test_pairs")


# Not the defaults (600 s, renewed every 150 s): the tests see a renewal or an expiry within a second.
FAST = lease_lib.LeaseOptions(expiry_s=30.0, renew_s=0.05)


def _record(wd):
  return json.loads((wd / lease_lib.LEASE_FILE).read_text())


def _refused(wd, options=FAST):
  with pytest.raises(lease_lib.WorkdirInUseError) as e:
    lease_lib.WorkdirLease.acquire(wd, options)
  return str(e.value)


def test_a_second_trainer_is_refused_and_takeover_takes_it(tmp_path):
  wd = tmp_path / "wd"
  first = lease_lib.WorkdirLease.acquire(wd, FAST)
  held = _record(wd)
  assert (held["host"], held["pid"], held["expiry_s"]) == (socket.gethostname(), os.getpid(), 30.0)
  time.sleep(0.3)
  assert _record(wd)["renewed"] > held["renewed"]  # renewed in the background
  message = _refused(wd)
  assert "\n" not in message and f"host {socket.gethostname()}, pid {os.getpid()}, started " in message
  assert "last renewed" in message and "`st5 train --takeover`" in message and "wait until" in message
  assert _record(wd)["token"] == held["token"]  # the refused one wrote nothing

  second = lease_lib.WorkdirLease.acquire(wd, lease_lib.LeaseOptions(expiry_s=30.0, renew_s=0.05, takeover=True))
  assert _record(wd)["token"] == second.token != first.token
  deadline = time.time() + 10
  while first.lost is None and time.time() < deadline:  # the first one's renewal finds it gone
    time.sleep(0.02)
  assert "another trainer took it over" in first.lost
  with pytest.raises(lease_lib.WorkdirLeaseLostError, match="stopped before writing the checkpoint of step 8"):
    lease_lib.Held(first, str(wd)).check("writing the checkpoint of step 8")
  first.release()  # not its lease any more: left alone
  assert _record(wd)["token"] == second.token
  second.release()
  assert not (wd / lease_lib.LEASE_FILE).exists()
  lease_lib.WorkdirLease.acquire(wd, FAST).release()  # released: free for the next trainer


def test_a_released_lease_stays_released_when_its_old_holder_looks(tmp_path):
  """The holder a takeover displaced reads the lease after the new holder released it: no file appears
  (an empty lease.json would be a stale record for the next trainer to step over)."""
  wd = tmp_path / "wd"
  old = lease_lib.WorkdirLease.acquire(wd, lease_lib.LeaseOptions(expiry_s=60.0, renew_s=30.0))
  new = lease_lib.WorkdirLease.acquire(wd, lease_lib.LeaseOptions(expiry_s=60.0, renew_s=30.0, takeover=True))
  new.release()
  assert not (wd / lease_lib.LEASE_FILE).exists()
  assert old.verify() == "the lease file was removed"  # a real read: the renewal thread has not run yet
  old.renew()
  old.release()
  assert not (wd / lease_lib.LEASE_FILE).exists()


def test_a_stale_lease_is_taken_over_with_a_log_line(tmp_path, caplog):
  wd = tmp_path / "wd"
  # A holder that stops renewing (a preempted VM): its lease holds until it expires, then is taken over.
  gone = lease_lib.WorkdirLease.acquire(wd, lease_lib.LeaseOptions(expiry_s=1.0, renew_s=0.5))
  gone._stop.set()  # pylint: disable=protected-access
  _refused(wd)
  time.sleep(1.2)
  with caplog.at_level("WARNING", logger=lease_lib.__name__):
    lease_lib.WorkdirLease.acquire(wd, FAST).release()
  assert "without renewal" in caplog.text and "Taking over" in caplog.text
  assert gone.verify() is not None

  # A holder on this host whose process is gone (kill -9): free at once.
  dead = subprocess.Popen(["true"])
  dead.wait()
  record = dict(lease_lib.WorkdirLease(wd, FAST).record, pid=dead.pid)
  (wd / lease_lib.LEASE_FILE).write_text(json.dumps(record))
  caplog.clear()
  with caplog.at_level("WARNING", logger=lease_lib.__name__):
    lease_lib.WorkdirLease.acquire(wd, FAST).release()
  assert "no longer runs on this host" in caplog.text

  # A pid that runs again, as another process (a restarted container often gets its old pid): free.
  live = lease_lib.WorkdirLease(wd, FAST).record
  assert live["pid_start"] and live["boot_id"]
  (wd / lease_lib.LEASE_FILE).write_text(json.dumps(dict(live, token="x", pid_start=str(int(live["pid_start"]) + 1))))
  caplog.clear()
  with caplog.at_level("WARNING", logger=lease_lib.__name__):
    lease_lib.WorkdirLease.acquire(wd, FAST).release()
  assert "no longer runs on this host" in caplog.text
  # The same pid and start time, recorded before a reboot of this host: free.
  (wd / lease_lib.LEASE_FILE).write_text(json.dumps(dict(live, token="x", boot_id="an-earlier-boot")))
  caplog.clear()
  with caplog.at_level("WARNING", logger=lease_lib.__name__):
    lease_lib.WorkdirLease.acquire(wd, FAST).release()
  assert "rebooted" in caplog.text
  # The same record with this boot and start time is a live holder: refused.
  (wd / lease_lib.LEASE_FILE).write_text(json.dumps(dict(live, token="x")))
  _refused(wd)
  (wd / lease_lib.LEASE_FILE).unlink()

  # A lease copied with the work dir from another path holds nothing here.
  other = lease_lib.WorkdirLease.acquire(tmp_path / "elsewhere", FAST)
  (wd / lease_lib.LEASE_FILE).write_text((tmp_path / "elsewhere" / lease_lib.LEASE_FILE).read_text())
  lease_lib.WorkdirLease.acquire(wd, FAST).release()
  other.release()


def test_a_second_trainer_on_gcs_is_refused(gcs):
  wd = gcs.url("lease", "wd")
  first = lease_lib.WorkdirLease.acquire(wd, FAST)
  message = _refused(wd)
  assert "\n" not in message and f"pid {os.getpid()}" in message and "--takeover" in message
  # The object is exclusive by its generation, not by reading first: a create (ifGenerationMatch=0) and a write
  # based on an older generation both fail.
  store = lease_lib.WorkdirLease(wd, FAST).store
  assert store._put({"token": "intruder"}, 0) is None  # pylint: disable=protected-access
  stale = first.store.generation
  time.sleep(0.3)  # renewed since: a new generation
  assert store._put({"token": "intruder"}, stale) is None  # pylint: disable=protected-access
  assert store.read()["token"] == first.token

  second = lease_lib.WorkdirLease.acquire(wd, lease_lib.LeaseOptions(expiry_s=30.0, renew_s=0.05, takeover=True))
  assert first.verify() is not None and store.read()["token"] == second.token
  first.release()
  second.release()
  assert store.read() is None


def _cli_train(tmp_path, wd, *flags):
  gin_file = tmp_path / "run.gin"
  gin_file.write_text(synthetic.tiny_run_gin("lease_test_pairs", steps=2))
  return cli.main(["train", "--gin_file", str(gin_file), "--workdir", str(wd), "--no_progress", *flags])


def test_st5_train_is_refused_on_a_held_work_dir_and_takes_over_with_the_flag(tmp_path, capsys):
  wd = tmp_path / "wd"
  other = lease_lib.WorkdirLease.acquire(wd, lease_lib.LeaseOptions(expiry_s=30.0, renew_s=10.0))
  assert _cli_train(tmp_path, wd) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("st5 train: error: The work dir") and f"pid {os.getpid()}" in err[0]
  assert sorted(p.name for p in wd.iterdir()) == [lease_lib.LEASE_FILE]  # nothing else written

  assert _cli_train(tmp_path, wd, "--takeover", "--lease_expiry_s", "20") == 0
  assert native.committed_steps(wd) == [2] and other.verify() is not None
  assert not (wd / lease_lib.LEASE_FILE).exists()  # released at the end
  other.release()


class _TakeOver:
  """A hook: at its step another trainer takes the work dir over; then waits until the holder's renewal saw it."""

  def __init__(self, wd, wait_for_renewal):
    self.wd, self.wait_for_renewal, self.taken = wd, wait_for_renewal, None

  def __call__(self, info):
    holder = _record(self.wd)["token"]
    self.taken = lease_lib.WorkdirLease.acquire(self.wd, lease_lib.LeaseOptions(expiry_s=30.0, renew_s=10.0,
                                                                                  takeover=True))
    deadline = time.time() + 20
    while self.wait_for_renewal and any(t.name == f"st5-lease-{holder[:8]}" for t in threading.enumerate()):
      assert time.time() < deadline
      time.sleep(0.01)


@pytest.mark.parametrize("renew_s", [0.05, 60.0], ids=["renewal", "checkpoint"])
def test_a_trainer_that_lost_its_lease_stops_before_writing(tmp_path, vocab_path, renew_s):
  """Taken over at step 3: the trainer stops at step 4, before its metrics (the renewal thread saw it) or at least
  before its checkpoint (read again before every checkpoint); only step 2's checkpoint exists."""
  wd = tmp_path / "wd"
  takeover = _TakeOver(wd, wait_for_renewal=renew_s < 1)
  tc = train.TrainConfig(num_train_steps=8, global_batch_size=16, checkpoint_every=2, log_every=1, eval_every=-1,
                         optimizer=optim.OptimizerConfig(learning_rate=1e-2))
  with pytest.raises(lease_lib.WorkdirLeaseLostError, match="another trainer took it over") as e:
    train.train(workdir=wd, model_config=TINY, train_config=tc, make_iterator=synthetic.factory(),
                mesh_config=partitioning.MeshConfig(), vocab_file=vocab_path, progress=False,
                hooks=[hooks.Hook(takeover, every=3)], lease=lease_lib.LeaseOptions(expiry_s=120.0, renew_s=renew_s))
  deadline = time.time() + 60
  while native.committed_steps(wd) != [2]:  # step 2's save commits in the background
    assert time.time() < deadline, native.committed_steps(wd)
    time.sleep(0.05)
  assert not list((wd / "checkpoints").glob("4*"))  # not even a tmp dir of step 4
  logged = [json.loads(line)["step"] for line in (wd / "metrics.jsonl").read_text().splitlines()]
  if renew_s < 1:
    assert "step 4's writes" in str(e.value) and max(logged) == 3
  else:
    assert "checkpoint of step 4" in str(e.value)
  assert _record(wd)["token"] == takeover.taken.token  # the new holder's lease is untouched
  takeover.taken.release()
