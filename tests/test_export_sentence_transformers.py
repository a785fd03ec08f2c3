"""`st5 export --format sentence-transformers` and the model card of every export."""

import json
import shutil

import flax.linen as nn
import jax
import numpy as np
import pytest

from st5_jax import SentenceEncoder, cli, configs
from st5_jax.checkpoints import native
from st5_jax.checkpoints.loader import detect_format
from st5_jax.export import export_model, model_card
from st5_jax.export.sentence_transformers import UnsupportedExportError
from st5_jax.model import init_params

LONG = "The quick brown fox jumps over the lazy dog. " * 400
SENTENCES = ["A man is playing a guitar.", "Hello world", "", LONG, "Sentence-T5 turns T5 into a sentence encoder."]
# name -> (pooling, size, embedding_dim, normalize, max_length, scan_layers)
TOWERS = {
    "enc_mean": ("enc_mean", "t5_tiny", 16, True, 32, False),
    "enc_first": ("enc_first", "t5_1_1_tiny", 24, True, 16, True),  # trained with scanned layers
    "enc_first_raw": ("enc_first", "t5_tiny", None, False, 20, False),  # no projection, no normalisation
}


def _build_native(d, pooling, size, embedding_dim, normalize, max_length, scan, *, vocab_file, seed=0):
  cfg = configs.ST5Config(t5=configs.t5_size(size, scan_layers=scan), pooling=pooling, embedding_dim=embedding_dim,
                          normalize=normalize, max_length=max_length)
  params = jax.device_get(nn.unbox(init_params(cfg, jax.random.PRNGKey(seed))))
  native.save_model(d, cfg, params, step=3, vocab_file=vocab_file)
  return cfg


@pytest.fixture(scope="module")
def natives(tmp_path_factory, vocab_path):
  root = tmp_path_factory.mktemp("st_native")
  return {name: (root / name, _build_native(root / name, *spec, vocab_file=vocab_path, seed=i))
          for i, (name, spec) in enumerate(TOWERS.items())}


@pytest.mark.parametrize("name", list(TOWERS))
def test_sentence_transformers_parity(natives, tmp_path, name):
  from sentence_transformers import SentenceTransformer

  src, cfg = natives[name]
  out = tmp_path / "st"
  summary = export_model(src, format="sentence-transformers", out=out)
  assert summary["output_dim"] == cfg.output_dim
  ours = SentenceEncoder.load(src).encode(SENTENCES)

  modules = json.loads((out / "modules.json").read_text())
  types = [m["type"] for m in modules]
  want = ["Transformer", "Pooling"] + ["Dense"] * (cfg.embedding_dim is not None) + ["Normalize"] * cfg.normalize
  assert types == [f"sentence_transformers.models.{t}" for t in want]
  assert modules[0]["path"] == ""
  assert json.loads((out / "config.json").read_text())["architectures"] == ["T5EncoderModel"]
  assert json.loads((out / "sentence_bert_config.json").read_text())["max_seq_length"] == cfg.max_length
  if cfg.embedding_dim:
    dense = json.loads((out / "2_Dense" / "config.json").read_text())
    assert dense["bias"] is False and dense["activation_function"].endswith("Identity")

  st = SentenceTransformer(str(out), device="cpu")
  assert st.max_seq_length == cfg.max_length
  ref = st.encode(SENTENCES, convert_to_numpy=True)
  np.testing.assert_allclose(ref, ours, atol=1e-5, rtol=0)
  # And st5_jax reads its own export back.
  assert detect_format(out) == "sentence_transformers"
  back = SentenceEncoder.load(out)
  assert back.config.pooling == cfg.pooling and back.config.max_length == cfg.max_length
  np.testing.assert_allclose(back.encode(SENTENCES), ours, atol=1e-5, rtol=0)


def test_encdec_first_is_refused_with_the_reason(tmp_path, vocab_path, capsys):
  src = tmp_path / "encdec"
  _build_native(src, "encdec_first", "t5_tiny", 16, True, 16, False, vocab_file=vocab_path)
  with pytest.raises(UnsupportedExportError, match="decoder") as err:
    export_model(src, format="sentence-transformers", out=tmp_path / "st")
  assert "savedmodel" in str(err.value)
  assert cli.main(["export", "--model", str(src), "--format", "sentence-transformers",
                   "--out", str(tmp_path / "st")]) == 2
  assert "encdec_first cannot be exported to sentence-transformers" in capsys.readouterr().err
  assert not (tmp_path / "st").exists() and not list(tmp_path.glob(".st*"))


def test_model_card_from_a_work_dir(natives, tmp_path):
  src, cfg = natives["enc_mean"]
  work = tmp_path / "work"
  shutil.copytree(src, work)
  (work / "train_config.json").write_text(json.dumps(
      {"num_train_steps": 3, "global_batch_size": 512, "temperature": 0.01, "seed": 0,
       "optimizer": {"learning_rate": 0.001, "warmup_fraction": 0.1}}))
  (work / "results.json").write_text(json.dumps(
      {"init_from": "gs://t5-data/pretrained_models/t5x/t5_base/checkpoint_999900", "last_step": 3,
       "stsb_dev_spearman_before": 61.234, "stsb_dev_spearman_after": 80.5}))
  (work / "operative_config.gin").write_text("# a comment with DataConfig.task = 'nope'\n"
                                             "DataConfig.task = 'st5_simcse_nli_triples'\n")
  evals = tmp_path / "eval.json"
  evals.write_text(json.dumps({"models": {"mine": {"tasks": {"STSBenchmark": {"main": 79.1, "metric": "spearman"}}}}}))
  out = tmp_path / "st"
  assert cli.main(["export", "--model", str(work), "--format", "sentence-transformers", "--out", str(out),
                   "--eval_results", str(evals)]) == 0
  card = (out / "README.md").read_text()
  for text in ("enc_mean", "gs://t5-data/pretrained_models/t5x/t5_base/checkpoint_999900",
               "st5_simcse_nli_triples", "Steps: 3 of 3, global batch size 512", "80.50", "61.23",
               "| mine | STSBenchmark | spearman | 79.10 |", "SentenceTransformer(\"st\")", "size `t5_tiny`",
               "dense 32 -> 16, no bias", "32 tokens"):
    assert text in card, text
  assert "nope" not in card
  # The training task's MTEB names (st5_jax/data/offline/contamination_names.py), machine-readable beside the card;
  # no report given: no Contamination section, no contamination.json.
  assert "MTEB names of the training data: MNLI, SNLI" in card and "## Contamination" not in card
  record = json.loads((out / model_card.TRAINING_DATA).read_text())
  assert record["tasks"] == ["st5_simcse_nli_triples"] and record["mteb_training_datasets"] == ["MNLI", "SNLI"]
  assert record["contamination_report"] is None and not (out / model_card.CONTAMINATION).exists()
  # Re-exporting an export keeps what it recorded.
  again = tmp_path / "again"
  assert cli.main(["export", "--model", str(out), "--format", "sentence-transformers", "--out", str(again)]) == 0
  assert json.loads((again / model_card.TRAINING_DATA).read_text())["mteb_training_datasets"] == ["MNLI", "SNLI"]
  assert "- Training data: st5_simcse_nli_triples" in (again / "README.md").read_text()


def test_model_card_when_nothing_is_known(tmp_path):
  cfg = configs.ST5Config(t5=configs.t5_size("t5_1_1_base"), pooling="encdec_first")
  info = model_card.collect(config=cfg, source=str(tmp_path / "missing"), source_format="native")
  card = model_card.render(info, export_format="savedmodel", name="my_export")
  assert "Base checkpoint: unknown" in card and "Training data: unknown" in card
  assert "No evaluation results" in card and "size `t5_1_1_base`" in card
  assert 'hub.KerasLayer("my_export")' in card and "12 encoder + 12 decoder layers" in card


def test_t5x_checkpoint_exports(fixtures_dir, tmp_path):
  """A real T5X dual-encoder checkpoint (t5x_retrieval's) as the source."""
  from sentence_transformers import SentenceTransformer

  src = fixtures_dir / "t5x_tiny_dual_encoder_checkpoint_1000"
  out = tmp_path / "st"
  summary = export_model(src, format="sentence-transformers", out=out)
  assert summary["source_format"] == "t5x" and summary["output_dim"] == 768
  ours = SentenceEncoder.load(src).encode(SENTENCES)
  ref = SentenceTransformer(str(out), device="cpu").encode(SENTENCES, convert_to_numpy=True)
  np.testing.assert_allclose(ref, ours, atol=1e-5, rtol=0)
  assert f"Base checkpoint: {src}" in (out / "README.md").read_text()
