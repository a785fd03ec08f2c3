"""Pod rehearsal: the paper's two-stage TPU run, end to end on gs://, on this machine.

`launch/tpu_run.sh --local-pod 2` runs the TPU workers' own command as 2 JAX processes x
4 CPU devices (gloo collectives); gs:// is a GCS emulator on 127.0.0.1 that every
process reaches through STORAGE_EMULATOR_HOST alone. The model is tiny but scanned,
rematerialised and fsdp-sharded, and every path (work dirs, data, vocabulary,
init_from, eval outputs, export) is on the emulated bucket:

  0. the stage-1 QA pairs (users' TSV on gs://) cached by the Beam pipeline (DirectRunner)
     into gs:// with `st5 data cache --gin_file rehearsal/stage1.gin --runner DirectRunner`;
  1. stage 1 from that cache (each process its own shards) with periodic STS-B dev
     evaluation reading gs:// data, the best evaluated parameters kept in WORKDIR/best;
  2. SIGTERM to the launcher (forwarded to both workers) mid-run, rerun: parameters
     identical to an uninterrupted run (the cache resumed by shard counts), the same best;
  3. stage 2 with run.init_from = the stage-1 work dir on gs:// (its best), on a user's seqio
     tasks as a t5x user writes them: a module imported from the user's gin file registers a
     TextLineDataSource over a TSV with custom preprocessors (parse, rekey, lower-case) and a
     TfdsDataSource over a TFDS dataset built by `st5 data prepare --tfds` (both on the
     workers' local disk: TensorFlow's filesystem cannot reach the emulator), mixed with the
     NLI triples read from gs://; SIGTERM'd inside a dedup window and rerun, it ends with the
     parameters of an uninterrupted stage 2, each process resuming from its own shard positions;
  3b. stage 2 continued for 4 steps on 1 host instead of 2 (a smaller slice): the data state
     resumes elastically and orbax restores onto one process;
  4. `st5 eval` and `st5 export` of gs://.../stage2, writing to gs://;
  5. the SavedModel loaded from gs:// equals SentenceEncoder.load(gs://.../stage2).
(Until 2026-12 step 3 was a separate 2-process test of its own, which compiled every program
again: folded in here, the two scenarios share their launches and compiles.)
"""

import csv
import json
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np

from st5_jax import paths
from st5_jax.checkpoints import native, tree
from st5_jax.data import iterator
from st5_jax.data.offline import prepare

REPO = pathlib.Path(__file__).resolve().parents[1]
TPU_RUN = str(REPO / "launch" / "tpu_run.sh")
STAGE1_STEPS = 20
STAGE2_STEPS = 20
DEDUP_WINDOW = iterator.DEFAULT_DEDUP_WINDOW  # gin/runs/base.gin: DataConfig.dedup = True

USER_MODULE = '''
"""A user's tasks, as a t5x user writes them (imported by the gin file: `import acc_user_tasks`)."""
import functools

import seqio
import tensorflow as tf

import st5_jax.data.tasks  # registers st5_user_nli_triples, mixed in below
from st5_jax.data.vocabulary import get_vocabulary

TSV = {tsv!r}
TFDS_DIR = {tfds_dir!r}
KEYS = ("inputs", "targets", "negative_targets")


@seqio.map_over_dataset
def parse_tsv(line):
  premise, entailed, contradicted = tf.io.decode_csv(line, record_defaults=["", "", ""], field_delim="\\t",
                                                     use_quote_delim=False)
  return {{"premise": premise, "entailed": entailed, "contradicted": contradicted}}


def lowercase(ds):
  return ds.map(lambda ex: {{k: tf.strings.lower(v, encoding="utf-8") for k, v in ex.items()}})


def features():
  return {{k: seqio.Feature(vocabulary=get_vocabulary(), add_eos=True) for k in KEYS}}


STANDARD = [seqio.preprocessors.tokenize, seqio.preprocessors.append_eos_after_trim]
seqio.TaskRegistry.add(
    "acc_nli_tsv", source=seqio.TextLineDataSource({{"train": TSV}}),
    preprocessors=[parse_tsv, functools.partial(seqio.preprocessors.rekey, key_map=dict(zip(
                       KEYS, ("premise", "entailed", "contradicted")))),
                   lowercase, *STANDARD],
    output_features=features(), shuffle_buffer_size=500)
seqio.TaskRegistry.add(
    "acc_nli_tfds", source=seqio.TfdsDataSource("st5_nli_triples/snli_devtest_triples:1.0.0",
                                                tfds_data_dir=TFDS_DIR),
    preprocessors=[functools.partial(seqio.preprocessors.rekey, key_map={{k: k for k in KEYS}}), *STANDARD],
    output_features=features(), shuffle_buffer_size=500)
# With the NLI triples the run's gin reads from gs:// (st5_user_nli_triples, not a seqio source).
seqio.MixtureRegistry.add("acc_nli_mix", [("acc_nli_tsv", 1.0), ("acc_nli_tfds", 2.0), ("st5_user_nli_triples", 1.0)])
'''

USER_GIN = '''
import acc_user_tasks

include 'rehearsal/stage2.gin'

DataConfig.task = 'acc_nli_mix'
TrainConfig.num_train_steps = {steps}
'''


def _env(gcs, data_url):
  env = dict(os.environ, **gcs.env(), ST5_DATA_DIR=data_url, ST5_LOCAL_POD_DEVICES="4")
  env.pop("ST5_VOCAB", None)  # the vocabulary comes from the bucket too
  # The launcher's workers start from a fresh-login environment (tests/test_launch_env.py): of this
  # one they get the ST5_* variables, STORAGE_EMULATOR_HOST and what _launch names with --env. Not
  # conftest's JAX_COMPILATION_CACHE_DIR: they compile without a persistent cache, as they must
  # (no cache guard there; tests/conftest.py: jaxlib 0.10.2 loads executables with collectives in
  # loop bodies, the scanned layers', without their order). Nor do the commands run here directly.
  env["JAX_ENABLE_COMPILATION_CACHE"] = "false"
  return env


def _launch(env, gin, workdir, *overrides, hosts=2):
  # --env XLA_FLAGS: conftest's cheap compiles, explicitly (the launcher adds the device count).
  cmd = [TPU_RUN, "--gin", gin, "--local-pod", str(hosts), "--workdir", workdir, "--env", "XLA_FLAGS", *overrides]
  return subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          start_new_session=True)


class _Output:
  """Collects a process's output in a thread; `wait_for(text)` blocks until it appears."""

  def __init__(self, proc):
    self.lines = []
    self._thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
    self._thread.start()

  def _read(self, proc):
    for line in proc.stdout:
      self.lines.append(line)

  def text(self):
    return "".join(self.lines)

  def wait_for(self, needle, proc, timeout=600):
    deadline = time.time() + timeout
    while needle not in self.text():
      assert proc.poll() is None, f"exited {proc.returncode} before {needle!r}:\n{self.text()[-4000:]}"
      assert time.time() < deadline, f"no {needle!r} after {timeout}s:\n{self.text()[-4000:]}"
      time.sleep(0.1)


LOG_DIR = None  # set by the test: every launcher's output is kept there


def _run(env, gin, workdir, *overrides, expect=0, hosts=2):
  proc = _launch(env, gin, workdir, *overrides, hosts=hosts)
  out = _Output(proc)
  proc.wait(timeout=900)
  out._thread.join(timeout=10)
  (LOG_DIR / f"{workdir.rsplit('/', 1)[-1]}-{time.time():.0f}.log").write_text(out.text())
  assert proc.returncode == expect, out.text()[-6000:]
  return out.text()


def _data_state(url, step):
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  mngr = native.checkpoint_manager(url, read_only=True, item_handlers={"meta": ocp.JsonCheckpointHandler()})
  try:
    return mngr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]["data_state"]
  finally:
    mngr.close()


def _params(url):
  _, params, step = native.load_params(url)
  return step, {k: np.asarray(v) for k, v in tree.flatten(params).items()}


def test_pod_rehearsal_two_stages_on_gcs(gcs, data_dir, tmp_path):
  global LOG_DIR
  LOG_DIR = tmp_path
  # The data a pod reads from its bucket: eval sets, the vocabulary, training files.
  for rel in ("stsb/original", "t5_spiece", "qa_pairs/wikiqa", "nli"):
    gcs.upload(data_dir / rel, "data", *rel.split("/"))
  data = gcs.url("data")
  env = _env(gcs, data)
  qa_files = f"--gin.st5_jax.data.user_qa_pairs.file_pattern='{data}/qa_pairs/wikiqa/WikiQA-train.tsv'"
  nli = f"--gin.st5_jax.data.user_nli_triples.file_pattern='{data}/nli/snli_devtest_triples_derived.csv'"

  # 0. The stage-1 task cached by Beam from the bucket into the bucket, as the run's gin configures it.
  cache_url = gcs.url("st5_cache")
  qa = f"--gin.DataConfig.cache_dir='{cache_url}'"
  out = subprocess.run([sys.executable, "-m", "st5_jax.cli", "data", "cache", "--gin_file", "rehearsal/stage1.gin",
                        qa_files, qa, "--num_shards", "4", "--runner", "DirectRunner"],
                       env=dict(env, JAX_PLATFORMS="cpu"), cwd=REPO, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  manifest = json.loads(paths.read_text(f"{cache_url}/st5_user_qa_pairs/train/manifest.json"))
  assert manifest["pipeline"] == "beam" and manifest["num_shards"] == 4
  assert manifest["feature_lengths"] == {"inputs": 32, "targets": 32}
  # WikiQA train's answer rows (label 1), as test_tasks counts them, less duplicates and evaluation texts.
  assert 900 < manifest["num_examples"] <= manifest["stats"]["rows_in"] < 1100

  # 1. Stage 1, uninterrupted: the reference.
  ref = gcs.url("ref_stage1")
  log = _run(env, "rehearsal/stage1.gin", ref, qa)
  assert "[worker 0]" in log and "[worker 1]" in log
  summary = json.loads(paths.read_text(f"{ref}/results.json"))
  assert summary["mesh"] == {"data": 4, "fsdp": 2, "model": 1}
  rows = [json.loads(l) for l in paths.read_text(f"{ref}/metrics.jsonl").splitlines()]
  evals = {r["step"]: r["eval/stsb_dev_spearman"] for r in rows if "eval/stsb_dev_spearman" in r}
  assert sorted(evals) == [0, 10, STAGE1_STEPS]  # before, periodic, after: STS-B dev read from gs://
  assert all(np.isfinite(v) for v in evals.values())
  # Early stopping on 2 processes keeps the best of the evaluations after training began (ties: the first).
  best_step = max((10, STAGE1_STEPS), key=lambda s: (evals[s], -s))
  assert summary["early_stopping"]["best_step"] == best_step
  assert native.committed_steps(f"{ref}/best") == [best_step]
  assert paths.exists(f"{ref}/tensorboard")
  assert f"DataConfig.cache_dir = '{cache_url}'" in paths.read_text(f"{ref}/operative_config.gin")

  # 2. The same run, SIGTERM'd mid-run (the launcher forwards it to both workers), then rerun.
  stage1 = gcs.url("stage1")
  proc = _launch(env, "rehearsal/stage1.gin", stage1, qa)
  out = _Output(proc)
  out.wait_for(f"step 6/{STAGE1_STEPS}:", proc)
  proc.send_signal(signal.SIGTERM)  # to the launcher, which forwards it to both workers
  proc.wait(timeout=300)
  out._thread.join(timeout=10)
  assert proc.returncode == 143, out.text()[-6000:]
  assert out.text().count("Rerun the same command to resume") == 2  # both workers stopped cleanly
  stopped_at = native.load_params(stage1)[2]
  assert 6 <= stopped_at < STAGE1_STEPS
  _run(env, "rehearsal/stage1.gin", stage1, qa)
  (s_ref, p_ref), (s_res, p_res) = _params(ref), _params(stage1)
  assert s_ref == s_res == STAGE1_STEPS
  assert p_ref.keys() == p_res.keys()
  for k in p_ref:
    np.testing.assert_array_equal(p_res[k], p_ref[k], err_msg=k)
  # The best kept across the SIGTERM: the same step, the same parameters, the same summary.
  resumed = json.loads(paths.read_text(f"{stage1}/results.json"))["early_stopping"]
  assert resumed == summary["early_stopping"]
  (b_ref, pb_ref), (b_res, pb_res) = _params(f"{ref}/best"), _params(f"{stage1}/best")
  assert b_ref == b_res == best_step
  for k in pb_ref:
    np.testing.assert_array_equal(pb_res[k], pb_ref[k], err_msg=k)

  # 3. Stage 2 from the stage-1 work dir on gs://, on the user's seqio tasks mixed with gs:// triples.
  user = tmp_path / "user"
  user.mkdir()
  # The TSV: the "test" rows of the derived triples; the TFDS dataset's train split: the "dev" rows.
  with open(data_dir / "nli" / "snli_devtest_triples_derived.csv", newline="", encoding="utf-8") as f:
    triples = [(r["sent0"], r["sent1"], r["hard_neg"]) for r in csv.DictReader(f) if r["split"] == "test"]
  assert len(triples) > 1000
  (user / "triples.tsv").write_text("".join("\t".join(t) + "\n" for t in triples), encoding="utf-8")
  report = prepare.prepare(out_dir=str(tmp_path / "prepared"), source_dir=str(data_dir),
                           datasets=["snli_triples_derived"], offline=True, progress=False, tfds=True)
  assert report.ok and report.tfds, report.summary()
  (user / "acc_user_tasks.py").write_text(USER_MODULE.format(
      tsv=str(user / "triples.tsv"), tfds_dir=str(tmp_path / "prepared" / "tfds")))
  gin = user / "stage2.gin"
  gin.write_text(textwrap.dedent(USER_GIN.format(steps=STAGE2_STEPS)))
  env2 = dict(env, PYTHONPATH=os.pathsep.join([str(user), str(REPO), os.environ.get("PYTHONPATH", "")]))
  # The user's module reaches the workers as a slice's would: through a variable the launcher is told
  # to forward (tests/test_launch_env.py: nothing else of this environment reaches them).
  init = ("--env", "PYTHONPATH", f"--gin.run.init_from='{stage1}'")

  # The reference: uninterrupted.
  ref2 = gcs.url("ref_stage2")
  log = _run(env2, str(gin), ref2, *init, nli)
  assert "[worker 0]" in log and "[worker 1]" in log
  # SIGTERM to the launcher mid-run (forwarded to both workers), then the same command again.
  stage2 = gcs.url("stage2")
  proc = _launch(env2, str(gin), stage2, *init, nli)
  out = _Output(proc)
  out.wait_for(f"step 6/{STAGE2_STEPS}:", proc)
  proc.send_signal(signal.SIGTERM)
  proc.wait(timeout=300)
  out._thread.join(timeout=10)
  assert proc.returncode == 143, out.text()[-6000:]
  assert out.text().count("Rerun the same command to resume") == 2
  stopped = native.load_params(stage2)[2]
  assert 6 <= stopped < STAGE2_STEPS and stopped != 10, stopped  # resumes from the preemption checkpoint
  state = _data_state(stage2, stopped)
  # Both processes' shard positions, gathered into the one JSON the primary host writes.
  assert set(state["cursors"]) == {"0", "1"} and state["num_readers"] == 2
  assert state["streams"] == {"acc_nli_tsv": "seqio", "acc_nli_tfds": "seqio", "st5_user_nli_triples": "numpy"}, state
  # With dedup on, batches are made in windows of DEDUP_WINDOW steps; a state saved inside a
  # window holds the window's start positions and replays to `step` on resume (no batch is
  # repeated or skipped: the equality of the parameters below proves it).
  assert state["step"] == stopped and state["dedup_window"] == DEDUP_WINDOW
  assert state["block_start_step"] == stopped - stopped % DEDUP_WINDOW, state
  assert sum(state["positions"].values()) == state["block_start_step"] * 16  # 16 rows per process and step
  _run(env2, str(gin), stage2, *init, nli)
  (s_ref2, p_ref2), (s_res2, p2) = _params(ref2), _params(stage2)
  assert s_ref2 == s_res2 == STAGE2_STEPS
  assert p_ref2.keys() == p2.keys()
  for k in p_ref2:
    np.testing.assert_array_equal(p2[k], p_ref2[k], err_msg=k)
  summary2 = json.loads(paths.read_text(f"{stage2}/results.json"))
  assert summary2["init_from"] == stage1 and summary2["last_step"] == STAGE2_STEPS
  assert summary2["mesh"] == {"data": 4, "fsdp": 2, "model": 1}
  assert not np.array_equal(p2["projection_layer/kernel"], pb_res["projection_layer/kernel"])
  # Initialised from stage 1's best (`init_from` of a work dir with one): the token table of a tiny
  # 20-step run stays close to it.
  assert np.corrcoef(p2["token_embedder/embedding"].ravel(), pb_res["token_embedder/embedding"].ravel())[0, 1] > 0.9
  # 3b. The slice shrinks: stage 2 goes on for 4 more steps on 1 host (the same 8 devices and mesh, one
  # process): orbax restores onto the new process layout, and the data state saved by 2 readers resumes
  # elastically on 1 (the 2 readers' unread rest of their epochs first; tests/test_data_elastic.py counts it).
  log = _run(dict(env2, ST5_LOCAL_POD_DEVICES="8"), str(gin), stage2, *init, nli,
             f"--gin.TrainConfig.num_train_steps={STAGE2_STEPS + 4}", "--allow_config_change", hosts=1)
  assert "[worker 1]" not in log and f"step {STAGE2_STEPS + 4}/{STAGE2_STEPS + 4}" in log, log[-3000:]
  shrunk = _data_state(stage2, STAGE2_STEPS + 4)
  assert shrunk["num_readers"] == 1 and set(shrunk["cursors"]) == {"0"}
  assert {r["from_readers"] for r in shrunk["elastic"].values()} == {2}, shrunk.get("elastic")
  change = json.loads(paths.read_text(f"{stage2}/config_history.json"))["changes"][-1]
  assert change["step"] == STAGE2_STEPS and change["allowed_by"] == "--allow_config_change", change
  assert [c["binding"] for c in change["bindings"]] == ["TrainConfig.num_train_steps"], change

  # 4. Evaluation and export read gs://.../stage2 and write to gs://.
  st5 = [sys.executable, "-m", "st5_jax.cli"]
  sub_env = dict(env, JAX_PLATFORMS="cpu")
  subprocess.run([*st5, "eval", "--model", stage2, "--tasks", "stsb", "--output", gcs.url("eval", "stage2.json")],
                 env=sub_env, check=True, capture_output=True, timeout=600)
  result = json.loads(paths.read_text(gcs.url("eval", "stage2.json")))
  assert np.isfinite(result["models"]["stage2"]["tasks"]["STSBenchmark"]["main"])
  assert paths.exists(gcs.url("eval", "stage2.md"))
  sm = gcs.url("export", "sm")
  subprocess.run([*st5, "export", "--model", stage2, "--format", "savedmodel", "--out", sm],
                 env=sub_env, check=True, capture_output=True, timeout=600)
  assert paths.is_file(f"{sm}/saved_model.pb") and paths.is_file(f"{sm}/README.md")

  # 5. The SavedModel from gs:// encodes like the work dir on gs://.
  from st5_jax import SentenceEncoder
  texts = ["A man is playing a guitar.", "Two dogs run on the beach.", "", "x " * 200]
  got = SentenceEncoder.load(sm).encode(texts)
  want = SentenceEncoder.load(stage2, dtype="float32").encode(texts)
  np.testing.assert_allclose(got, want, atol=1e-5)
