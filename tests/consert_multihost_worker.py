"""One process of a multi-process ConSERT run (tests/test_consert.py starts two, or one).

argv: WORKDIR OUT_JSON STEPS
Env: JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID for multi-process.
"""

import json
import os
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parent))

import jax  # noqa: E402

import synthetic  # noqa: E402
from st5_jax import configs, multihost, optim, partitioning, train  # noqa: E402
from st5_jax.objectives import ConsertUnsup  # noqa: E402

# Shared with the test, which recomputes the first step's loss in one process.
MODEL = configs.ST5Config(t5=configs.t5_size("t5_tiny", dropout_rate=0.0, vocab_size=384), embedding_dim=16,
                          pooling="enc_first")


def train_config(steps):
  # enc_first: the faithful shuffle (per-example relative bias) is what runs.
  return train.TrainConfig(num_train_steps=steps, global_batch_size=16, checkpoint_every=steps, log_every=1,
                           eval_every=-1, objective=ConsertUnsup(view1="shuffle", view2="feature_cutoff",
                                                                 view2_rate=0.2),
                           optimizer=optim.OptimizerConfig(learning_rate=1e-2, epsilon1=1e-6))


if __name__ == "__main__":
  multihost.maybe_initialize()  # before any computation (the test imports this module for its configs)
  workdir, out_json, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
  result = train.train(workdir=workdir, model_config=MODEL, train_config=train_config(steps),
                       make_iterator=synthetic.sentences_factory(), mesh_config=partitioning.MeshConfig(data=-1),
                       vocab_file=os.environ["ST5_VOCAB"], progress=False)
  if jax.process_index() == 0:
    rows = [json.loads(l) for l in (pathlib.Path(workdir) / "metrics.jsonl").read_text().splitlines()]
    losses = [r["train/loss"] for r in rows if "train/loss" in r]
    pathlib.Path(out_json).write_text(json.dumps({"processes": jax.process_count(), "devices": jax.device_count(),
                                                  "local_devices": jax.local_device_count(), "losses": losses,
                                                  "step": result.step}))
