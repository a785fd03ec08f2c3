"""The Beam cache pipeline (st5_jax.data.offline.beam_cache) on Beam's DirectRunner: the in-memory writer's files,
byte for byte."""

import json
import os

import numpy as np
import pytest
import seqio

from xla_env import xla_flags
from st5_jax import cli, paths
from st5_jax.data import cache, registry, tasks
from st5_jax.data.offline import beam_cache, cache_writer
from st5_jax.data.iterator import make_local_iterator
from st5_jax.evaluation import harness

PUBLIC = tasks.STAGE2_SNLI_TRIPLES
DIRECT = ("--runner=DirectRunner",)


def _files(folder):
  return {p.name: paths.read_bytes(paths.join(folder, p.name)) for p in paths.path(folder).iterdir()}


def _same_cache(a, b):
  """Same shard bytes, same manifest but for the `pipeline` field."""
  fa, fb = _files(a), _files(b)
  assert sorted(fa) == sorted(fb)
  ma, mb = json.loads(fa.pop(cache.MANIFEST)), json.loads(fb.pop(cache.MANIFEST))
  assert (ma.pop("pipeline"), mb.pop("pipeline")) == ("numpy", "beam")
  assert ma == mb
  for name in fa:
    assert fa[name] == fb[name], name
  return ma


def test_beam_cache_of_a_public_task_is_the_in_memory_cache(data_dir, tmp_path):
  """A few thousand rows (SNLI triples, validation): filters, decontamination, trimming, dedup, shards."""
  lengths = {"inputs": 24, "targets": 16}
  mem = cache_writer.write_cache(PUBLIC, "validation", str(tmp_path / "mem"), 3, lengths)
  beam = beam_cache.write_cache_beam(PUBLIC, "validation", str(tmp_path / "beam"), 3, lengths, pipeline_args=DIRECT)
  m = _same_cache(str(tmp_path / "mem"), str(tmp_path / "beam"))
  assert beam["num_examples"] == mem["num_examples"] == m["num_examples"] > 2000
  assert m["stats"]["source_rows_read"] > 6000 and m["stats"]["trimmed"] > 0
  assert m["stats"]["dropped_contaminated"] > 0
  # And it trains the same rows as the task's own NumPy path (test_data_cache pins the in-memory writer to it).
  ref = next(make_local_iterator(task=PUBLIC, split="validation", feature_lengths=lengths,
                                 batch_size=m["num_examples"], shuffle=False, repeat=False))
  reader = cache.CacheReader(str(tmp_path / "beam"))
  got = sum(1 for i in range(reader.num_shards) for _ in reader.iter_shard(i))
  assert got == len(ref["left_encoder_input_tokens"])


def _eval_sentence(data_dir):
  texts, _ = harness.TASKS["STSBenchmark"].build(str(data_dir))
  return sorted(texts)[7]


def _users_corpus(folder, eval_text):
  """Three JSONL files: duplicates within and across files (by normalised text), two evaluation texts, a bad row."""
  rows = [
      [{"q": "Alpha one", "a": "beta one"}, {"q": "Alpha two", "a": "beta two"}, {"q": eval_text, "a": "gamma"},
       "{not json"],
      [{"q": "ALPHA ONE!", "a": "Beta one."}, {"q": "delta", "a": "epsilon"}],
      [{"q": "delta", "a": "epsilon"}, {"q": "zeta", "a": eval_text.upper()}, {"q": "Alpha  two", "a": "beta-two"}],
  ]
  paths.mkdir(folder)
  for i, part in enumerate(rows):
    lines = [r if isinstance(r, str) else json.dumps(r) for r in part]
    paths.write_text(paths.join(folder, f"part-{i}.jsonl"), "\n".join(lines) + "\n")
  # Kept: the first copy in file order, then row order.
  return [("Alpha one", "beta one"), ("Alpha two", "beta two"), ("delta", "epsilon")]


@pytest.mark.parametrize("where", ["local", "gs"])
def test_beam_cache_of_users_files_keeps_the_first_copy_and_drops_evaluation_texts(data_dir, tmp_path, gcs, where):
  """Users' files on local disk or gs:// (the emulator), cache written to the same place."""
  local = str(tmp_path / "corpus")
  eval_text = _eval_sentence(data_dir)
  kept = _users_corpus(local, eval_text)
  root = gcs.upload(local, "users", f"corpus-{os.getpid()}") if where == "gs" else local
  out = gcs.url("caches", f"c-{os.getpid()}") if where == "gs" else str(tmp_path / "out")
  registry.register_user_task("test_beam_users", file_pattern=f"{root}/part-*.jsonl",
                              columns={"inputs": "q", "targets": "a"})
  lengths = {"inputs": 6, "targets": 8}
  m = beam_cache.write_cache_beam("test_beam_users", "train", paths.join(out, "beam"), 3, lengths,
                                  pipeline_args=DIRECT)
  s = m["stats"]
  assert (s["source_rows_read"], s["source_rows_skipped"], s["rows_in"]) == (9, 1, 8)
  assert (s["dropped_contaminated"], s["dropped_duplicates"], m["num_examples"]) == (2, 3, 3)
  assert m["decontaminated"] is True
  vocab = tasks.get_vocabulary()
  reader = cache.CacheReader(paths.join(out, "beam"))
  from tensorflow.core.example import example_pb2  # pylint: disable=g-import-not-at-top
  got = set()
  for i in range(reader.num_shards):
    for record in reader.iter_shard(i):
      f = example_pb2.Example.FromString(record).features.feature
      ids = {k: list(f[k].int64_list.value) for k in ("inputs", "targets")}
      assert all(v[-1] == vocab.eos_id and len(v) <= lengths[k] for k, v in ids.items())
      got.add(tuple(vocab.decode(v[:-1]) for v in ids.values()))
  assert got == set(kept)
  cache_writer.write_cache("test_beam_users", "train", paths.join(out, "mem"), 3, lengths)
  if where == "local":
    _same_cache(paths.join(out, "mem"), paths.join(out, "beam"))


def test_beam_cache_settings_off_match_the_in_memory_writer(data_dir, tmp_path):
  """keep duplicates + no decontamination, one shard, another length: still byte-identical, and nothing dropped."""
  local = str(tmp_path / "corpus")
  _users_corpus(local, _eval_sentence(data_dir))
  registry.register_user_task("test_beam_users_off", file_pattern=f"{local}/part-*.jsonl",
                              columns={"inputs": "q", "targets": "a"})
  kw = dict(dedup=False, decontaminate=False)
  cache_writer.write_cache("test_beam_users_off", "train", str(tmp_path / "mem"), 1, {"inputs": 4, "targets": 4}, **kw)
  m = beam_cache.write_cache_beam("test_beam_users_off", "train", str(tmp_path / "beam"), 1,
                                  {"inputs": 4, "targets": 4}, pipeline_args=DIRECT, **kw)
  assert m["num_examples"] == 8 and m["stats"]["dropped_duplicates"] == 0 and m["decontaminated"] is None
  _same_cache(str(tmp_path / "mem"), str(tmp_path / "beam"))


def test_st5_data_cache_runner_flag_runs_beam_and_rejects_stray_flags(data_dir, tmp_path, capsys):
  local = str(tmp_path / "corpus")
  _users_corpus(local, _eval_sentence(data_dir))
  registry.register_user_task("test_beam_cli", file_pattern=f"{local}/part-*.jsonl",
                              columns={"inputs": "q", "targets": "a"})
  out = str(tmp_path / "cache")
  # A rewrite with fewer shards leaves no shard of the old one behind.
  assert cli.main(["data", "cache", "--task", "test_beam_cli", "--out", out, "--num_shards", "4"]) == 0
  rc = cli.main(["data", "cache", "--task", "test_beam_cli", "--out", out, "--num_shards", "2",
                 "--feature_lengths", "inputs=8,targets=8", "--runner", "DirectRunner", "--direct_num_workers=1"])
  assert rc == 0
  folder = cache.task_dir(out, "test_beam_cli", "train")
  assert sorted(os.listdir(folder)) == [cache.MANIFEST, cache.shard_name(0, 2), cache.shard_name(1, 2)]
  assert json.loads(open(os.path.join(folder, cache.MANIFEST)).read())["pipeline"] == "beam"
  assert "3 examples in 2 shards" in capsys.readouterr().out
  rc = cli.main(["data", "cache", "--task", "test_beam_cli", "--out", out, "--project", "p"])
  assert rc == 2
  assert "Beam flags need --runner" in capsys.readouterr().err


def test_beam_cache_refuses_a_task_off_the_numpy_path(tmp_path):
  name = "test_beam_seqio_only"
  vocab = tasks.get_vocabulary()
  seqio.TaskRegistry.remove(name)
  seqio.TaskRegistry.add(
      name, source=seqio.FunctionDataSource(lambda split, shuffle_files: __import__("tensorflow").data.Dataset
                                            .from_tensor_slices({"inputs": ["a"], "targets": ["b"]}), ["train"]),
      preprocessors=[seqio.preprocessors.tokenize, seqio.preprocessors.append_eos],
      output_features={k: seqio.Feature(vocab) for k in ("inputs", "targets")})
  with pytest.raises(cache.CacheError, match="not read by the NumPy path"):
    beam_cache.write_cache_beam(name, "train", str(tmp_path / "c"), 2, {"inputs": 8, "targets": 8},
                                pipeline_args=DIRECT)
  assert not os.path.exists(tmp_path / "c")


TRAIN_GIN = """
include 'runs/base.gin'
run.model = @st5_model()
st5_model.size = 't5_tiny'
st5_model.embedding_dim = 16
st5_model.max_length = 24
st5_model.dtype = 'float32'
TASK_FEATURE_LENGTHS = {{'inputs': 24, 'targets': 16}}
DataConfig.task = '{task}'
DataConfig.split = 'validation'
DataConfig.cache_dir = '{cache}'
TrainConfig.global_batch_size = 16
TrainConfig.num_train_steps = {steps}
TrainConfig.checkpoint_every = 10
TrainConfig.log_every = 1
TrainConfig.eval_every = -1
MeshConfig.data = -1
"""


def test_training_from_a_beam_cache_sigtermed_and_rerun_ends_bit_identical(data_dir, tmp_path):
  """One process (the pod rehearsal does two): SIGTERM mid-run, rerun, same parameters as an uninterrupted run."""
  import signal  # pylint: disable=g-import-not-at-top
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  import time  # pylint: disable=g-import-not-at-top

  from st5_jax.checkpoints import native, tree  # pylint: disable=g-import-not-at-top

  # 8 shards of ~380 rows: 60 steps of 16 cross shard boundaries, and the SIGTERM lands mid-shard.
  beam_cache.write_cache_beam(PUBLIC, "validation", cache.task_dir(str(tmp_path / "c"), PUBLIC, "validation"), 8,
                              {"inputs": 24, "targets": 16}, pipeline_args=DIRECT)
  steps = 60
  gin_file = tmp_path / "run.gin"
  gin_file.write_text(TRAIN_GIN.format(task=PUBLIC, cache=tmp_path / "c", steps=steps))
  env = dict(os.environ, XLA_FLAGS=xla_flags(2), JAX_ENABLE_COMPILATION_CACHE="false")

  def cmd(wd):
    return [sys.executable, "-m", "st5_jax.cli", "train", "--gin_file", str(gin_file), "--workdir", str(wd),
            "--no_progress"]

  subprocess.run(cmd(tmp_path / "straight"), env=env, check=True, capture_output=True, timeout=600)
  wd = tmp_path / "interrupted"
  proc = subprocess.Popen(cmd(wd), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  metrics = wd / "metrics.jsonl"
  deadline = time.time() + 300
  while time.time() < deadline and (not metrics.exists() or len(metrics.read_text().splitlines()) < 13):
    assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
    time.sleep(0.05)
  proc.send_signal(signal.SIGTERM)
  _, err = proc.communicate(timeout=120)
  assert proc.returncode == 143, err.decode()[-3000:]
  stopped_at = native.load_params(wd)[2]
  assert 12 <= stopped_at < steps and stopped_at % 10 != 0  # saved at the stop, not at a checkpoint_every step
  subprocess.run(cmd(wd), env=env, check=True, capture_output=True, timeout=600)
  (_, a, sa), (_, b, sb) = native.load_params(tmp_path / "straight"), native.load_params(wd)
  assert sa == sb == steps
  a, b = tree.flatten(a), tree.flatten(b)
  for k in a:
    np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]), err_msg=k)
