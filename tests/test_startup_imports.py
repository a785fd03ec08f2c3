"""A training process starts without importing torch.

Every `st5 train` process (each worker of a pod, each resume) pays its imports. tensorboardX
imports torch whenever it is installed, ~1.2 s of CPU at each start on this machine, and training
never uses it. torch is installed in the test environment (the reference tests need it), so
its absence below means something. (scikit-learn, another second, is imported by
TensorFlow's eager import of Keras, which seqio's tasks need; it stays.)
"""

import json
import os
import pathlib
import subprocess
import sys

from tests import xla_env

_START = """
import importlib.util, json, sys
assert importlib.util.find_spec("torch")  # installed here
{before}
from st5_jax import cli, gin_config, metric_writer, train
from st5_jax.commands import train as train_command
workdir = sys.argv[1]
writer = metric_writer.MetricWriter(workdir)
writer.write(3, {{"loss": 0.5}})
writer.close()
loaded = "torch" in sys.modules
torch_object = sys.modules.get("torch")
import torch  # importable afterwards: the writer only hid it while tensorboardX loaded
print(json.dumps({{"loaded": loaded, "torch_kept": torch_object is torch}}))
"""


def _start(workdir: pathlib.Path, before: str = "") -> dict:
  env = dict(os.environ, XLA_FLAGS=xla_env.xla_flags(1), JAX_PLATFORMS="cpu")
  out = subprocess.run([sys.executable, "-c", _START.format(before=before), str(workdir)], capture_output=True, text=True,
                       timeout=300, env=env)
  assert out.returncode == 0, out.stderr[-3000:]
  report = json.loads(out.stdout.strip().splitlines()[-1])
  # tensorboardX loaded without torch still writes the scalar into an event file.
  events = list((workdir / "tensorboard").glob("events.out.tfevents.*"))
  assert len(events) == 1 and b"train/loss" in events[0].read_bytes()
  return report


def test_a_training_process_starts_without_torch(tmp_path):
  assert _start(tmp_path)["loaded"] is False


def test_torch_imported_first_stays_the_same_module(tmp_path):
  # A user's script that imported torch before st5_jax keeps its module object.
  report = _start(tmp_path, "import torch")
  assert report["loaded"] and report["torch_kept"]
