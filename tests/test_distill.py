"""Distillation: the Distill loss against NumPy, its errors and GradCache; the teacher cache (the teacher's own
vectors, decontaminated texts, resuming); the task's batches; `st5 distill-cache` then `st5 train` end to end."""

import json
import pathlib
import types

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import synthetic
from st5_jax import features, partitioning, train
from st5_jax.checkpoints import tree
from st5_jax.objectives import Distill, ObjectiveConfigError
from st5_jax.objectives.distill import cache as cache_lib
from st5_jax.objectives.distill import teacher as teacher_lib
from st5_jax.objectives.distill.objective import teacher_features

L, R, N0, N1 = features.LEFT, features.RIGHT, features.RIGHT_NEG, f"{features.RIGHT_NEG}_1"
WORDS = "a man woman dog child plays runs sits on in the park beach guitar ball red blue is playing".split()
# A text of STS12 (st5_jax.data.overlap): its example must not reach the cache.
CONTAMINATED = "A woman is grilling pineapples."


def _unit(x):
  return x / np.linalg.norm(x, axis=-1, keepdims=True)


def numpy_distill(emb, teacher, negatives, *, mse=0.0, cosine=0.0, margin=0.0, kl=0.0, T=0.05, T_teacher=None):
  """The Distill loss written out: {term: value} and the weighted total."""
  sides = [L, R] + negatives
  terms = {}
  if mse or cosine:
    s, t = np.concatenate([emb[k] for k in sides]), np.concatenate([teacher[k] for k in sides])
    terms["mse"] = np.mean((s - t) ** 2)
    terms["cosine"] = np.mean(1 - np.sum(_unit(s) * _unit(t), axis=1))
  if margin:
    def margins(e):
      return np.stack([np.sum(_unit(e[L]) * _unit(e[R]), 1) - np.sum(_unit(e[L]) * _unit(e[n]), 1)
                       for n in negatives], axis=1)
    terms["margin_mse"] = np.mean((margins(emb) - margins(teacher)) ** 2)
  if kl:
    def log_softmax(x):
      x = x - x.max(1, keepdims=True)
      return x - np.log(np.exp(x).sum(1, keepdims=True))
    s_logp = log_softmax(_unit(emb[L]) @ _unit(np.concatenate([emb[k] for k in sides[1:]])).T / T)
    t_logp = log_softmax(_unit(teacher[L]) @ _unit(np.concatenate([teacher[k] for k in sides[1:]])).T
                         / (T_teacher or T))
    terms["kl"] = np.mean(np.sum(np.exp(t_logp) * (t_logp - s_logp), 1)) * T ** 2
  weights = {"mse": mse, "cosine": cosine, "margin_mse": margin, "kl": kl}
  terms = {k: v for k, v in terms.items() if weights[k]}
  return sum(weights[k] * v for k, v in terms.items()), terms


def _vectors(rng, sides, B, dim, tie=None):
  out = {k: rng.normal(size=(B, dim)) for k in sides}
  if tie is not None:  # a student loosely like its teacher
    out = {k: tie[k][:, :dim] + 0.5 * v for k, v in out.items()}
  return out


@pytest.mark.parametrize("settings,K,D,E", [
    # every term, K = 2 negatives, the teacher's temperature of its own
    (dict(mse_weight=0.7, cosine_weight=0.3, margin_mse_weight=0.5, kl_weight=2.0, kl_temperature=0.1,
          kl_teacher_temperature=0.2, num_negatives=2), 2, 16, 16),
    # scores only, from a wider teacher (E = 24 > D = 16)
    (dict(mse_weight=0.0, margin_mse_weight=1.3, kl_weight=0.4, kl_temperature=0.07, num_negatives=1), 1, 16, 24),
    # pairs: the embedding terms and the in-batch KL need no negatives
    (dict(mse_weight=0.0, cosine_weight=1.5, kl_weight=0.8, kl_temperature=0.3), 0, 16, 16),
])
def test_loss_matches_numpy(settings, K, D, E):
  obj = Distill(**settings)
  negatives = [N0, N1][:K]
  rng = np.random.default_rng(0)
  teacher = _vectors(rng, [L, R] + negatives, 12, E)
  emb = _vectors(rng, [L, R] + negatives, 12, D, tie=teacher)
  want, terms = numpy_distill(emb, teacher, negatives, mse=obj.mse_weight, cosine=obj.cosine_weight,
                              margin=obj.margin_mse_weight, kl=obj.kl_weight, T=obj.kl_temperature,
                              T_teacher=obj.kl_teacher_temperature)
  as_jnp = lambda d: {k: jnp.asarray(v, jnp.float32) for k, v in d.items()}  # noqa: E731
  got, metrics = jax.jit(lambda e, t: obj.loss()(e, t, negatives))(as_jnp(emb), as_jnp(teacher))
  assert float(got) == pytest.approx(want, rel=1e-5)
  assert set(metrics) == {"loss", *terms}
  for k, v in terms.items():
    assert float(metrics[k]) == pytest.approx(v, rel=1e-5, abs=1e-7), k


def test_the_embedding_terms_need_the_teachers_dimension():
  rng = np.random.default_rng(1)
  teacher = {k: jnp.asarray(rng.normal(size=(4, 24)), jnp.float32) for k in (L, R)}
  emb = {k: jnp.asarray(rng.normal(size=(4, 16)), jnp.float32) for k in (L, R)}
  with pytest.raises(ValueError, match=r"student's 16-d embeddings with the teacher's 24-d.*embedding_dim = 24"):
    Distill(cosine_weight=1.0).loss()(emb, teacher, [])


@pytest.mark.parametrize("kw,match", [
    (dict(mse_weight=0.0), "every weight at 0"),
    (dict(cosine_weight=-1.0), "cosine_weight must be a number >= 0"),
    (dict(margin_mse_weight=1.0), "margin_mse_weight needs hard negatives"),
    (dict(kl_weight=1.0, kl_temperature=0.0), "kl_temperature must be > 0"),
    (dict(num_negatives=65), "num_negatives must be an int in 0..64"),
])
def test_bad_settings_are_refused_by_name(kw, match):
  with pytest.raises(ObjectiveConfigError, match=match):
    Distill(**kw)


def test_features_name_the_teacher_lengths():
  obj = Distill(num_negatives=1)
  lengths = {"inputs": 8, "targets": 8, "negative_targets": 8, "teacher_inputs": 32, "teacher_targets": 32,
             "teacher_negative_targets": 32}
  got = obj.features(lengths)
  assert {k: (f.length_key, f.dtype) for k, f in got.items() if f.dtype == "float32"} == {
      "teacher_inputs": ("teacher_inputs", "float32"), "teacher_targets": ("teacher_targets", "float32"),
      "teacher_negative_targets": ("teacher_negative_targets", "float32")}
  with pytest.raises(ObjectiveConfigError, match="one dimension"):
    obj.features(dict(lengths, teacher_targets=16))
  with pytest.raises(ObjectiveConfigError, match="'teacher_negative_targets' length"):
    obj.required_lengths({k: v for k, v in lengths.items() if k != "teacher_negative_targets"})


def test_throughput_counts_tokens_not_the_teachers_vectors():
  from st5_jax import hooks

  batch = {L: jnp.zeros((2, 5), jnp.int32), "teacher_inputs": jnp.zeros((2, 384)), features.LABELS: jnp.zeros(2)}
  assert hooks.tokens_per_example(batch) == 5


def test_grad_cache_and_the_plain_step_agree():
  """Through the objective's own step (a tiny stand-in tower), every term on, K = 1: the loss on its embeddings and
  the batch's teacher vectors equals NumPy's, and GradCache (2 chunks) gives the plain gradient."""
  mesh = partitioning.make_mesh(partitioning.MeshConfig(1, 1, 1), devices=jax.devices()[:1])
  batch = jax.device_get(next(synthetic.SyntheticPairs(mesh, 8, 0, negatives=1)))
  rng = np.random.default_rng(3)
  teacher = {side: rng.normal(size=(8, 16)).astype(np.float32) for side in (L, R, N0)}
  batch.update({teacher_features(1)[side]: v for side, v in teacher.items()})
  model = synthetic.TinyTower(dim=16)
  params = nn.unbox(model.init(jax.random.PRNGKey(0), jnp.ones((1, 4), jnp.int32))["params"])
  obj = Distill(mse_weight=0.7, cosine_weight=0.3, margin_mse_weight=0.5, kl_weight=2.0, kl_temperature=0.1,
                num_negatives=1)
  results = []
  for chunks in (0, 2):
    vg = obj.make_value_and_grad(model, None, None, types.SimpleNamespace(grad_cache_chunks=chunks))
    results.append(jax.jit(vg)(params, batch, jax.random.PRNGKey(2)))
  ((loss, _), grads), ((loss_c, _), grads_c) = results
  emb = {k: np.asarray(model.apply({"params": params}, batch[k]), np.float64) for k in (L, R, N0)}
  want, _ = numpy_distill(emb, teacher, [N0], mse=0.7, cosine=0.3, margin=0.5, kl=2.0, T=0.1)
  assert float(loss) == pytest.approx(want, rel=1e-5) and float(loss_c) == pytest.approx(want, rel=1e-5)
  flat, flat_c = tree.flatten(grads), tree.flatten(grads_c)
  assert any(np.abs(v).max() > 1e-4 for v in flat.values())
  for k in flat:
    np.testing.assert_allclose(flat_c[k], flat[k], atol=1e-6, rtol=1e-4, err_msg=k)


# ------------------------------------------------------------------------------------------------ the cache


def _rows(n, *, seed=0, negatives=1):
  rng = np.random.default_rng(seed)
  keys = cache_lib.text_keys(negatives)
  return [{k: " ".join(rng.choice(WORDS, size=int(rng.integers(3, 9)))) for k in keys} for _ in range(n)]


def _examples(rows, negatives=1):
  return cache_lib.Examples(cache_lib.text_keys(negatives), rows, {"test": True})


@pytest.fixture(scope="module")
def bert_teacher(tmp_path_factory) -> pathlib.Path:
  """A tiny BERT sentence-transformers folder (mean pooling, normalised, 32-d): a teacher st5_jax cannot read."""
  import torch
  import transformers
  from sentence_transformers import SentenceTransformer
  from sentence_transformers.sentence_transformer import modules

  root = tmp_path_factory.mktemp("bert_teacher")
  hf = root / "hf"
  hf.mkdir()
  (hf / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", ","] + WORDS) + "\n")
  tokenizer = transformers.BertTokenizerFast(vocab_file=str(hf / "vocab.txt"), do_lower_case=True)
  torch.manual_seed(0)
  bert = transformers.BertModel(transformers.BertConfig(
      vocab_size=len(WORDS) + 7, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
      max_position_embeddings=64))
  bert.save_pretrained(hf)
  tokenizer.save_pretrained(hf)
  st = SentenceTransformer(modules=[modules.Transformer(str(hf), max_seq_length=32), modules.Pooling(32, "mean"),
                                    modules.Normalize()], device="cpu")
  st.save(str(root / "st"))
  return root / "st"


def test_cache_holds_the_teachers_own_vectors_of_decontaminated_texts(tmp_path, bert_teacher):
  from sentence_transformers import SentenceTransformer

  rows = _rows(30)
  rows.insert(7, {"inputs": "a dog runs", "targets": CONTAMINATED, "negative_targets": "a red ball"})
  teacher = teacher_lib.load_teacher(str(bert_teacher), batch_size=8)
  assert isinstance(teacher, teacher_lib.SentenceTransformersTeacher)  # auto: st5_jax cannot read BERT
  report = cache_lib.build_cache(_examples(rows), teacher, tmp_path / "cache", shard_size=16)
  assert report.manifest["counts"]["dropped_contaminated"] == {"STS12": 1}
  counts = report.manifest["counts"]
  assert counts["examples"] == 30 and report.manifest["teacher"]["backend"] == "sentence-transformers"
  cache = cache_lib.TeacherCache.open(tmp_path / "cache")
  assert CONTAMINATED not in cache.texts and len(cache.texts) == len(set(cache.texts)) == counts["texts"]
  kept = rows[:7] + rows[8:]
  for n, row in enumerate(kept):  # every example's texts, in order
    assert [cache.texts[i] for i in cache.examples_NxS[n]] == [row[k] for k in cache.features]
  want = SentenceTransformer(str(bert_teacher), device="cpu").encode(cache.texts, convert_to_numpy=True)
  np.testing.assert_allclose(cache.all_vectors(), want, atol=1e-5)


def test_a_public_tasks_examples_come_with_what_it_dropped_for_evaluation_texts():
  examples = cache_lib.task_examples("st5_snli_devtest_triples", "all")
  assert examples.features == ("inputs", "targets", "negative_targets") and len(examples.rows) == 6140
  assert sum(examples.counts["dropped_contaminated_by_task"].values()) == 199  # the README's 6,339 - 6,140
  with pytest.raises(ValueError, match="not a task of this project's sources"):
    cache_lib.task_examples("st5_tfds_snli_triples", "train")  # TFDS-backed: not a source of ours


def test_a_t5_sentence_transformers_teacher_runs_on_sentence_encoder(tmp_path, vocab_path):
  from st5_jax.encoder import SentenceEncoder
  from test_checkpoints_hf import _build_sentence_t5

  folder = _build_sentence_t5(tmp_path, vocab_path)
  teacher = teacher_lib.load_teacher(str(folder), batch_size=4)
  assert isinstance(teacher, teacher_lib.St5Teacher) and teacher.dim == 16
  report = cache_lib.build_cache(_examples(_rows(6)), teacher, tmp_path / "cache", shard_size=8)
  assert report.manifest["teacher"]["backend"] == "st5" and len(report.manifest["teacher"]["fingerprint"]) == 64
  cache = cache_lib.TeacherCache.open(tmp_path / "cache")
  np.testing.assert_allclose(cache.all_vectors(), SentenceEncoder.load(folder).encode(cache.texts), atol=1e-5)


class _Interrupted(Exception):
  pass


class _StopAfter:
  """A teacher that is killed on its n-th encode call."""

  def __init__(self, teacher, calls):
    self.teacher, self.calls, self.dim = teacher, calls, teacher.dim

  def encode(self, texts):
    self.calls -= 1
    if self.calls < 0:
      raise _Interrupted()
    return self.teacher.encode(texts)

  def describe(self):
    return self.teacher.describe()


def test_cache_resumes_after_an_interruption_without_recomputing_finished_parts(tmp_path):
  examples = _examples(_rows(40, negatives=2), negatives=2)
  out = tmp_path / "cache"
  with pytest.raises(_Interrupted):  # killed while encoding its third part
    cache_lib.build_cache(examples, _StopAfter(synthetic.HashTeacher(24), 2), out, shard_size=10)
  assert not (out / cache_lib.MANIFEST).exists() and sorted(p.name for p in out.glob("part-*.json")) == [
      "part-00000.json", "part-00001.json"]
  with pytest.raises(FileNotFoundError, match="no manifest.json.*rerun it"):
    cache_lib.TeacherCache.open(out)
  resumed = synthetic.HashTeacher(24)
  report = cache_lib.build_cache(examples, resumed, out, shard_size=10)
  texts = cache_lib.TeacherCache.open(out).texts
  assert report.kept == [0, 1] and report.encoded == list(range(2, len(report.manifest["parts"])))
  assert resumed.encoded == texts[20:]  # only the unfinished parts' texts
  fresh = cache_lib.build_cache(examples, synthetic.HashTeacher(24), tmp_path / "fresh", shard_size=10)
  assert fresh.manifest == report.manifest  # the same bytes as an uninterrupted run
  for part in fresh.manifest["parts"]:
    assert (out / f"{part['name']}.npy").read_bytes() == (tmp_path / "fresh" / f"{part['name']}.npy").read_bytes()

  # A part whose vectors changed on disk is encoded again, alone.
  (out / "part-00001.npy").write_bytes(b"truncated")
  again = synthetic.HashTeacher(24)
  assert cache_lib.build_cache(examples, again, out, shard_size=10).encoded == [1] and again.encoded == texts[10:20]
  # Another teacher's run is refused before anything is written.
  before = {p.name: p.read_bytes() for p in out.iterdir()}
  with pytest.raises(cache_lib.DistillCacheMismatchError, match="another run"):
    cache_lib.build_cache(examples, synthetic.HashTeacher(24, seed=1), out, shard_size=10)
  assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_the_task_gives_each_text_its_teacher_vector_and_checks_the_cache(tmp_path, vocab_path):
  from st5_jax import vocab
  from st5_jax.data import DataConfigError, make_local_iterator
  from st5_jax.objectives.distill import tasks

  teacher = synthetic.HashTeacher(16)
  cache_lib.build_cache(_examples(_rows(24)), teacher, tmp_path / "cache", shard_size=7)
  name = tasks.distill_task("test_distill_cache", cache_dir=str(tmp_path / "cache"), num_negatives=1)
  lengths = {"inputs": 16, "targets": 16, "negative_targets": 16, "teacher_inputs": 16, "teacher_targets": 16,
             "teacher_negative_targets": 16}
  batch = next(make_local_iterator(task=name, feature_lengths=lengths, batch_size=6, seed=3, prefetch=0))
  tok = vocab.Tokenizer(vocab_path)
  for side, key in ((L, "inputs"), (R, "targets"), (N0, "negative_targets")):
    texts = [tok.decode(row) for row in batch[side]]
    np.testing.assert_allclose(batch[teacher_features(1)[side]], teacher.encode(texts), atol=1e-6, err_msg=key)

  with pytest.raises(ValueError, match=r"16-d vectors but DataConfig.feature_lengths gives 'teacher_\w+': 12"):
    next(make_local_iterator(task=name, feature_lengths={**lengths, "teacher_inputs": 12, "teacher_targets": 12,
                                                         "teacher_negative_targets": 12}, batch_size=6))
  with pytest.raises(DataConfigError, match=r"dedup compares token rows.*'teacher_inputs'.*dedup = False"):
    train.DataConfig(task=name, feature_lengths=lengths, dedup=True)(
        partitioning.make_mesh(partitioning.MeshConfig(1, 1, 1), devices=jax.devices()[:1]), 6, 0)
  pairs = tasks.distill_task("test_distill_pairs", cache_dir=str(tmp_path / "cache"), num_negatives=0)
  with pytest.raises(ValueError, match="holds examples with 1 hard negatives.*num_negatives .* to 1"):
    next(make_local_iterator(task=pairs, feature_lengths=lengths, batch_size=6))


def test_st5_distill_cache_then_st5_train_end_to_end(tmp_path, bert_teacher, monkeypatch, capsys):
  """The CLI on users' triples with the BERT teacher, then a few steps of distill_tiny_cpu.gin on a tiny tower
  from that cache: the loss falls."""
  from st5_jax import cli

  triples = tmp_path / "triples.jsonl"
  rows = _rows(48)
  triples.write_text("".join(json.dumps({"sent0": r["inputs"], "sent1": r["targets"],
                                         "hard_neg": r["negative_targets"]}) + "\n" for r in rows))
  monkeypatch.setenv("ST5_USER_NLI_TRIPLES", str(triples))
  out = tmp_path / "cache"
  argv = ["distill-cache", "--teacher", str(bert_teacher), "--task", "st5_user_nli_triples", "--out", str(out),
          "--shard_size", "40", "--batch_size", "16"]
  assert cli.main(argv) == 0
  err = capsys.readouterr().err
  assert "48 examples (0 dropped" in err and "TEACHER_DIM = 32, NUM_NEGATIVES = 1" in err
  assert cli.main(argv) == 0 and "encoded 0 parts" in capsys.readouterr().err  # a rerun resumes: nothing to do

  monkeypatch.setenv("ST5_DISTILL_CACHE", str(out))
  work = tmp_path / "work"
  overrides = ["st5_model.size='t5_tiny'", "TEACHER_DIM=32", "TrainConfig.global_batch_size=16",
               "TrainConfig.num_train_steps=12", "TrainConfig.log_every=1", "TrainConfig.eval_every=-1",
               "TrainConfig.checkpoint_every=100", "Distill.margin_mse_weight=1.0", "MeshConfig.data=-1"]
  assert cli.main(["train", "--gin_file", "distill_tiny_cpu.gin", "--workdir", str(work), "--no_progress",
                   *[f"--gin.{o}" for o in overrides]]) == 0
  logged = [json.loads(line) for line in (work / "metrics.jsonl").read_text().splitlines()]
  loss = [m["train/loss"] for m in logged if "train/loss" in m]
  assert len(loss) >= 10 and {"train/mse", "train/kl", "train/margin_mse"} <= set(logged[-1])
  assert np.mean(loss[-3:]) < 0.7 * np.mean(loss[:3]), loss
