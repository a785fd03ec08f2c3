"""Training prompts (DataConfig.prompts, st5_jax/data/prompts.py): the same token ids on the NumPy, seqio and cache
paths as SentencePiece on prompt + text; the cache's manifest; the model config a run saves; `st5 eval --prompt`."""

import collections
import json
import os

import numpy as np
import pytest
import seqio
import sentencepiece as spm

from st5_jax import cli, train
from st5_jax.configs import ST5Config, t5_size
from st5_jax.data import DataConfigError, cache, prompts, tasks
from st5_jax.data.iterator import make_local_iterator
from st5_jax.data.offline import cache_writer

TASK = tasks.STAGE2_SNLI_TRIPLES  # inputs, targets, negative_targets
SPLIT = "validation"
LENGTHS = {"inputs": 12, "targets": 16}  # short: most rows are truncated
# Sides, and a per-feature override of the document side for the hard negative.
PROMPTS = {"query": "query: ", "document": "passage: ", "negative_targets": "negative: "}
FEATURES = {"left_encoder_input_tokens": ("inputs", 12), "right_encoder_input_tokens": ("targets", 16),
            "right_negative_encoder_input_tokens": ("negative_targets", 16)}


def _batch(prompts_, *, numpy_path=True, cache_dir=None, lengths=LENGTHS, n=None):
  """The whole split, unshuffled, as one batch of NumPy arrays."""
  n = n or sum(1 for _ in seqio.get_mixture_or_task(TASK).source.open(SPLIT).iter_examples())
  it = make_local_iterator(task=TASK, split=SPLIT, feature_lengths=lengths, batch_size=n, shuffle=False,
                           repeat=False, prefetch=0, numpy_path=numpy_path, cache_dir=cache_dir, prompts=prompts_)
  path = it.stats["tasks"][TASK]["path"]
  batch = {k: np.asarray(v) for k, v in next(it).items()}
  it.close()
  return path, batch


def _rows(batch):
  """Multiset of examples (each a tuple of its features' token rows): the cache's order is by key."""
  keys = sorted(FEATURES)
  return collections.Counter(tuple(tuple(batch[k][i].tolist()) for k in keys) for i in range(len(batch[keys[0]])))


def _reference(examples, prompt_of, vocab_path):
  """SentencePiece on prompt + text, cut to length - 1, EOS (1), zero padding: what sentence-transformers feeds."""
  sp = spm.SentencePieceProcessor(model_file=vocab_path)
  out = {}
  for model_key, (feature, length) in FEATURES.items():
    rows = np.zeros((len(examples), length), np.int32)
    for i, ex in enumerate(examples):
      ids = sp.encode(prompt_of[feature] + ex[feature], out_type=int)[:length - 1] + [1]
      rows[i, :len(ids)] = ids
    out[model_key] = rows
  return out


@pytest.fixture(scope="module")
def examples(data_dir):
  return list(seqio.get_mixture_or_task(TASK).source.open(SPLIT).iter_examples())


@pytest.fixture(scope="module")
def prompted_cache(examples, tmp_path_factory):
  root = str(tmp_path_factory.mktemp("prompted_cache"))
  m = cache_writer.write_cache(TASK, SPLIT, cache.task_dir(root, TASK, SPLIT), 2, LENGTHS, dedup=False,
                               prompts=PROMPTS)
  return root, m


def test_numpy_seqio_and_cache_paths_give_sentencepiece_ids_of_prompt_plus_text(examples, prompted_cache, vocab_path):
  prompt_of = {"inputs": "query: ", "targets": "passage: ", "negative_targets": "negative: "}
  want = _reference(examples, prompt_of, vocab_path)
  path, numpy_batch = _batch(PROMPTS)
  assert path == "numpy"
  for k in FEATURES:
    np.testing.assert_array_equal(numpy_batch[k], want[k], err_msg=k)
  # The prompt is really there (and truncation kept its start): every query row starts with "query: "'s ids.
  sp = spm.SentencePieceProcessor(model_file=vocab_path)
  head = sp.encode("query: x", out_type=int)[:2]
  assert (numpy_batch["left_encoder_input_tokens"][:, :2] == head).all()
  path, seqio_batch = _batch(PROMPTS, numpy_path=False)
  assert path == "seqio"
  for k in FEATURES:
    np.testing.assert_array_equal(seqio_batch[k], want[k], err_msg=k)
  root, m = prompted_cache
  assert m["prompts"] == prompt_of
  path, cache_batch = _batch(PROMPTS, cache_dir=root, n=m["num_examples"])
  assert path == "cache"
  assert _rows(cache_batch) == _rows(want)
  # A shorter read of the cache re-truncates (EOS kept) as the source path would.
  short = {"inputs": 6, "targets": 9}
  _, a = _batch(PROMPTS, cache_dir=root, lengths=short, n=m["num_examples"])
  _, b = _batch(PROMPTS, lengths=short)
  assert collections.Counter(map(tuple, a["left_encoder_input_tokens"].tolist())) == collections.Counter(
      map(tuple, b["left_encoder_input_tokens"].tolist()))


def test_a_prompt_longer_than_the_limit_fills_the_row_and_keeps_eos(examples, vocab_path, tmp_path):
  long = "Represent this sentence for searching relevant passages about many different things: "
  sp = spm.SentencePieceProcessor(model_file=vocab_path)
  assert len(sp.encode(long)) > LENGTHS["inputs"]
  spec = {"inputs": long}
  want = _reference(examples, {"inputs": long, "targets": "", "negative_targets": ""}, vocab_path)
  for numpy_path in (True, False):
    _, batch = _batch(spec, numpy_path=numpy_path)
    for k in FEATURES:
      np.testing.assert_array_equal(batch[k], want[k], err_msg=(k, numpy_path))
  rows = want["left_encoder_input_tokens"]
  assert (rows == rows[0]).all() and rows[0, -1] == 1  # every query is the prompt's first 11 ids + EOS
  root = str(tmp_path)
  m = cache_writer.write_cache(TASK, SPLIT, cache.task_dir(root, TASK, SPLIT), 1, LENGTHS, dedup=False, prompts=spec)
  assert m["stats"]["trimmed_by_feature"]["inputs"] == m["num_examples"]
  _, batch = _batch(spec, cache_dir=root, n=m["num_examples"])
  assert _rows(batch) == _rows(want)


def test_the_cache_refuses_other_prompts_and_old_caches_read_as_before(prompted_cache, tmp_path):
  root, _ = prompted_cache
  kw = dict(task=TASK, split=SPLIT, feature_lengths=LENGTHS, batch_size=8, prefetch=0, cache_dir=root)
  for other in (None, {"query": "query: ", "document": "passage: "}, {**PROMPTS, "query": "q: "}):
    with pytest.raises(cache.CacheError, match=r"tokenised with prompts .* this run's DataConfig.prompts give .*"
                                               r"rewrite the cache with the run's prompts") as e:
      make_local_iterator(prompts=other, **kw)
    assert "\n" not in str(e.value)
  next(make_local_iterator(prompts=dict(PROMPTS), **kw))  # the same prompts, another spelling: read
  plain = str(tmp_path / "plain")
  m = cache_writer.write_cache(TASK, SPLIT, cache.task_dir(plain, TASK, SPLIT), 1, LENGTHS, dedup=False)
  assert "prompts" not in m  # a cache without prompts has no key: its manifest is as before
  next(make_local_iterator(**{**kw, "cache_dir": plain}))
  with pytest.raises(cache.CacheError, match="tokenised with prompts none"):
    make_local_iterator(prompts={"query": "query: "}, **{**kw, "cache_dir": plain})


def test_st5_data_cache_takes_the_prompts_from_the_gin_file_or_the_flag(data_dir, tmp_path, capsys):
  gin_file = tmp_path / "run.gin"
  gin_file.write_text("\n".join([
      "include 'st5_tiny_cpu.gin'",
      f"DataConfig.task = '{tasks.STAGE1_PUBLIC_QA_MIXTURE}'",
      "DataConfig.feature_lengths = {'inputs': 16, 'targets': 16}",
      "DataConfig.split = 'train'",
      f"DataConfig.cache_dir = '{tmp_path / 'cache'}'",
      f"DataConfig.prompts = {{'query': 'query: ', '{tasks.TRECQA}': {{'document': 'answer: '}}}}",
  ]) + "\n")
  assert cli.main(["data", "cache", "--gin_file", str(gin_file), "--num_shards", "1"]) == 0
  assert "prompts {" in capsys.readouterr().out
  for name in tasks.STAGE1_PUBLIC_TASKS:
    m = cache.CacheReader(cache.task_dir(str(tmp_path / "cache"), name, "train")).manifest
    want = {"inputs": "query: ", **({"targets": "answer: "} if name == tasks.TRECQA else {})}
    assert m["prompts"] == want, name
  # Training from it with the same DataConfig reads it (mixture, per-task prompts).
  data = train.DataConfig(task=tasks.STAGE1_PUBLIC_QA_MIXTURE, feature_lengths={"inputs": 16, "targets": 16},
                          cache_dir=str(tmp_path / "cache"),
                          prompts={"query": "query: ", tasks.TRECQA: {"document": "answer: "}})
  it = make_local_iterator(task=data.task, feature_lengths=dict(data.feature_lengths), batch_size=16,
                           cache_dir=data.cache_dir, prompts=data.prompts, prefetch=0)
  assert set(it.get_state()["streams"].values()) == {"cache"}
  assert it.get_state()["prompts"][tasks.TRECQA] == {"inputs": "query: ", "targets": "answer: "}
  # --prompts (JSON) overrides the gin file's; bad JSON and unknown features are one-line errors.
  assert cli.main(["data", "cache", "--task", tasks.TRECQA, "--out", str(tmp_path / "c2"),
                   "--num_shards", "1", "--prompts", '{"inputs": "q: "}']) == 0
  assert cache.CacheReader(cache.task_dir(str(tmp_path / "c2"), tasks.TRECQA, "train")).manifest[
      "prompts"] == {"inputs": "q: "}
  capsys.readouterr()
  for flag, match in [("{bad", "--prompts is not JSON"), ('{"label": "x"}', "'label' is not a side"),
                      ('{"query": 3}', "must be a string")]:
    rc = cli.main(["data", "cache", "--task", tasks.TRECQA, "--out", str(tmp_path / "c3"), "--prompts", flag])
    assert rc == cli.USER_ERROR_EXIT
    err = [l for l in capsys.readouterr().err.splitlines() if l.startswith("st5 data cache: error: ")]
    assert len(err) == 1 and match in err[0], err


def test_prompt_specs_resolve_by_side_feature_and_task_with_one_line_errors():
  feats = ["inputs", "targets", "negative_targets", "negative_targets_1"]
  r = prompts.resolve({"query": "q: ", "document": "d: ", "negative_targets_1": "", "b": {"inputs": "bq: "}},
                      ["a", "b"], feats)
  assert r == {"a": {"inputs": "q: ", "targets": "d: ", "negative_targets": "d: "},
               "b": {"inputs": "bq: ", "targets": "d: ", "negative_targets": "d: "}}
  assert prompts.resolve("p: ", ["a"], ["inputs", "targets"]) == {"a": {"inputs": "p: ", "targets": "p: "}}
  assert prompts.resolve({"a": "x "}, ["a", "b"], ["inputs"]) == {"a": {"inputs": "x "}, "b": {}}
  assert prompts.side_prompts(r) == {"query": None, "document": "d: "}
  for spec, match in [({"label": "x"}, "'label' is not a side"), ({"query": 3}, r"\['query'\] must be a string"),
                      ({"c": {"query": "x"}}, "'c' is not one of the tasks"), (5, "must be a string or a mapping"),
                      ({"a": {"query": None}}, "map sides or features to strings")]:
    with pytest.raises(ValueError, match=match) as e:
      prompts.resolve(spec, ["a", "b"], feats)
    assert "\n" not in str(e.value)
  with pytest.raises(ValueError, match="DataConfig.prompts must be a string or a mapping"):
    train.DataConfig(task=TASK, feature_lengths=LENGTHS, prompts=["query: "])
  with pytest.raises(DataConfigError, match="'negative_targets' is not a side"):
    make_local_iterator(task=tasks.TRECQA, feature_lengths=LENGTHS, batch_size=4, prompts={"negative_targets": "x"})
  # A task the prompts step cannot go into (no tokenize step) is refused by name.
  task = seqio.get_mixture_or_task(TASK)
  bare = seqio.Task("st5_test_no_tokenize", source=task.source, output_features=task.output_features,
                    preprocessors=[])
  with pytest.raises(ValueError, match="no seqio.preprocessors.tokenize step"):
    prompts.with_prompts(bare, {"inputs": "x"})


def _model(prompts_=None):
  return ST5Config(t5=t5_size("t5_tiny"), max_length=32, prompts=prompts_ or {})


def test_the_model_config_gets_the_trained_query_and_document_prompts_or_refuses_a_conflict(data_dir):
  data = train.DataConfig(task=TASK, feature_lengths=LENGTHS, prompts=PROMPTS)
  got = train.train_prompts(_model({"other": "x: "}), data)
  assert got.prompt_dict == {"other": "x: ", "query": "query: ", "document": "passage: "}
  assert train.train_prompts(_model({"query": "query: "}), data).prompt_dict == {"query": "query: ",
                                                                                 "document": "passage: "}
  with pytest.raises(DataConfigError, match=r"trains the query side with 'query: ' but st5_model.prompts\['query'\] "
                                            r"is 'q: ': make them equal") as e:
    train.train_prompts(_model({"query": "q: "}), data)
  assert "\n" not in str(e.value)
  assert train.train_prompts(_model(), train.DataConfig(task=TASK, feature_lengths=LENGTHS)) == _model()
  # Tasks of a mixture that disagree on a side give the model no prompt for it.
  mixed = train.DataConfig(task=tasks.STAGE1_PUBLIC_QA_MIXTURE, feature_lengths=LENGTHS,
                           prompts={"query": "q: ", tasks.TRECQA: {"document": "a: "}})
  assert train.train_prompts(_model(), mixed).prompt_dict == {"query": "q: "}


def test_eval_prompt_rules_choose_per_task_and_side():
  from st5_jax.evaluation import prompts as eval_prompts  # pylint: disable=g-import-not-at-top
  model = {"query": "query: ", "document": "passage: ", "sts": "sts: "}
  tasks_ = ["STS12", "STSBenchmark", "MR", "TREC-QA", "WikiQA"]
  rules = eval_prompts.parse(["sts=sts", "STSBenchmark=none", "all=query", "retrieval.query=sts",
                              "TREC-QA=none", "TREC-QA.document=document"])
  assert eval_prompts.plan(rules, tasks_, model) == {
      "STS12": {"encode": "sts: "}, "STSBenchmark": {"encode": ""}, "MR": {"encode": "query: "},
      "TREC-QA": {"query": "", "document": "passage: "}, "WikiQA": {"query": "sts: ", "document": "query: "}}
  for rule, match in [("sts=nope", "the model has no prompt 'nope'"), ("sts.query=query", "names no retrieval set"),
                      ("nosuchtask=query", "unknown task or suite"), ("transfer=query", "names none of the evaluated"),
                      ("sts", "write TASK_OR_SUITE=PROMPT_NAME")]:
    with pytest.raises(ValueError, match=match) as e:
      eval_prompts.plan(eval_prompts.parse([rule]), ["STS12", "TREC-QA"], model)
    assert "\n" not in str(e.value)
  # The in-training evaluation's defaults are st5 eval's, then TrainConfig.eval_prompts.
  from st5_jax.evaluation import in_training  # pylint: disable=g-import-not-at-top
  metrics = ("stsb_dev_spearman", "TREC-QA-dev/MRR@10")
  assert in_training.dev_prompts(metrics, model, None, None) == {
      "STSBenchmarkDev": {"encode": ""}, "TREC-QA-dev": {"query": "query: ", "document": "passage: "}}
  assert in_training.dev_prompts(metrics, model, "sts", {"STSBenchmarkDev": "query", "dev.document": "none"}) == {
      "STSBenchmarkDev": {"encode": "query: "}, "TREC-QA-dev": {"query": "query: ", "document": ""}}
  with pytest.raises(ValueError, match="TrainConfig.eval_prompts"):
    train.TrainConfig(num_train_steps=1, global_batch_size=8, eval_prompts={"sts": ""})


def test_in_training_dev_sets_encode_with_the_chosen_prompts():
  from st5_jax.evaluation import in_training  # pylint: disable=g-import-not-at-top
  seen = []

  def encoder(params, texts):
    seen.append(list(texts))
    return np.zeros((len(texts), 4), np.float32)

  ev = in_training.DevEvaluator(encoder, metrics=("stsb_dev_spearman",), data_dir=None,
                                task_prompts={"STSBenchmarkDev": {"encode": "s: "},
                                              "TREC-QA-dev": {"query": "q: ", "document": "d: "}})
  sides = ev._sides(None, "STSBenchmarkDev")  # pylint: disable=protected-access
  sides.query(["a"])
  sides = ev._sides(None, "TREC-QA-dev")  # pylint: disable=protected-access
  sides.query(["b"])
  sides.document(["c"])
  assert seen == [["s: a"], ["q: b"], ["d: c"]]


def test_in_training_sts_dev_encodes_with_encodes_tower_and_prompt(data_dir):
  from st5_jax.evaluation import in_training  # pylint: disable=g-import-not-at-top
  seen = {"query": [], "document": []}

  def encoder(side):
    def encode(params, texts):
      seen[side].extend(texts)
      return np.random.default_rng(len(seen[side])).normal(size=(len(texts), 4)).astype(np.float32)
    return encode

  # The document route of asymmetric towers, as `encode` (and so st5 eval's STS) uses.
  ev = in_training.DevEvaluator(encoder("query"), document_encoder=encoder("document"),
                                metrics=("stsb_dev_spearman",), data_dir=data_dir,
                                task_prompts={"STSBenchmarkDev": {"encode": "s: "}})
  assert np.isfinite(ev(None)["stsb_dev_spearman"])
  assert not seen["query"] and seen["document"] and all(t.startswith("s: ") for t in seen["document"])


def test_the_negatives_refresh_keeps_one_prompt_per_side_or_refuses():
  from st5_jax.retrieval import refresh  # pylint: disable=g-import-not-at-top
  # Each generation is a task of another name with K negatives: the prompts travel by side.
  data = train.DataConfig(task=TASK, feature_lengths=LENGTHS, prompts={TASK: {"query": "q: ", "document": "d: "}})
  side_prompts_only = refresh._side_prompts_only  # pylint: disable=protected-access
  assert side_prompts_only(data).prompts == {"query": "q: ", "document": "d: "}
  assert side_prompts_only(train.DataConfig(task=TASK, feature_lengths=LENGTHS)).prompts is None
  with pytest.raises(ValueError, match="must give them the targets' prompt") as e:
    side_prompts_only(train.DataConfig(task=TASK, feature_lengths=LENGTHS, prompts=PROMPTS))
  assert "\n" not in str(e.value)


TINY_RUN = """
include 'st5_tiny_cpu.gin'
st5_model.size = 't5_tiny'
st5_model.embedding_dim = 16
st5_model.max_length = 24
st5_model.prompts = {'other': 'other: '}
TrainConfig.num_train_steps = 2
TrainConfig.global_batch_size = 16
TrainConfig.checkpoint_every = 2
TrainConfig.eval_every = -1
TASK_FEATURE_LENGTHS = {'inputs': 16, 'targets': 16}
DataConfig.prompts = {'query': 'query: ', 'document': 'passage: '}
MeshConfig.data = -1
"""


def test_a_run_with_prompts_saves_them_and_st5_eval_uses_them_per_task(data_dir, tmp_path, capsys, monkeypatch):
  """`st5 train` with DataConfig.prompts: the model config carries them (encode_query applies the query prompt);
  `st5 eval --prompt sts=query` encodes STS with it, as encode(prompt=...) does."""
  from st5_jax.encoder import SentenceEncoder  # pylint: disable=g-import-not-at-top
  from st5_jax.evaluation import harness  # pylint: disable=g-import-not-at-top
  gin_file = tmp_path / "run.gin"
  gin_file.write_text(TINY_RUN)
  wd = tmp_path / "wd"
  assert cli.main(["train", "--gin_file", str(gin_file), "--workdir", str(wd), "--no_progress"]) == 0
  saved = json.loads((wd / "st5_config.json").read_text())
  assert saved["prompts"] == {"document": "passage: ", "other": "other: ", "query": "query: "}
  enc = SentenceEncoder.load(str(wd))
  texts = ["what is a cat?", "A cat is an animal that likes to sleep in the sun all day long."]
  np.testing.assert_allclose(enc.encode_query(texts), enc.encode(texts, prompt="query: "), atol=1e-6)
  np.testing.assert_allclose(enc.encode_document(texts), enc.encode(texts, prompt="passage: "), atol=1e-6)
  assert not np.allclose(enc.encode_query(texts), enc.encode(texts), atol=1e-4)

  # st5 eval: STS with the query prompt (every text it encodes starts with it), the same score as encode(prompt=).
  encoded = []
  original = SentenceEncoder._encode_list  # pylint: disable=protected-access

  def recording(self, texts_, *args, **kwargs):
    encoded.extend(texts_)
    return original(self, texts_, *args, **kwargs)

  monkeypatch.setattr(SentenceEncoder, "_encode_list", recording)
  out = tmp_path / "results.json"
  assert cli.main(["eval", "--model", str(wd), "--tasks", "STSBenchmark", "--prompt", "sts=query",
                   "--output", str(out)]) == 0
  got = json.loads(out.read_text())
  result = next(iter(got["models"].values())) if "models" in got else next(iter(got.values()))
  assert encoded and all(t.startswith("query: ") for t in encoded)
  want = harness.evaluate(lambda t: enc.encode(t, prompt="query: "), "STSBenchmark", str(data_dir))
  assert result["tasks"]["STSBenchmark"]["main"] == pytest.approx(want["tasks"]["STSBenchmark"]["main"], abs=1e-9)
  plain = harness.evaluate(lambda t: enc.encode(t), "STSBenchmark", str(data_dir))
  assert plain["tasks"]["STSBenchmark"]["main"] != pytest.approx(want["tasks"]["STSBenchmark"]["main"], abs=1e-6)
  capsys.readouterr()
  assert cli.main(["eval", "--model", str(wd), "--tasks", "STSBenchmark", "--prompt", "sts=nope",
                   "--output", str(out)]) == cli.USER_ERROR_EXIT
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "the model has no prompt 'nope'" in err[0], err


def test_the_beam_cache_with_prompts_is_the_in_memory_cache(data_dir, tmp_path):
  """Apache Beam's writer prepends the same prompts and records them the same way (skipped without Beam)."""
  pytest.importorskip("apache_beam")
  from st5_jax import paths  # pylint: disable=g-import-not-at-top
  from st5_jax.data import registry  # pylint: disable=g-import-not-at-top
  from st5_jax.data.offline import beam_cache  # pylint: disable=g-import-not-at-top
  folder = tmp_path / "corpus"
  folder.mkdir()
  rows = [{"q": f"question number {i}", "a": f"an answer that is long enough to be cut {i}"} for i in range(20)]
  (folder / "part-0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  registry.register_user_task("test_prompts_beam", file_pattern=f"{folder}/part-*.jsonl",
                              columns={"inputs": "q", "targets": "a"})
  lengths, spec = {"inputs": 8, "targets": 8}, {"query": "query: ", "document": "passage: "}
  mem = cache_writer.write_cache("test_prompts_beam", "train", str(tmp_path / "mem"), 2, lengths, prompts=spec)
  beam = beam_cache.write_cache_beam("test_prompts_beam", "train", str(tmp_path / "beam"), 2, lengths,
                                     pipeline_args=("--runner=DirectRunner",), prompts=spec)
  assert mem["prompts"] == beam["prompts"] == {"inputs": "query: ", "targets": "passage: "}
  for name in [cache.shard_name(i, 2) for i in range(2)]:
    assert paths.read_bytes(str(tmp_path / "mem" / name)) == paths.read_bytes(str(tmp_path / "beam" / name))


def test_sweep_evaluation_takes_the_prompt_rules(monkeypatch):
  from st5_jax import sweep  # pylint: disable=g-import-not-at-top
  import st5_jax.encoder  # pylint: disable=g-import-not-at-top
  import st5_jax.evaluation  # pylint: disable=g-import-not-at-top
  seen = {}

  class Enc:
    prompts = {"query": "query: ", "document": "passage: "}

    def encode(self, texts, batch_size, prompt=None):
      seen.setdefault("prompt", []).append(prompt)
      return np.zeros((len(texts), 2))

    encode_query = encode_document = encode

  def evaluate(encode, tasks, data_dir, kfold, **kw):
    seen.update(kw)
    kw["prompted"]("query: ", "encode")(["x"])
    return {"tasks": {}}

  monkeypatch.setattr(st5_jax.encoder.SentenceEncoder, "load", staticmethod(lambda path, checkpoint: Enc()))
  monkeypatch.setattr(st5_jax.evaluation, "evaluate", evaluate)
  sweep.evaluate_run("wd", ["STS12", "TREC-QA"], prompts=["sts=query"])
  assert seen["task_prompts"] == {"STS12": {"encode": "query: "}}
  assert seen["prompt"] == ["query: "] and {"encode_query", "encode_document"} <= set(seen)
