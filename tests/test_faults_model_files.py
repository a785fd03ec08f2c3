"""Faults: hostile or broken model files. A clear error, nothing executed, nothing allocated
beyond what the file honestly holds; no loader ever unpickles."""

import json
import pickle
import shutil
import tracemalloc

import jax
import numpy as np
import pytest

from st5_jax import configs
from st5_jax.checkpoints import loader, native, tree

TINY = configs.ST5Config(t5=configs.t5_size("t5_tiny", dropout_rate=0.0, vocab_size=384), embedding_dim=16)
T5X = "t5x_tiny_dual_encoder_checkpoint_1000"


@pytest.fixture(scope="module")
def native_dir(tmp_path_factory):
  from st5_jax.model.st5 import SentenceT5
  import flax.linen as nn
  d = tmp_path_factory.mktemp("native") / "model"
  params = jax.jit(lambda k: SentenceT5(TINY).init(k, np.ones((1, 8), np.int32))["params"])(jax.random.PRNGKey(0))
  native.save_model(d, TINY, jax.device_get(nn.unbox(params)))
  return d


def _hf_folder(root, *, safetensors):
  import torch
  import transformers
  torch.manual_seed(0)
  cfg = transformers.T5Config(vocab_size=384, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                              feed_forward_proj="relu", decoder_start_token_id=0)
  model = transformers.T5ForConditionalGeneration(cfg)
  d = root / ("hf_st" if safetensors else "hf_bin")
  model.save_pretrained(d)
  if not safetensors:  # the legacy PyTorch format: a pickle-based zip
    torch.save(model.state_dict(), d / "pytorch_model.bin")
    for f in d.glob("*.safetensors"):
      f.unlink()
  return d


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
  root = tmp_path_factory.mktemp("hf")
  return {"safetensors": _hf_folder(root, safetensors=True), "bin": _hf_folder(root, safetensors=False)}


def _forbid_pickle(monkeypatch):
  def refuse(*a, **k):
    raise AssertionError("a loader unpickled something")

  class Refusing:
    def __init__(self, *a, **k):
      refuse()
  monkeypatch.setattr(pickle, "load", refuse)
  monkeypatch.setattr(pickle, "loads", refuse)
  monkeypatch.setattr(pickle, "Unpickler", Refusing)
  monkeypatch.setattr(pickle, "_Unpickler", Refusing, raising=False)


def test_no_loader_unpickles(monkeypatch, native_dir, hf_dirs, fixtures_dir):
  """Every format fixture loads with pickle.load/loads/Unpickler made to raise.

  torch.load(weights_only=True) has its own restricted unpickler (torch._weights_only_unpickler),
  which only rebuilds tensors; weights_only=False would go through pickle.Unpickler and fail here.
  """
  _forbid_pickle(monkeypatch)
  cases = {"native": native_dir, "hf": hf_dirs["safetensors"], "hf_bin": hf_dirs["bin"],
           "t5x": fixtures_dir / T5X}
  for name, path in cases.items():
    fmt = loader.detect_format(str(path))
    assert fmt == name.split("_")[0]
    cfg, flat = loader.read_flat(str(path), fmt)
    assert flat and all(np.all(np.isfinite(np.asarray(v))) for v in flat.values()), name
    loader.load_model(str(path), pooling="enc_mean")


def test_the_pickle_guard_catches_an_unsafe_torch_load(monkeypatch, hf_dirs):
  """The guard above is real: torch.load without weights_only unpickles and is caught."""
  import torch
  _forbid_pickle(monkeypatch)
  with pytest.raises(AssertionError, match="unpickled"):
    torch.load(str(hf_dirs["bin"] / "pytorch_model.bin"), weights_only=False)


def _set_width(cfg: dict, width: int) -> None:
  for key in ("emb_dim", "d_model"):
    if key in cfg:
      cfg[key] = width
  for v in cfg.values():
    if isinstance(v, dict):
      _set_width(v, width)


@pytest.mark.parametrize("fmt", ["native", "hf"])
def test_absurd_width_is_refused_before_allocating(tmp_path, native_dir, hf_dirs, fmt):
  """config.json saying the model is 10^9 wide: refused by shape, with no 10^9-sized buffer made."""
  src = native_dir if fmt == "native" else hf_dirs["safetensors"]
  d = tmp_path / "m"
  shutil.copytree(src, d)
  cfg_file = d / (native.CONFIG_FILE if fmt == "native" else "config.json")
  cfg = json.loads(cfg_file.read_text())
  _set_width(cfg, 10**9)
  cfg_file.write_text(json.dumps(cfg))
  tracemalloc.start()
  try:
    with pytest.raises(tree.ParameterMismatchError, match=r"model expects \(1000000000"):
      loader.load_model(str(d), pooling="enc_mean", embedding_dim=16, fresh_projection=True,
                        rng=jax.random.PRNGKey(0))
    _, peak = tracemalloc.get_traced_memory()
  finally:
    tracemalloc.stop()
  assert peak < 200 * 2**20, peak  # a 10^9-wide projection alone would be 64 GB


def _truncate(f, keep=0.5):
  data = f.read_bytes()
  f.write_bytes(data[:int(len(data) * keep)])


def test_truncated_safetensors(tmp_path, hf_dirs):
  d = tmp_path / "m"
  shutil.copytree(hf_dirs["safetensors"], d)
  _truncate(next(d.glob("*.safetensors")))
  with pytest.raises(ValueError, match=rf"{d}/model.safetensors is not a readable safetensors file "
                                       r"\(SafetensorError: .*\); it may be truncated or corrupt"):
    loader.load_model(str(d), pooling="enc_mean")


def test_truncated_t5x_msgpack(tmp_path, fixtures_dir):
  d = tmp_path / "ckpt"
  shutil.copytree(fixtures_dir / T5X, d)
  _truncate(d / "checkpoint")
  with pytest.raises(ValueError, match=rf"{d}/checkpoint is not a readable T5X msgpack checkpoint .*truncated"):
    loader.load_model(str(d), pooling="enc_mean")


def test_truncated_t5x_zarr_chunk(tmp_path, fixtures_dir):
  d = tmp_path / "ckpt"
  shutil.copytree(fixtures_dir / T5X, d)
  _truncate(d / "target.encoder.layers_0.mlp.wi.kernel" / "0.0")
  with pytest.raises(Exception) as err:
    loader.load_model(str(d), pooling="enc_mean")
  assert "target.encoder.layers_0.mlp.wi.kernel" in str(err.value), err.value


def test_an_exported_sentence_transformers_folder_loads_without_unpickling(monkeypatch, tmp_path, native_dir):
  """The sentence-transformers folders this project writes (and reads back) load with pickle forbidden."""
  from st5_jax.export import api
  out = tmp_path / "st"
  api.export_model(str(native_dir), format="sentence-transformers", out=str(out))
  _forbid_pickle(monkeypatch)
  assert loader.detect_format(str(out)) == "sentence_transformers"
  _, flat = loader.read_flat(str(out), "sentence_transformers")
  assert "projection_layer/kernel" in flat and all(np.all(np.isfinite(np.asarray(v))) for v in flat.values())
  loader.load_model(str(out))


def test_a_vocabulary_symlinked_outside_the_folder_is_not_exported(tmp_path, native_dir):
  """A model folder whose spiece.model points at another file is refused before anything is written."""
  from st5_jax.export import api
  secret = tmp_path / "secret.txt"
  secret.write_text("password=hunter2\n")
  model = tmp_path / "model"
  shutil.copytree(native_dir, model)
  (model / "spiece.model").symlink_to(secret)
  for fmt in ("sentence-transformers", "savedmodel"):
    out = tmp_path / f"out_{fmt}"
    with pytest.raises(ValueError, match=r"spiece.model is not a SentencePiece model"):
      api.export_model(str(model), format=fmt, out=str(out))
    assert not out.exists() and not list(tmp_path.glob(f".out_{fmt}*"))


def test_a_savedmodel_export_loads_and_encodes_without_unpickling(monkeypatch, tmp_path, vocab_path):
  """The SavedModel loader (TensorFlow's) reads, loads and runs an export with pickle forbidden.

  Covers both ways st5_jax reads a SavedModel: the parameters from `variables/`
  (`loader.read_flat` / `load_model`, e.g. training's init_from) and the graph run by
  TensorFlow (`SentenceEncoder.load` -> `SavedModelEncoder`).
  """
  from st5_jax import SentenceEncoder
  from st5_jax.export import api
  from st5_jax.model.st5 import SentenceT5
  import flax.linen as nn
  import tensorflow  # noqa: F401  (imported before the guard, as any user's process would have)
  # The full T5 vocabulary (an export checks the vocabulary fits the embedding).
  cfg = configs.ST5Config(t5=configs.t5_size("t5_tiny", dropout_rate=0.0), embedding_dim=16, max_length=16)
  params = jax.jit(lambda k: SentenceT5(cfg).init(k, np.ones((1, 8), np.int32))["params"])(jax.random.PRNGKey(0))
  native_dir = tmp_path / "model"
  native.save_model(native_dir, cfg, jax.device_get(nn.unbox(params)), vocab_file=vocab_path)
  out = tmp_path / "sm"
  api.export_model(str(native_dir), format="savedmodel", out=str(out))
  want = SentenceEncoder.load(str(native_dir), dtype="float32").encode(["A man plays a guitar.", ""])
  _forbid_pickle(monkeypatch)
  assert loader.detect_format(str(out)) == "savedmodel"
  _, flat = loader.read_flat(str(out), "savedmodel")
  assert "projection_layer/kernel" in flat and all(np.all(np.isfinite(np.asarray(v))) for v in flat.values())
  loader.load_model(str(out))
  enc = SentenceEncoder.load(str(out))
  assert type(enc).__name__ == "SavedModelEncoder"
  got = enc.encode(["A man plays a guitar.", ""])
  np.testing.assert_allclose(got, want, atol=1e-5)
