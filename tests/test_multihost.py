"""Two processes x 2 CPU devices (gloo collectives) train like one process x 4 devices."""

import json
import os
import socket
import subprocess
import sys

import numpy as np

from xla_env import xla_flags
from st5_jax.checkpoints import native, tree

WORKER = os.path.join(os.path.dirname(__file__), "multihost_worker.py")


def _env(devices, **extra):
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=xla_flags(devices))
  env.update(extra)
  return env


def _free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def test_two_processes_match_one_and_checkpoint_restores_in_one(tmp_path):
  steps = 4
  one_dir, one_json = tmp_path / "one", tmp_path / "one.json"
  subprocess.run([sys.executable, WORKER, str(one_dir), str(one_json), str(steps)], env=_env(4), check=True,
                 capture_output=True, timeout=600)

  two_dir, two_json = tmp_path / "two", tmp_path / "two.json"
  port = _free_port()
  procs = [subprocess.Popen([sys.executable, WORKER, str(two_dir), str(two_json), str(steps)],
                            env=_env(2, JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES="2",
                                     JAX_PROCESS_ID=str(i)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE) for i in range(2)]
  for p in procs:
    _, err = p.communicate(timeout=600)
    assert p.returncode == 0, err.decode()[-4000:]

  one, two = json.loads(one_json.read_text()), json.loads(two_json.read_text())
  assert (one["processes"], one["devices"]) == (1, 4)
  assert (two["processes"], two["devices"], two["local_devices"]) == (2, 4, 2)
  assert len(two["losses"]) == steps
  np.testing.assert_allclose(two["losses"], one["losses"], rtol=1e-5)

  # The checkpoint the two processes wrote together restores in this single process.
  _, params2, step2 = native.load_params(two_dir)
  _, params1, step1 = native.load_params(one_dir)
  assert step1 == step2 == steps
  flat1, flat2 = tree.flatten(params1), tree.flatten(params2)
  assert flat1.keys() == flat2.keys()
  for k in flat1:
    np.testing.assert_allclose(np.asarray(flat2[k]), np.asarray(flat1[k]), atol=1e-5, err_msg=k)
