"""One process of a multi-process training run (tests/test_multihost.py starts two, or one).

argv: WORKDIR OUT_JSON STEPS
Env: JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID for multi-process.
"""

import json
import os
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parent))

from st5_jax import multihost  # noqa: E402

multihost.maybe_initialize()

import jax  # noqa: E402

import synthetic  # noqa: E402
from st5_jax import configs, optim, partitioning, train  # noqa: E402

workdir, out_json, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
model = configs.ST5Config(t5=configs.t5_size("t5_tiny", dropout_rate=0.1, vocab_size=384), embedding_dim=16)
tc = train.TrainConfig(num_train_steps=steps, global_batch_size=16, checkpoint_every=steps, log_every=1,
                       eval_every=-1, optimizer=optim.OptimizerConfig(learning_rate=1e-2, epsilon1=1e-6))
result = train.train(workdir=workdir, model_config=model, train_config=tc, make_iterator=synthetic.factory(),
                     mesh_config=partitioning.MeshConfig(data=-1), vocab_file=os.environ["ST5_VOCAB"],
                     progress=False)
if jax.process_index() == 0:
  rows = [json.loads(l) for l in (pathlib.Path(workdir) / "metrics.jsonl").read_text().splitlines()]
  losses = [r["train/loss"] for r in rows if "train/loss" in r]
  pathlib.Path(out_json).write_text(json.dumps({"processes": jax.process_count(), "devices": jax.device_count(),
                                                "local_devices": jax.local_device_count(), "losses": losses,
                                                "step": result.step}))
