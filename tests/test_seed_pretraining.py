"""SEED-Encoder pre-training data (st5_jax.objectives.seed_encoder.tasks), gin files, and init from T5 checkpoints."""

import json
import os
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest
import seqio
import tensorflow as tf
import torch
import transformers

from st5_jax import configs, features, optim, train
from st5_jax.objectives import SeedEncoder
from st5_jax.objectives.seed_encoder import objective as seed_objective
from st5_jax.objectives.seed_encoder import objective as seed_encoder
from st5_jax.checkpoints import loader, native, tree
from st5_jax.gin_config import parse_gin
from st5_jax.data import overlap
from st5_jax.objectives.seed_encoder import span_corruption as sc
from st5_jax.objectives.seed_encoder import tasks as sp
from st5_jax.data import make_local_iterator
from st5_jax.data.offline import overlap_report
from st5_jax import gin_config
from test_seed_encoder import TINY, VOCAB, SyntheticSpanCorruption, _tc, np_decode

SENTINEL = 32099  # <extra_id_0> of the T5 vocabulary


def _uncorrupt_rows(batch):
  """Every row's inputs+targets merged back == its uncorrupted segment (all EOS-terminated)."""
  enc, dec, weak = (batch[k] for k in (seed_objective.ENCODER_INPUTS, seed_objective.DECODER_TARGETS,
                                       seed_objective.WEAK_DECODER_TARGETS))
  out = []
  for e, d, w in zip(enc, dec, weak):
    e, d, w = (list(x[:list(x).index(1)]) for x in (e, d, w))  # up to EOS
    assert np_decode(e, d, SENTINEL) == w
    assert any(t > 32000 for t in e)  # at least one noise span
    out.append(w)
  return out


def _batch(rows, lengths):
  """seqio rows (unpadded) -> a 0-padded batch under the model feature names."""
  return {seed_objective.MODEL_FEATURE_NAMES[k]: np.stack([np.pad(r[k], (0, lengths[k] - len(r[k]))) for r in rows])
          for k in sp.OUTPUT_FEATURE_NAMES}


# ---------------------------------------------------------------- the QA text task


def test_qa_text_task_has_no_evaluation_text(data_dir):
  task = seqio.get_mixture_or_task(sp.QA_TEXT)
  built = task.source.build("train")
  texts = [ex["text"] for ex in built.examples]
  # 5,961 distinct texts from the training splits after decontamination (11,154 while the test splits were read).
  assert len(texts) > 5_500 and len(set(texts)) == len(texts)
  assert built.inputs and not [f for f in built.inputs if "test" in f.lower()]  # test splits are evaluation-only
  assert not built.evaluation_sets_missing  # every evaluation set was read, so every one was checked
  assert sum(n for r, n in built.stats.filtered_by_reason.items() if r.startswith("text in evaluation set")) > 0
  found, missing = overlap_report.find_overlaps([sp.QA_TEXT], data_dir=str(data_dir))
  assert not missing
  assert found == [], overlap_report.summary(found, missing)
  # Never SQuAD dev (QNLI dev comes from it): its paragraphs are not in the corpus.
  squad = json.loads((data_dir / "squad_v1.1_dev/dev-v1.1.reconstructed.json").read_text())
  paragraphs = {overlap.normalize(p["context"]) for a in squad["data"] for p in a["paragraphs"]}
  assert not paragraphs & {overlap.normalize(t) for t in texts}


def test_the_overlap_check_sees_what_decontamination_removes(data_dir, monkeypatch):
  # Without decontamination the same corpus overlaps evaluation sets: the check above is live.
  monkeypatch.setenv("ST5_DATA_DECONTAMINATE", "0")
  found, _ = overlap_report.find_overlaps([sp.QA_TEXT], data_dir=str(data_dir))
  assert {o.evaluation for o in found} >= {"TREC", "SST2"}


def test_qa_text_batches_through_the_pipeline(data_dir):
  lengths = sc.feature_lengths(32)
  it = make_local_iterator(task=sp.QA_TEXT, feature_lengths=lengths, batch_size=16,
                           model_feature_names=seed_objective.MODEL_FEATURE_NAMES, seed=0)
  batch = next(it)
  assert {k: v.shape for k, v in batch.items()} == {
      seed_objective.ENCODER_INPUTS: (16, 32), seed_objective.DECODER_TARGETS: (16, 8),
      seed_objective.WEAK_DECODER_TARGETS: (16, 35)}
  vocab = seqio.get_mixture_or_task(sp.QA_TEXT).output_features["targets"].vocabulary
  corpus = {overlap.normalize(ex["text"]) for ex in seqio.get_mixture_or_task(sp.QA_TEXT).source.examples("train")}
  for row in _uncorrupt_rows(batch):
    text = overlap.normalize(vocab.decode(row))
    # A segment is a whole text or a piece of one (long texts are split into 34-token segments).
    assert text in corpus or any(text in c for c in corpus if len(c) > len(text))


# ---------------------------------------------------------------- users' text files and c4


def test_user_text_files(tmp_path, monkeypatch, vocab_path):
  lines = ["Sentence encoders map text to vectors.", "The weak decoder reads only the pooled vector of "
           "the encoder, so it cannot copy the text from its own previous tokens.", "Short one."]
  (tmp_path / "a.txt").write_text("\n".join(lines[:2]) + "\n")
  (tmp_path / "b.txt").write_text(lines[2] + "\n")
  task = seqio.get_mixture_or_task(sp.USER_TEXT)
  monkeypatch.delenv(sp.USER_TEXT_ENV, raising=False)
  with pytest.raises(ValueError, match="seed_user_text.file_pattern"):
    task.get_dataset(sc.feature_lengths(16), split="train", shuffle=False)
  monkeypatch.setenv(sp.USER_TEXT_ENV, str(tmp_path / "*.txt"))
  lengths = sc.feature_lengths(64)
  rows = list(task.get_dataset(lengths, split="train", shuffle=False).as_numpy_iterator())
  vocab = task.output_features["targets"].vocabulary
  assert sorted(vocab.decode(w) for w in _uncorrupt_rows(_batch(rows, lengths))) == sorted(lines)
  monkeypatch.setenv(sp.USER_TEXT_ENV, str(tmp_path / "nothing-*.txt"))
  with pytest.raises(FileNotFoundError, match="no file matches"):
    task.get_dataset(sc.feature_lengths(16), split="train", shuffle=False)
  # A task under any name over a list of files.
  named = sp.register_text_line_task("test_seed_text_files", file_pattern=[str(tmp_path / "b.txt")])
  try:
    rows = list(named.get_dataset(sc.feature_lengths(16), split="train", shuffle=False).as_numpy_iterator())
    assert len(rows) == 1 and vocab.decode(rows[0]["uncorrupted"][:-1].tolist()) == lines[2]
  finally:
    seqio.TaskRegistry.remove("test_seed_text_files")


def test_c4_task_is_registered_and_its_preprocessors_corrupt_text(vocab_path):
  task = seqio.get_mixture_or_task(sp.TFDS_C4)
  assert task.source.tfds_dataset.name == sp.TFDS_C4_NAME and set(task.splits) == {"train", "validation"}
  docs = ["C4 documents are long web pages. " * 30, "A short page."]
  ds = tf.data.Dataset.from_tensor_slices({"text": docs, "url": ["u1", "u2"], "timestamp": ["t", "t"]})
  lengths = sc.feature_lengths(64)
  with seqio.utils.map_seed_manager(0):
    out = task.preprocess_postcache(task.preprocess_precache(ds, seed=0), sequence_length=lengths, seed=0)
  rows = list(out.as_numpy_iterator())
  vocab = task.output_features["targets"].vocabulary
  n_tokens = [len(vocab.encode(d)) for d in docs]
  assert len(rows) == -(-n_tokens[0] // (lengths["uncorrupted"] - 1)) + 1  # one document -> many segments
  segments = _uncorrupt_rows(_batch(rows, lengths))
  assert vocab.decode([t for s in segments[:-1] for t in s]) == docs[0].strip()
  assert vocab.decode(segments[-1]) == docs[1]


# ---------------------------------------------------------------- gin


REPO = pathlib.Path(__file__).resolve().parents[1]


def test_seed_encoder_tiny_cpu_gin():
  parse_gin(["seed_encoder_tiny_cpu.gin"], ["SeedEncoder.decoder_loss_weight = 0.0"])
  spec = gin_config.run_spec()
  tc = spec.train_config
  assert tc.objective == SeedEncoder(decoder_loss_weight=0.0)
  assert dict(spec.data.feature_lengths) == sc.feature_lengths(32)
  assert dict(spec.data.model_features) == seed_objective.MODEL_FEATURE_NAMES
  assert spec.data.task == sp.QA_TEXT and spec.model.t5 == configs.t5_size("t5_mini", dtype="float32",
                                                                             dropout_rate=0.0)
  # Its tower is the NLI stage's, so its work dir initialises gin/st5_tiny_cpu.gin.
  parse_gin(["st5_tiny_cpu.gin"], [])
  st5 = gin_config.run_spec().model
  assert (st5.t5, st5.pooling, st5.embedding_dim) == (spec.model.t5, spec.model.pooling, spec.model.embedding_dim)


def test_seed_encoder_base_tpu_gin():
  parse_gin(["seed_encoder_base_tpu.gin"], [])
  spec = gin_config.run_spec()
  assert spec.train_config.objective == SeedEncoder() and spec.data.task == sp.TFDS_C4
  assert spec.model.t5 == configs.t5_size("t5_base", dtype="bfloat16", dropout_rate=0.1, scan_layers=True,
                                                remat_policy="full")
  assert dict(spec.data.feature_lengths) == sc.feature_lengths(512)
  assert spec.target["slice"] == "v4-32" and spec.train_config.global_batch_size % 16 == 0


@pytest.mark.aot_all
def test_seed_encoder_base_tpu_fits_its_slice(tmp_path):
  env = dict(os.environ)
  env.pop("JAX_PLATFORMS", None)
  out = subprocess.run([sys.executable, "-m", "st5_jax.cli", "aot", "--gin", "seed_encoder_base_tpu.gin", "--json",
                        str(tmp_path / "r.json")], capture_output=True, text=True, env=env, timeout=1800)
  assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
  report = json.loads((tmp_path / "r.json").read_text())
  assert report["fits"] and report["devices"] == 16


# ---------------------------------------------------------------- init from a T5 checkpoint


def _hf_t5(tmp_path) -> pathlib.Path:
  """A Hugging Face T5 1.0 (encoder + decoder) with TINY's shapes."""
  torch.manual_seed(0)
  cfg = transformers.T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, num_heads=4, num_layers=2, num_decoder_layers=2,
                              d_ff=64, feed_forward_proj="relu", tie_word_embeddings=True, dropout_rate=0.0,
                              decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
  out = tmp_path / "hf_t5"
  transformers.T5ForConditionalGeneration(cfg).save_pretrained(out)
  return out


def test_init_from_hf_t5_keeps_its_decoder_and_starts_the_weak_decoder_fresh(tmp_path, vocab_path):
  hf_dir = _hf_t5(tmp_path)
  _, flat = loader.read_flat(str(hf_dir), "hf")
  seed = SeedEncoder(num_layers=1)
  params, report = seed_encoder.load_pretrained(str(hf_dir), model_config=TINY, seed_config=seed,
                                                rng=jax.random.PRNGKey(0))
  got = tree.flatten(params)
  assert any(k.startswith("decoder/") for k in flat)
  assert {k.split("/")[0] for k in report.missing_initialised} == {"weak_decoder", "projection_layer"}
  for k, v in flat.items():
    np.testing.assert_array_equal(got[k], v, err_msg=k)
  # Through training: the run starts from these arrays (decoder included) and saves the weak decoder.
  work = tmp_path / "seed"
  r = train.train(workdir=work, model_config=TINY, train_config=_tc(num_train_steps=1, objective=seed),
                  make_iterator=lambda mesh, b, s: SyntheticSpanCorruption(mesh, b, s), init_from=str(hf_dir),
                  vocab_file=vocab_path, progress=False)
  assert r.step == 1 and r.summary["init_from"] == str(hf_dir)
  _, after, _ = native.load_params(work)
  after = tree.flatten(after)
  assert any(k.startswith("weak_decoder/") for k in after)
  for k in ("decoder/layers_1/mlp/wi/kernel", "encoder/layers_0/attention/query/kernel", "token_embedder/embedding"):
    a, b = np.asarray(after[k]), flat[k]
    assert not np.array_equal(a, b) and np.corrcoef(a.ravel(), b.ravel())[0, 1] > 0.9, k  # one step away


def test_init_from_an_encoder_only_t5x_checkpoint_starts_the_decoder_fresh(fixtures_dir):
  path = str(fixtures_dir / "t5x_tiny_dual_encoder_checkpoint_1000")
  stored, flat = loader.read_flat(path, "t5x")
  assert not any(k.startswith("decoder/") for k in flat)
  model = configs.ST5Config(t5=stored.t5.replace(dtype="float32"), pooling="enc_mean",
                            embedding_dim=stored.embedding_dim)
  params, report = seed_encoder.load_pretrained(path, model_config=model, seed_config=SeedEncoder(),
                                                rng=jax.random.PRNGKey(0))
  fresh = {k.split("/")[0] for k in report.missing_initialised}
  assert fresh == {"decoder", "weak_decoder"}
  got = tree.flatten(params)
  for k, v in flat.items():
    np.testing.assert_array_equal(got[k], v, err_msg=k)  # the projection too


def test_init_refuses_a_partial_decoder_and_another_model(tmp_path, monkeypatch):
  hf_dir = _hf_t5(tmp_path)
  real = loader.read_flat

  def without_one(path, fmt):
    cfg, flat = real(path, fmt)
    return cfg, {k: v for k, v in flat.items() if k != "decoder/layers_1/mlp/wo/kernel"}

  monkeypatch.setattr(loader, "read_flat", without_one)
  with pytest.raises(tree.ParameterMismatchError, match="decoder/layers_1/mlp/wo/kernel"):
    seed_encoder.load_pretrained(str(hf_dir), model_config=TINY, seed_config=SeedEncoder(),
                                 rng=jax.random.PRNGKey(0))
  monkeypatch.setattr(loader, "read_flat", real)
  bigger = TINY.replace(t5=TINY.t5.replace(num_heads=2))
  with pytest.raises(ValueError, match="num_heads: checkpoint 4 vs config 2"):
    seed_encoder.load_pretrained(str(hf_dir), model_config=bigger, seed_config=SeedEncoder(),
                                 rng=jax.random.PRNGKey(0))
