"""The Beam cache pipeline (st5_jax.data.offline.beam_cache) on Beam's DirectRunner: the in-memory writer's files,
byte for byte."""

import collections
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
  """Users' files on local disk (whole) or gs:// (the emulator; in 32-byte ranges), cache written to the same place."""
  local = str(tmp_path / "corpus")
  eval_text = _eval_sentence(data_dir)
  kept = _users_corpus(local, eval_text)
  root = gcs.upload(local, "users", f"corpus-{os.getpid()}") if where == "gs" else local
  out = gcs.url("caches", f"c-{os.getpid()}") if where == "gs" else str(tmp_path / "out")
  registry.register_user_task("test_beam_users", file_pattern=f"{root}/part-*.jsonl",
                              columns={"inputs": "q", "targets": "a"})
  lengths = {"inputs": 6, "targets": 8}
  m = beam_cache.write_cache_beam("test_beam_users", "train", paths.join(out, "beam"), 3, lengths,
                                  pipeline_args=DIRECT, split_bytes=32 if where == "gs" else beam_cache.SPLIT_BYTES)
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


def _beam_with_counters(task, out, num_shards, lengths, **kw):
  """write_cache_beam's steps, keeping the pipeline's result: (manifest, Beam counters, plan)."""
  import apache_beam as beam  # pylint: disable=g-import-not-at-top
  from apache_beam.options.pipeline_options import PipelineOptions  # pylint: disable=g-import-not-at-top
  plan = beam_cache.plan_cache(task, "train", out, num_shards, lengths, **kw)
  with beam_cache.side_files(plan):
    p = beam.Pipeline(options=PipelineOptions(list(DIRECT)))
    beam_cache.build_pipeline(p, plan)
    result = p.run()
    result.wait_until_finish()
  assert sorted(os.listdir(out)) == [cache.MANIFEST] + [cache.shard_name(i, num_shards) for i in range(num_shards)]
  return cache.CacheReader(out).manifest, beam_cache.counters(result), plan


def _ranges_corpus(folder, eval_texts):
  """Three JSON-lines files: 130 evaluation texts (one set), 121 duplicates, three bad rows, a long row.

  Returns the contaminated and the duplicate rows' texts in source order.
  """
  parts = [[], [], []]
  contaminated, duplicates = [], []
  for i in range(65):
    parts[0] += [{"q": f"question {i}", "a": f"answer {i}"}, {"q": eval_texts[i], "a": f"x {i}"}]
    contaminated.append([eval_texts[i], f"x {i}"])
  parts[0][10:10] = ["{not json", "", '["not", "an object"]']
  parts[0].append({"q": "a long row " * 20, "a": "longer than many byte ranges"})
  seen = set()
  for j in range(130):
    parts[1].append({"q": f"Dup {j % 10}!", "a": "same"})
    if j % 10 in seen:
      duplicates.append([f"Dup {j % 10}!", "same"])
    seen.add(j % 10)
  for i in range(65, 130):
    parts[2].append({"q": f"free {i}", "a": eval_texts[i]})
    contaminated.append([f"free {i}", eval_texts[i]])
  parts[2].append({"q": "QUESTION 3", "a": "answer 3."})  # a duplicate of part 0's row by its normalised text
  duplicates.append(["QUESTION 3", "answer 3."])
  paths.mkdir(folder)
  for k, part in enumerate(parts):
    lines = [r if isinstance(r, str) else json.dumps(r) for r in part]
    paths.write_text(paths.join(folder, f"part-{k}.jsonl"), "\n".join(lines) + "\n")
  return contaminated, duplicates


def test_beam_cache_in_byte_ranges_is_the_in_memory_cache_with_counters_and_bounded_samples(data_dir, tmp_path):
  """Files read in 40-byte ranges (rows straddle them, one row spans many): the in-memory writer's shards and
  manifest; Beam's counters equal the manifest's counts; the manifest keeps the first 100 dropped texts per reason
  of 130 contaminated and 121 duplicates."""
  from st5_jax.data import overlap  # pylint: disable=g-import-not-at-top
  index = overlap.evaluation_index(str(data_dir))
  biggest = collections.Counter(index.values()).most_common(1)[0][0]
  eval_texts = sorted(t for t, name in index.items() if name == biggest and len(t) < 40)[:130]
  local = str(tmp_path / "corpus")
  contaminated, duplicates = _ranges_corpus(local, eval_texts)
  registry.register_user_task("test_beam_ranges", file_pattern=f"{local}/part-*.jsonl",
                              columns={"inputs": "q", "targets": "a"})
  lengths = {"inputs": 16, "targets": 16}
  beam_dir, mem_dir = str(tmp_path / "beam"), str(tmp_path / "mem")
  m, counters, plan = _beam_with_counters("test_beam_ranges", beam_dir, 3, lengths, split_bytes=40)
  sizes = [os.path.getsize(os.path.join(local, f"part-{k}.jsonl")) for k in range(3)]
  assert [kind for _, kind, _, _ in plan.units] == ["range"] * sum(-(-size // 40) for size in sizes)
  cache_writer.write_cache("test_beam_ranges", "train", mem_dir, 3, lengths)
  # Independent counts: 134 + 130 + 66 lines, 3 bad, 130 contaminated, 121 duplicates; kept 65 questions, the long
  # row (trimmed) and 10 of the duplicated rows.
  s = m["stats"]
  assert (s["source_rows_read"], s["source_rows_skipped"], s["rows_in"]) == (330, 3, 327)
  assert (s["dropped_contaminated"], s["dropped_duplicates"], m["num_examples"], s["trimmed"]) == (130, 121, 76, 1)
  assert counters == {"rows_in": s["rows_in"], "rows_read": s["source_rows_read"],
                      "rows_skipped": s["source_rows_skipped"], "rows_filtered": s["source_rows_filtered"],
                      "dropped_contaminated": s["dropped_contaminated"], "dropped_duplicates": s["dropped_duplicates"],
                      "trimmed": s["trimmed"], "examples": m["num_examples"]}
  reason = f"text in evaluation set {biggest}"
  assert s["dropped_samples"] == {reason: contaminated[:100], "duplicate": duplicates[:100]}
  _same_cache(mem_dir, beam_dir)  # byte for byte the in-memory writer's cache, samples included


def test_st5_data_cache_derives_num_shards_and_refuses_shards_too_big_for_a_worker(data_dir, tmp_path, capsys):
  """No --num_shards: ceil(9 input rows / 3 a shard) = 3, rounded up to a multiple of 2 readers: 4, in memory and
  with Beam alike; a worker too small for one shard is a one-line refusal before anything is written."""
  local = str(tmp_path / "corpus")
  _users_corpus(local, _eval_sentence(data_dir))
  registry.register_user_task("test_beam_sizing", file_pattern=f"{local}/part-*.jsonl",
                              columns={"inputs": "q", "targets": "a"})
  flags = ["--task", "test_beam_sizing", "--records_per_shard", "3", "--num_readers", "2", "--no_decontaminate",
           "--feature_lengths", "inputs=8,targets=8"]
  out = {k: str(tmp_path / k) for k in ("mem", "beam", "refused")}
  assert cli.main(["data", "cache", "--out", out["mem"], *flags]) == 0
  assert cli.main(["data", "cache", "--out", out["beam"], *flags, "--runner", "DirectRunner", "--range_mb", "1"]) == 0
  err = capsys.readouterr().err
  assert err.count("9 input rows (counted) -> 4 shards (derived from --records_per_shard 3 and --num_readers 2)") == 2
  assert "note: --num_readers" not in err
  mem, beam = (cache.task_dir(out[k], "test_beam_sizing", "train") for k in ("mem", "beam"))
  assert json.loads(open(os.path.join(beam, cache.MANIFEST)).read())["num_shards"] == 4
  _same_cache(mem, beam)
  rc = cli.main(["data", "cache", "--out", out["refused"], *flags, "--runner", "DirectRunner", "--num_shards", "1",
                 "--worker_memory_gb", "0.000001"])
  assert rc == 2
  err = [l for l in capsys.readouterr().err.splitlines() if l.startswith("st5 data cache: error: ")]
  assert len(err) == 1 and "1 shards of up to 9 records" in err[0] and "use at least 10 shards" in err[0], err
  assert not os.path.exists(out["refused"])
  # Without --num_readers the shards are sized for one reader, and the command says so (not with it, above).
  assert cli.main(["data", "cache", "--out", str(tmp_path / "one"), *flags[:4], *flags[6:]]) == 0
  err = capsys.readouterr().err
  assert "9 input rows (counted) -> 3 shards (derived from --records_per_shard 3 and --num_readers 1)" in err
  assert err.count("note: --num_readers not given") == 1 and "pass --num_readers R" in err


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
