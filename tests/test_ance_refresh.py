"""ANCE-style refresh (st5_jax/retrieval/refresh.py): negatives mined again from the parameters in training.

The mined rows equal a NumPy re-derivation (exact search, each filter at a non-default setting) from the same
parameters' embeddings; a run killed after a refresh (stopped, and crashed between a generation's file and the
checkpoint that records it) and rerun ends bit-identical to an uninterrupted one, in one and in two processes;
the generation in a checkpoint's hook state is the one the stream reads after resume; mode="checkpoint" picks
up a generation `st5 data mine` wrote from the work dir's latest checkpoint.
"""

import dataclasses
import hashlib
import json
import os
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

import ance_multihost_worker as worker
from xla_env import xla_flags
from st5_jax import hooks, partitioning, paths, train
from st5_jax import vocab as vocab_lib
from st5_jax.checkpoints import native, tree
from st5_jax.data import overlap
from st5_jax.data.offline import mine as mine_lib
from st5_jax.evaluation import in_training
from st5_jax.features import LEFT, negative_features
from st5_jax.retrieval import refresh

GEN = "negatives_refresh_gen{:05d}"
GEN0 = "st5_user_hard_negatives"  # the run's own data: generation 0


@pytest.fixture(scope="module")
def root(tmp_path_factory):
  root = tmp_path_factory.mktemp("ance")
  worker.write_inputs(root)
  return root


def _rows(path):
  return [json.loads(line) for line in open(path, encoding="utf-8")]


def _params(workdir):
  _, params, step = native.load_params(workdir)
  return step, {k: np.asarray(v) for k, v in tree.flatten(params).items()}


def _assert_same_params(a_dir, b_dir):
  (sa, a), (sb, b) = _params(a_dir), _params(b_dir)
  assert sa == sb == worker.STEPS and a.keys() == b.keys()
  for k in a:
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def _losses(workdir):
  """{step: loss}, the last row of each step (a crashed invocation may have logged a step the rerun redid)."""
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  return {r["step"]: r["train/loss"] for r in rows if "train/loss" in r}


def _numpy_mine(q_QxD, d_NxD, outside_PxD, outside, pairs, corpus, config):
  """rows and counts of mine.py's selection, written out: float64 dot products, rank by (score, lower index),
  the filters in their order, the first `mined` survivors."""
  s_QxN = q_QxD.astype(np.float64) @ d_NxD.astype(np.float64).T
  where = {t: i for i, t in reversed(list(enumerate(corpus.texts)))}
  reasons = dict.fromkeys(mine_lib.REASONS, 0)
  rows, gaps = [], []
  for q, (query, pos) in enumerate(zip(pairs.queries, pairs.positives)):
    ranked = np.lexsort((np.arange(len(corpus.texts)), -s_QxN[q]))[:config.range_max]
    gaps.append(np.min(-np.diff(s_QxN[q, ranked])))
    pos_P = [s_QxN[q, where[p]] if p in where else float(outside_PxD[outside.index(p)] @ q_QxD[q]) for p in pos]
    floor = min(pos_P)
    kept = []
    for rank, i in enumerate(ranked):
      text, score = corpus.texts[i], s_QxN[q, i]
      reason = ("range_min" if rank < config.range_min else "positive" if text in pos else
                "equal_to_positive" if overlap.normalize(text) in {overlap.normalize(p) for p in pos} else
                "margin" if score > floor - config.margin else
                "relative_margin" if score > floor - abs(floor) * config.relative_margin else None)
      if reason:
        reasons[reason] += 1
      else:
        kept.append(text)
    rows.append({"query": query, "pos": pos, "neg": kept[:config.mined_per_query]})
  assert min(gaps) > 1e-6  # no near-tie that float32 on the devices could order otherwise
  return rows, reasons


def test_mined_negatives_equal_a_numpy_rederivation_from_the_same_parameters(root, tmp_path, vocab_path):
  spec = worker.parse(root)
  config = refresh.NegativesRefresh(every=2, num_negatives=worker.K, pairs_files=str(root / "pairs.jsonl"),
                                    corpus_files=str(root / "corpus.jsonl"), mined_per_query=4, range_min=1,
                                    range_max=30, margin=0.01, relative_margin=0.05, batch_size=16)
  mesh = partitioning.make_mesh(spec.mesh)
  setup = train.build(spec.model, spec.train_config, mesh)
  with jax.set_mesh(mesh):
    params0 = train.init_state(setup, spec.model, seed=0).params
    params1 = train.init_state(setup, spec.model, seed=1).params
    stream = hooks.Stream(spec.data(mesh, 8, 0), mesh=mesh, global_batch_size=8, seed=0)
    refresher = refresh.Refresher(config, spec.data)
    refresher.start(hooks.RunContext(paths.path(tmp_path), setup, spec.model, vocab_path,
                                     partitioning.DEFAULT_RULES, 100, stream))
    refresher.mine(params0, 2, stream)
    refresher.mine(params1, 4, stream)
    # The same parameters through an encoder of the test's own; search and filters in NumPy.
    encode, keys = train.tower_encode(setup, spec.model, "document")
    encoder = in_training.ShardedEncoder(encode, param_keys=keys, max_length=spec.model.max_length, mesh=mesh,
                                         param_shardings=setup.state_shardings.params,
                                         tokenizer=vocab_lib.Tokenizer(vocab_path), batch_size=16)
    pairs, corpus = mine_lib.read_pairs(str(root / "pairs.jsonl")), mine_lib.files_corpus(str(root / "corpus.jsonl"))
    outside = [p for pos in pairs.positives for p in pos if p not in corpus.texts]
    assert len(outside) == 8
    mined = []
    for g, params in ((1, params0), (2, params1)):
      want, reasons = _numpy_mine(encoder(params, pairs.queries), encoder(params, corpus.texts),
                                  encoder(params, outside), outside, pairs, corpus, config)
      got = _rows(tmp_path / "negatives" / f"gen-{g:05d}.jsonl")
      assert got == want, g
      meta = json.loads((tmp_path / "negatives" / f"gen-{g:05d}.json").read_text())
      assert meta["counts"]["filtered"] == reasons and all(reasons.values()), reasons  # every filter at work
      assert meta["sha256"] == hashlib.sha256((tmp_path / "negatives" / f"gen-{g:05d}.jsonl").read_bytes()).hexdigest()
      mined.append(got)
    assert mined[0] != mined[1]  # the parameters decide the negatives
    # The stream now reads generation 2: each example's K negatives are of its query's row there.
    assert stream.iterator.name == GEN.format(2) and refresher.state["generation"] == 2
    tokenizer = vocab_lib.Tokenizer(vocab_path)
    negs = {r["query"]: set(r["neg"]) for r in mined[1]}
    batch = {k: np.asarray(v) for k, v in next(stream).items()}
    for b in range(8):
      query = tokenizer.decode(batch[LEFT][b])
      got = {tokenizer.decode(batch[model_key][b]) for _, model_key in negative_features(worker.K)}
      assert got <= negs[query] and got, (query, got)
    # A refresh whose K is not the run's data's: one clear error at its first switch.
    bad = refresh.Refresher(dataclasses.replace(config, num_negatives=2), spec.data)
    bad.start(refresher.context)
    with pytest.raises(ValueError, match=r"bind NegativesRefresh.num_negatives \(2\) to the K of the run's data"):
      bad.mine(params0, 6, stream)
  assert set(refresher.costs[0]) >= {"encode_corpus", "encode_queries", "search", "select", "write", "switch"}


def _gens(workdir):
  return {p.name: p.read_bytes() for p in (workdir / "negatives").glob("gen-*.jsonl")}


def test_killed_after_a_refresh_and_rerun_is_bit_identical_in_one_process(root, tmp_path):
  # Killed at step 4 after its refresh wrote generation 2, before any checkpoint recorded it: the last
  # checkpoint (step 3) reads generation 1, one batch into it.
  full, refresher, rows = worker.run(root, tmp_path / "full",
                                     hooks_after=[worker.Snapshot(tmp_path / "full", tmp_path / "killed", 4).hook()])
  assert full.step == worker.STEPS and refresher.generation == 3
  # The generation each step reads: 0 (the run's BM25 data), then a new one after the refreshes at 2, 4 and 6.
  assert [(s, task) for s, task, _ in rows] == [(1, GEN0), (2, GEN0), (3, GEN.format(1)), (4, GEN.format(1)),
                                                 (5, GEN.format(2)), (6, GEN.format(2)), (7, GEN.format(3)),
                                                 (8, GEN.format(3))]
  killed = tmp_path / "killed"
  assert sorted(p.name for p in (killed / "checkpoints").iterdir()) == ["3"]
  assert sorted(_gens(killed)) == ["gen-00001.jsonl", "gen-00002.jsonl"]
  meta = json.loads((killed / "checkpoints" / "3" / "meta" / "metadata").read_text())
  assert meta["hooks"]["negatives_refresh"]["generation"] == 1
  assert meta["data_state"]["task"] == GEN.format(1)  # the data position names its generation

  again, resumed, rows_again = worker.run(root, killed)
  assert resumed.restored["generation"] == 1 and again.step == worker.STEPS
  assert rows_again[0][:2] == [4, GEN.format(1)]  # the checkpoint's generation, from its file, at its position
  assert rows_again == rows[3:]  # the same batches from then on (this process's fingerprints)
  assert _losses(killed) == {s: v for s, v in _losses(tmp_path / "full").items() if s > 3}
  _assert_same_params(tmp_path / "full", killed)
  assert _gens(killed) == _gens(tmp_path / "full")  # generation 2 mined again from the same parameters: same bytes
  gens = _gens(killed)
  assert len(set(gens.values())) == 3  # each refresh changed the negatives

  # A generation's file that changed after its checkpoint is refused on resume, never silently read.
  with open(killed / "negatives" / "gen-00003.jsonl", "a", encoding="utf-8") as f:
    f.write(json.dumps({"query": "q", "pos": ["p"], "neg": ["n"]}) + "\n")
  with pytest.raises(ValueError, match="negatives generation 3 from .*gen-00003.jsonl, which is changed"):
    worker.run(root, killed)


def _free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def test_killed_after_a_refresh_and_rerun_is_bit_identical_in_two_processes(root, tmp_path):
  port = _free_port()
  out_json = tmp_path / "out.json"
  procs = [subprocess.Popen([sys.executable, worker.__file__, str(root), str(out_json)],
                            env=dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=xla_flags(2),
                                     JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES="2",
                                     JAX_PROCESS_ID=str(i)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE) for i in range(2)]
  for p in procs:
    _, err = p.communicate(timeout=600)
    assert p.returncode == 0, err.decode()[-4000:]
  out = json.loads(out_json.read_text())
  assert (out["processes"], out["devices"], out["steps"]) == (2, 4, [worker.STEPS, worker.STEPS])
  assert [task for _, task, _ in out["rows"]] == [GEN0] * 2 + [GEN.format(g) for g in (1, 1, 2, 2, 3, 3)]
  killed, full = tmp_path / "killed", tmp_path / "full"
  assert json.loads((killed / "checkpoints" / "3" / "meta" / "metadata").read_text())["hooks"][
      "negatives_refresh"]["generation"] == 1
  # The rerun (`st5 train` again, both processes) resumed on generation 1 and mined 2 and 3 as the full run did.
  assert _losses(killed) == {s: v for s, v in _losses(full).items() if s > 3}
  _assert_same_params(full, killed)
  assert _gens(killed) == _gens(full) and len(_gens(full)) == 3


def test_checkpoint_mode_switches_to_generations_mined_from_the_latest_checkpoint(root, tmp_path):
  wd = tmp_path / "wd"

  def external_miner(info):  # `st5 data mine --model WORKDIR --checkpoint latest`, as another process runs it
    deadline = time.time() + 300
    while not (wd / "checkpoints" / "3").is_dir():  # the step-3 save commits in the background
      assert time.time() < deadline
      time.sleep(0.02)
    pairs = mine_lib.read_pairs(str(root / "pairs.jsonl"))
    mine_lib.mine(pairs, mine_lib.positives_corpus(pairs), str(wd / "negatives" / "gen-00001"),
                  mine_lib.MineConfig(method="dense", num_negatives=4, range_max=12), model=str(wd),
                  checkpoint="latest", devices=jax.local_devices()[:2], batch_size=8)
    (wd / "negatives" / "gen-00002").mkdir()  # a generation still being mined: no manifest.json yet
    (wd / "negatives" / "gen-00002" / "part-00000.jsonl").write_text("")

  bindings = ["NegativesRefresh.mode = 'checkpoint'"]
  first, refresher, rows = worker.run(root, wd, bindings=bindings, stop_after_steps=5,
                                      hooks_before=[hooks.Hook(external_miner, every=4)])
  assert first.step == 5 and refresher.generation == 1 and refresher.state["identity"]
  assert [task for _, task, _ in rows] == [GEN0] * 4 + [GEN.format(1)]  # nothing finished at step 2; gen 1 at 4
  assert json.loads((wd / "negatives" / "gen-00001" / "manifest.json").read_text())["scorer"]["method"] == "dense"
  last, again, rows_again = worker.run(root, wd, bindings=bindings)
  assert again.restored == refresher.state and last.step == worker.STEPS
  assert [task for _, task, _ in rows_again] == [GEN.format(1)] * 3  # gen 2 never finished
  assert again.state == refresher.state  # and gen 1 was not switched to again (from its start) at step 6
  assert not list((wd / "negatives").glob("gen-*.jsonl"))  # this mode mines nothing itself

  (wd / "negatives" / "gen-00001" / "manifest.json").unlink()
  with pytest.raises(ValueError, match="generation 1 from .*gen-00001, whose manifest.json is missing"):
    worker.run(root, wd, bindings=bindings)


def test_the_demo_gin_file_and_bad_settings():
  from st5_jax import gin_config  # pylint: disable=g-import-not-at-top

  gin_config.parse_gin(["ance_tiny_cpu.gin"], [])
  spec = gin_config.run_spec()
  r = spec.negatives_refresh
  assert (r.every, r.num_negatives, r.pairs_task, r.mode) == (100, 3, "st5_stage1_public_qa", "sync")
  assert spec.train_config.objective.num_negatives == r.num_negatives == 3
  assert spec.data.task == "st5_user_hard_negatives"  # generation 0: BM25 negatives from `st5 data mine`
  hook = r.hook(spec.data)
  assert (hook.name, hook.every) == ("negatives_refresh", (100,)) and hook.start is not None

  one = dict(every=2, num_negatives=3, pairs_task="t")
  for bad, match in [(dict(one, every=0), "every must be >= 1"),
                     (dict(one, pairs_files="p.jsonl"), "pairs_task .* or pairs_files .*, one of them"),
                     (dict(one, pairs_task=None), "pairs_task .* or pairs_files .*, one of them"),
                     (dict(one, mode="async"), "mode must be one of sync, checkpoint"),
                     (dict(one, num_negatives=0), r"hard negatives per example must be in 1\.\.64"),
                     (dict(one, range_max=2), r"ranks \[range_min, range_max\) = \[0, 2\) hold fewer"),
                     (dict(one, name="a-b"), "name must be a Python identifier")]:
    with pytest.raises(ValueError, match=match):
      refresh.NegativesRefresh(**bad)
  with pytest.raises(TypeError, match="with the run's DataConfig"):
    refresh.NegativesRefresh(**one).hook(lambda mesh, b, seed: None)
