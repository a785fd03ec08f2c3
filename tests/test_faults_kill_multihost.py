"""Faults: kill -9 of a 2-process run between the two processes' parts of one save.

Process 0 has written its part of checkpoint 8 and waits at orbax's `async_write_complete`
barrier; process 1 has not reported its part (its save thread is stopped before it). Both are
SIGKILLed (a lost slice). The rerun (2 processes again) restores the last committed step, 4,
never the torn 8, and ends bit-identical to an uninterrupted 2-process run.
"""

import json
import os
import pathlib
import signal
import socket
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
TrainConfig.num_train_steps = 8
TrainConfig.global_batch_size = 16
TrainConfig.checkpoint_every = 4
TrainConfig.keep_checkpoints = 10
TrainConfig.log_every = 1
TrainConfig.eval_every = -1
run.data = @synthetic_factory()
run.mesh = @MeshConfig()
MeshConfig.data = -1
"""
STEPS = 8
WORKER = pathlib.Path(__file__).parent / "faults_worker.py"


def _free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _start(tmp_path, workdir, **extra):
  gin_file = tmp_path / "run.gin"
  gin_file.write_text(GIN)
  port = _free_port()
  cmd = [sys.executable, str(WORKER), "train", "--gin_file", str(gin_file), "--workdir", str(workdir), "--no_progress"]
  return [subprocess.Popen(cmd, env=dict(os.environ, JAX_PLATFORMS="cpu",
                                         XLA_FLAGS=xla_flags(2),
                                         JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES="2",
                                         JAX_PROCESS_ID=str(i), **extra),
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for i in range(2)]


def _run(tmp_path, workdir):
  procs = _start(tmp_path, workdir)
  for p in procs:
    _, err = p.communicate(timeout=600)
    assert p.returncode == 0, err.decode()[-4000:]


def _params(workdir):
  _, params, step = native.load_params(workdir)
  return step, {k: np.asarray(v) for k, v in tree.flatten(params).items()}


def _committed(workdir):
  return sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("straight")
  _run(tmp, tmp / "wd")
  return _params(tmp / "wd")


def test_kill9_between_the_two_processes_parts_of_a_save(tmp_path, straight):
  wd = tmp_path / "wd"
  procs = _start(tmp_path, wd, ST5_FAULT_PEER_HANG="8")
  deadline = time.time() + 400
  while not ((wd / "FAULT_P0_WRITTEN").exists() and (wd / "FAULT_P1_HANG").exists()):
    for p in procs:
      assert p.poll() is None, p.stderr.read().decode()[-3000:]
    assert time.time() < deadline, "the save hooks never fired"
    time.sleep(0.02)
  time.sleep(0.5)  # process 0 is inside the barrier wait
  for p in procs:
    assert p.poll() is None  # neither finished the save
    p.send_signal(signal.SIGKILL)
  for p in procs:
    p.communicate(timeout=60)
    assert p.returncode == -signal.SIGKILL
  assert _committed(wd) == [4]  # step 8 is torn: process 0's part alone is never a checkpoint
  torn = [p.name for p in (wd / "checkpoints").iterdir() if "orbax-checkpoint-tmp" in p.name]
  assert torn and all(n.startswith("8.") for n in torn), torn
  for f in ("FAULT_P0_WRITTEN", "FAULT_P1_HANG"):
    (wd / f).unlink()
  logged_before = len((wd / "metrics.jsonl").read_text().splitlines())

  _run(tmp_path, wd)
  rows = [json.loads(l) for l in (wd / "metrics.jsonl").read_text().splitlines()[logged_before:]]
  assert rows[0]["step"] == 5  # resumed from the committed step 4
  assert _committed(wd) == [4, 8]
  assert not [p.name for p in (wd / "checkpoints").iterdir() if "orbax-checkpoint-tmp" in p.name]
  (sa, a), (sb, b) = straight, _params(wd)
  assert sa == sb == STEPS
  for k in a:
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)
