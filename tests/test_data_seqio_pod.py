"""Acceptance: users' seqio Tasks, registered in their own module imported from the gin file, train
on 2 processes (`launch/tpu_run.sh --local-pod 2`), survive a SIGTERM and resume to exactly the
parameters of an uninterrupted run.

The user's module registers (1) a TextLineDataSource over a TSV with custom preprocessors (parse,
rekey, lower-case), (2) a TfdsDataSource over a TFDS dataset built locally by `st5 data prepare
--tfds`, and (3) a mixture of the two. The data state each process resumes from is its own
shard's (epoch, offset) per task, gathered into the checkpoint by get_state.
"""

import csv
import json
import os
import pathlib
import signal
import subprocess
import textwrap
import threading
import time

import numpy as np
import pytest

from st5_jax.checkpoints import native, tree
from st5_jax.data import iterator
from st5_jax.data.offline import prepare

REPO = pathlib.Path(__file__).resolve().parents[1]
TPU_RUN = str(REPO / "launch" / "tpu_run.sh")
STEPS = 20
DEDUP_WINDOW = iterator.DEFAULT_DEDUP_WINDOW  # gin/runs/base.gin: DataConfig.dedup = True

USER_MODULE = '''
"""A user's tasks, as a t5x user writes them (imported by the gin file: `import acc_user_tasks`)."""
import functools

import seqio
import tensorflow as tf

from st5_jax.data.vocabulary import get_vocabulary

TSV = {tsv!r}
TFDS_DIR = {tfds_dir!r}


@seqio.map_over_dataset
def parse_tsv(line):
  question, answer = tf.io.decode_csv(line, record_defaults=["", ""], field_delim="\\t", use_quote_delim=False)
  return {{"question": question, "answer": answer}}


def lowercase(ds):
  return ds.map(lambda ex: {{k: tf.strings.lower(v, encoding="utf-8") for k, v in ex.items()}})


def features():
  return {{k: seqio.Feature(vocabulary=get_vocabulary(), add_eos=True) for k in ("inputs", "targets")}}


STANDARD = [seqio.preprocessors.tokenize, seqio.preprocessors.append_eos_after_trim]
seqio.TaskRegistry.add(
    "acc_trec_tsv", source=seqio.TextLineDataSource({{"train": TSV}}),
    preprocessors=[parse_tsv, functools.partial(seqio.preprocessors.rekey,
                                                key_map={{"inputs": "question", "targets": "answer"}}),
                   lowercase, *STANDARD],
    output_features=features(), shuffle_buffer_size=500)
seqio.TaskRegistry.add(
    "acc_wikiqa_tfds", source=seqio.TfdsDataSource("st5_qa_pairs/wikiqa_positives:1.0.0", tfds_data_dir=TFDS_DIR),
    preprocessors=[functools.partial(seqio.preprocessors.rekey, key_map={{"inputs": "inputs", "targets": "targets"}}),
                   *STANDARD],
    output_features=features(), shuffle_buffer_size=500)
seqio.MixtureRegistry.add("acc_mix", [("acc_trec_tsv", 1.0), ("acc_wikiqa_tfds", 2.0)])
'''

GIN = '''
import acc_user_tasks

include 'runs/stage1_qa.gin'
include 'models/t5_tiny.gin'

st5_model.embedding_dim = 32
st5_model.max_length = 32
st5_model.dtype = 'float32'
st5_model.scan_layers = True

DataConfig.task = 'acc_mix'
TASK_FEATURE_LENGTHS = {{'inputs': 24, 'targets': 32}}

TrainConfig.global_batch_size = 32
TrainConfig.num_train_steps = {steps}
TrainConfig.checkpoint_every = 10
TrainConfig.log_every = 1
TrainConfig.eval_every = -1
OptimizerConfig.epsilon1 = 1e-6

MeshConfig.data = -1
MeshConfig.fsdp = 2
MeshConfig.model = 1
'''


class _Output:
  def __init__(self, proc):
    self.lines = []
    self._thread = threading.Thread(target=lambda: self.lines.extend(proc.stdout), daemon=True)
    self._thread.start()

  def text(self):
    return "".join(self.lines)

  def wait_for(self, needle, proc, timeout=900):
    deadline = time.time() + timeout
    while needle not in self.text():
      assert proc.poll() is None, f"exited {proc.returncode} before {needle!r}:\n{self.text()[-4000:]}"
      assert time.time() < deadline, f"no {needle!r} after {timeout}s:\n{self.text()[-4000:]}"
      time.sleep(0.2)


def _launch(env, gin, workdir):
  return subprocess.Popen([TPU_RUN, "--gin", gin, "--local-pod", "2", "--workdir", workdir], env=env, cwd=REPO,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def _run(env, gin, workdir):
  proc = _launch(env, gin, workdir)
  out = _Output(proc)
  proc.wait(timeout=1500)
  out._thread.join(timeout=10)
  assert proc.returncode == 0, out.text()[-6000:]
  return out.text()


def _data_state(workdir, step):
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  mngr = native.checkpoint_manager(workdir, read_only=True, item_handlers={"meta": ocp.JsonCheckpointHandler()})
  try:
    return mngr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]["data_state"]
  finally:
    mngr.close()


def _params(workdir):
  _, params, step = native.load_params(workdir)
  return step, {k: np.asarray(v) for k, v in tree.flatten(params).items()}


def test_user_seqio_tasks_on_two_processes_resume_exactly(data_dir, tmp_path):
  user = tmp_path / "user"
  user.mkdir()
  with open(data_dir / "qa_pairs" / "trecqa_wang" / "train.csv", newline="", encoding="utf-8") as f:
    pairs = [(r["qtext"].strip(), r["atext"].strip()) for r in csv.DictReader(f) if r["label"] == "1"]
  (user / "pairs.tsv").write_text("".join(f"{q}\t{a}\n" for q, a in pairs), encoding="utf-8")
  report = prepare.prepare(out_dir=str(tmp_path / "data"), source_dir=str(data_dir), datasets=["wikiqa"],
                           offline=True, progress=False, tfds=True)
  assert report.ok and report.tfds, report.summary()
  (user / "acc_user_tasks.py").write_text(USER_MODULE.format(tsv=str(user / "pairs.tsv"),
                                                            tfds_dir=str(tmp_path / "data" / "tfds")))
  gin = user / "acc.gin"
  gin.write_text(textwrap.dedent(GIN.format(steps=STEPS)))
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(user), str(REPO), os.environ.get("PYTHONPATH", "")]),
             ST5_LOCAL_POD_DEVICES="4")
  env.pop("XLA_FLAGS", None)  # the launcher sets the per-process device count
  env.pop("JAX_COMPILATION_CACHE_DIR", None)

  # The reference: uninterrupted.
  ref = str(tmp_path / "ref")
  log = _run(env, str(gin), ref)
  assert "[worker 0]" in log and "[worker 1]" in log
  assert json.loads((pathlib.Path(ref) / "results.json").read_text())["mesh"] == {"data": 4, "fsdp": 2, "model": 1}

  # SIGTERM to the launcher mid-run (forwarded to both workers), then the same command again.
  run = str(tmp_path / "run")
  proc = _launch(env, str(gin), run)
  out = _Output(proc)
  out.wait_for(f"step 6/{STEPS}:", proc)
  proc.send_signal(signal.SIGTERM)
  proc.wait(timeout=600)
  out._thread.join(timeout=10)
  assert proc.returncode == 143, out.text()[-6000:]
  assert out.text().count("Rerun the same command to resume") == 2
  stopped = native.load_params(run)[2]
  assert 6 <= stopped < STEPS and stopped != 10, stopped  # resumes from the preemption checkpoint, mid-epoch
  state = _data_state(run, stopped)
  # Both processes' shard positions, gathered into the one JSON the primary host writes.
  assert set(state["cursors"]) == {"0", "1"} and state["num_readers"] == 2
  assert state["streams"] == {"acc_trec_tsv": "seqio", "acc_wikiqa_tfds": "seqio"}
  # With dedup on, batches are made in windows of DEDUP_WINDOW steps; a state saved inside a
  # window holds the window's start positions and replays to `step` on resume (no batch is
  # repeated or skipped: the equality of the parameters below proves it).
  assert state["step"] == stopped and state["dedup_window"] == DEDUP_WINDOW
  assert state["block_start_step"] == stopped - stopped % DEDUP_WINDOW, state
  assert sum(state["positions"].values()) == state["block_start_step"] * 16  # 16 rows per process and step
  _run(env, str(gin), run)

  (s_ref, p_ref), (s_run, p_run) = _params(ref), _params(run)
  assert s_ref == s_run == STEPS
  assert p_ref.keys() == p_run.keys()
  for k in p_ref:
    np.testing.assert_array_equal(p_run[k], p_ref[k], err_msg=k)
