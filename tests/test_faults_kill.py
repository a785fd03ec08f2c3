"""Faults: kill -9 (no SIGTERM: a lost VM, the OOM killer) at chosen moments, including inside an
orbax save and while its async commit is in flight. The rerun restores the last committed
checkpoint, never a torn one, and ends bit-identical to an uninterrupted run."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from xla_env import xla_flags
from st5_jax.checkpoints import native, tree

GIN = """
run.model = @st5_model()
st5_model.size = 't5_tiny'
st5_model.embedding_dim = 16
st5_model.dropout_rate = 0.1
st5_model.vocab_size = 384
run.train_config = @TrainConfig()
TrainConfig.num_train_steps = {steps}
TrainConfig.global_batch_size = 16
TrainConfig.checkpoint_every = {every}
TrainConfig.keep_checkpoints = 10
TrainConfig.log_every = 1
TrainConfig.eval_every = -1
run.data = @synthetic_factory()
run.mesh = @MeshConfig()
MeshConfig.data = -1
"""

WORKER = pathlib.Path(__file__).parent / "faults_worker.py"
ENV = dict(os.environ, XLA_FLAGS=xla_flags(4))
STEPS, EVERY = 12, 4


def _cmd(tmp_path, workdir):
  gin_file = tmp_path / "run.gin"
  gin_file.write_text(GIN.format(steps=STEPS, every=EVERY))
  return [sys.executable, str(WORKER), "train", "--gin_file", str(gin_file), "--workdir", str(workdir),
          "--no_progress"]


def _params(workdir):
  _, params, step = native.load_params(workdir)
  return step, {k: np.asarray(v) for k, v in tree.flatten(params).items()}


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("straight")
  subprocess.run(_cmd(tmp, tmp / "wd"), env=ENV, check=True, capture_output=True, timeout=600)
  return _params(tmp / "wd")


def _kill_when_hung(tmp_path, workdir, hang):
  proc = subprocess.Popen(_cmd(tmp_path, workdir), env=dict(ENV, ST5_FAULT_HANG=hang),
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
  marker = workdir / "FAULT_HANG"
  deadline = time.time() + 400
  # The worker creates the marker, then writes it: wait for its text (read empty once under load).
  while not (marker.exists() and marker.read_text().strip()):
    assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
    assert time.time() < deadline, "the save hook never fired"
    time.sleep(0.02)
  proc.send_signal(signal.SIGKILL)
  proc.communicate(timeout=60)
  assert proc.returncode == -signal.SIGKILL
  return marker.read_text().split()


def _committed(workdir):
  return sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())


def _tmp_dirs(workdir):
  return [p.name for p in (workdir / "checkpoints").iterdir() if "orbax-checkpoint-tmp" in p.name]


@pytest.mark.parametrize("phase", ["create", "commit"])
def test_kill9_inside_a_save_restores_the_last_committed_one(tmp_path, straight, phase):
  """kill -9 inside the save of step 8: step 8 is torn (a tmp dir), step 4 is what the rerun restores."""
  wd = tmp_path / "wd"
  phase_seen, tmp_dir = _kill_when_hung(tmp_path, wd, f"8:{phase}")
  assert phase_seen == phase and "orbax-checkpoint-tmp" in tmp_dir and pathlib.Path(tmp_dir).exists()
  assert _committed(wd) == [4]  # the torn step 8 is not listed as a checkpoint
  if phase == "commit":  # the async commit was in flight while training went on past step 8
    assert len((wd / "metrics.jsonl").read_text().splitlines()) >= 8
  (wd / "FAULT_HANG").unlink()
  logged_before = len((wd / "metrics.jsonl").read_text().splitlines())
  rerun = subprocess.run(_cmd(tmp_path, wd), env=ENV, capture_output=True, timeout=600)
  assert rerun.returncode == 0, rerun.stderr.decode()[-3000:]
  rows = [json.loads(l) for l in (wd / "metrics.jsonl").read_text().splitlines()[logged_before:]]
  assert rows[0]["step"] == 5  # resumed from the committed step 4
  assert _committed(wd) == [4, 8, 12]
  assert _tmp_dirs(wd) == []  # the torn tmp dir was cleaned up, not left to fill the disk
  (sa, a), (sb, b) = straight, _params(wd)
  assert sa == sb == STEPS
  for k in a:
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_kill9_twice_in_a_row_then_resume(tmp_path, straight):
  """Two crashes (inside the first save, then inside the rerun's commit of step 8) and a final rerun."""
  wd = tmp_path / "wd"
  _kill_when_hung(tmp_path, wd, "4:commit")
  assert _committed(wd) == []
  (wd / "FAULT_HANG").unlink()
  _kill_when_hung(tmp_path, wd, "8:create")
  assert _committed(wd) == [4]
  (wd / "FAULT_HANG").unlink()
  subprocess.run(_cmd(tmp_path, wd), env=ENV, check=True, capture_output=True, timeout=600)
  (sa, a), (sb, b) = straight, _params(wd)
  assert sa == sb == STEPS and _tmp_dirs(wd) == []
  for k in a:
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)
