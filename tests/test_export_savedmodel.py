"""`st5 export --format savedmodel`: TF-only reload, parity with SentenceEncoder, TF Hub interface.

Three tiny towers (one per pooling, both T5 families) are exported once per module; one
subprocess that cannot import JAX loads all three from a new location, with the
vocabulary environment variables unset, and writes what it computed for the tests.
"""

import contextlib
import fcntl
import json
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

import flax.linen as nn
import jax
import numpy as np
import pytest

from st5_jax import SentenceEncoder, cli, configs, paths, vocab
from st5_jax.checkpoints import native, tree
from st5_jax.checkpoints.loader import detect_format, load_model
from st5_jax.export import export_model, savedmodel
from st5_jax.model import init_params

LONG = "The quick brown fox jumps over the lazy dog. " * 400  # ~4000 pieces, far over max_length
SENTENCES = ["A man is playing a guitar.", "Hello world", "", LONG,
             "Sentence-T5 turns T5 into a sentence encoder.", "  spaces   and\ttabs  ", "naïve café — ünïcödé"]
# name -> (pooling, size, embedding_dim, max_length)
TOWERS = {
    "enc_first": ("enc_first", "t5_tiny", None, 16),  # raw mode: no projection
    "enc_mean": ("enc_mean", "t5_1_1_tiny", 24, 32),
    "encdec_first": ("encdec_first", "t5_tiny", 16, 24),
}

# Runs in a fresh interpreter in which JAX (and st5_jax) cannot be imported at all:
# tensorflow itself tries `from jax import jit` (tensorflow/lite/python/util.py) when JAX
# is installed, so "not in sys.modules" alone would prove nothing.
_TF_ONLY_SCRIPT = textwrap.dedent("""
    import json, sys
    class _NoJax:
      def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("jax", "jaxlib", "flax", "st5_jax"):
          raise ModuleNotFoundError(f"{name} is blocked in this test")
        return None
    sys.meta_path.insert(0, _NoJax())
    import numpy as np
    import tensorflow as tf
    import tensorflow_text  # noqa: F401
    import tensorflow_hub as hub
    root, names, sentences = sys.argv[1], sys.argv[2].split(","), json.loads(sys.argv[3])
    report = {}
    for name in names:
      d = f"{root}/{name}"
      model = tf.saved_model.load(d)
      x = tf.constant(sentences)
      out = model(x)
      np.save(f"{d}.call.npy", out[0].numpy())
      sig = model.signatures["serving_default"]
      np.save(f"{d}.serving.npy", sig(inputs=x)["outputs"].numpy())
      np.save(f"{d}.single.npy", np.concatenate([model(tf.constant([s]))[0].numpy() for s in sentences]))
      np.save(f"{d}.tokens.npy", model.tokenize(x).numpy())
      np.save(f"{d}.hub.npy", hub.KerasLayer(d)(x)[0].numpy())
      spec = sig.structured_input_signature[1]["inputs"]
      report[name] = {
          "call_type": type(out).__name__, "call_len": len(out),
          "input_shape": spec.shape.as_list(), "input_dtype": spec.dtype.name,
          "outputs": {k: [v.shape.as_list(), v.dtype.name] for k, v in sig.structured_outputs.items()},
          "empty": model(tf.constant([], tf.string))[0].shape.as_list(),
          "variables": len(model.variables), "trainable": len(model.trainable_variables),
          "trainable_flags": sum(bool(v.trainable) for v in model.variables),
          "vocab_asset": model.vocab_file.asset_path.numpy().decode(),
      }
    report["jax_imported"] = any(m == "jax" or m.startswith("jax.") for m in sys.modules)
    with open(f"{root}/report.json", "w") as f:
      json.dump(report, f)
""")


def _build_native(d: pathlib.Path, pooling, size, embedding_dim, max_length, *, vocab_file, seed):
  cfg = configs.ST5Config(t5=configs.t5_size(size), pooling=pooling, embedding_dim=embedding_dim,
                          max_length=max_length)
  params = jax.device_get(nn.unbox(init_params(cfg, jax.random.PRNGKey(seed))))
  native.save_model(d, cfg, params, step=7, vocab_file=vocab_file)


def _shared_dir(tmp_path_factory, name: str) -> pathlib.Path:
  # Under pytest-xdist both workers may run tests of this module: they share one build.
  base = tmp_path_factory.getbasetemp()
  return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / name


@contextlib.contextmanager
def _built_once(root: pathlib.Path):
  """Yields True to the one process that must build `root`, False once it is complete."""
  root.parent.mkdir(parents=True, exist_ok=True)
  with open(f"{root}.lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
      todo = not (root / "complete").exists()
      if todo:
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir()
      yield todo
      if todo:
        (root / "complete").touch()
    finally:
      fcntl.flock(lock, fcntl.LOCK_UN)


def _export_all(root: pathlib.Path, vocab_path: str) -> None:
  for seed, (name, (pooling, size, dim, max_length)) in enumerate(TOWERS.items()):
    src = root / f"native_{name}"
    dst = root / "exports" / name
    if name == "encdec_first":
      # Its vocabulary lives elsewhere under another name, given with --vocab and deleted
      # after export: the SavedModel must carry it.
      other = root / "elsewhere" / "my_t5_vocab.model"
      other.parent.mkdir()
      shutil.copyfile(vocab_path, other)
      _build_native(src, pooling, size, dim, max_length, vocab_file=None, seed=seed)
      assert cli.main(["export", "--model", str(src), "--format", "savedmodel", "--out", str(dst),
                       "--vocab", str(other), "--platforms", "cpu"]) == 0
      other.unlink()
    else:
      _build_native(src, pooling, size, dim, max_length, vocab_file=vocab_path, seed=seed)
      summary = export_model(src, format="savedmodel", out=dst)
      assert summary["pooling"] == pooling and summary["bytes"] > 0


@pytest.fixture(scope="module")
def exported(tmp_path_factory, vocab_path):
  """{name: (native dir, SavedModel dir, config, params)}."""
  root = _shared_dir(tmp_path_factory, "export_savedmodel")
  with _built_once(root) as todo:
    if todo:
      _export_all(root, vocab_path)
  out = {}
  for name in TOWERS:
    src = root / f"native_{name}"
    cfg, params, _ = native.load_params(src)
    out[name] = (src, root / "exports" / name, cfg, jax.tree.map(np.asarray, params))
  return out


@pytest.fixture(scope="module")
def tf_only(exported, tmp_path_factory):
  """Outputs of the SavedModels computed in a JAX-free process, from a moved copy."""
  moved = _shared_dir(tmp_path_factory, "export_savedmodel_moved")
  with _built_once(moved) as todo:
    if todo:
      for name, (_, dst, _, _) in exported.items():
        shutil.copytree(dst, moved / name)
      env = {k: v for k, v in os.environ.items() if k not in ("ST5_VOCAB", "ST5_DATA_DIR", "PYTHONPATH")}
      proc = subprocess.run([sys.executable, "-c", _TF_ONLY_SCRIPT, str(moved), ",".join(exported),
                             json.dumps(SENTENCES)], env=env, capture_output=True, text=True, timeout=600,
                            cwd=str(moved))
      assert proc.returncode == 0, proc.stderr[-5000:]
  return moved, json.loads((moved / "report.json").read_text())


def _reference(exported, name):
  src, _, _, _ = exported[name]
  return SentenceEncoder.load(src).encode(SENTENCES)


def test_layout_weights_are_variables_and_assets(exported, vocab_path):
  for name, (src, dst, cfg, params) in exported.items():
    assert detect_format(dst) == "savedmodel"
    assets = dst / "assets"
    assert (assets / "spiece.model").read_bytes() == pathlib.Path(vocab_path).read_bytes()
    assert savedmodel.read_config(dst) == cfg
    assert (dst / "README.md").is_file()
    assert not (dst / native.CONFIG_FILE).exists()  # would make it look like a native folder
    # The weights live in variables/, not as constants in the graph.
    flat = tree.flatten(params)
    graph = (dst / "saved_model.pb").read_bytes()
    embedding = np.ascontiguousarray(flat["token_embedder/embedding"], np.float32)
    assert embedding[1000:1004].tobytes() not in graph
    weights = sum(f.stat().st_size for f in (dst / "variables").iterdir())
    assert weights >= sum(v.size * 4 for v in flat.values())
    meta = savedmodel.read_metadata(dst)
    assert meta["pooling"] == cfg.pooling and meta["output_dim"] == cfg.output_dim
    assert meta["source_format"] == "native" and meta["step"] == 7


@pytest.mark.parametrize("name", list(TOWERS))
def test_tf_only_reload_matches_sentence_encoder(exported, tf_only, name):
  moved, report = tf_only
  assert report["jax_imported"] is False
  want = _reference(exported, name)
  got = np.load(moved / f"{name}.call.npy")
  assert got.dtype == np.float32 and got.shape == want.shape
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
  np.testing.assert_allclose(np.linalg.norm(got, axis=-1), 1, atol=1e-5)
  # Same numbers through the serving signature, TF Hub, and one sentence at a time.
  for kind in ("serving", "hub", "single"):
    np.testing.assert_allclose(np.load(moved / f"{name}.{kind}.npy"), got, atol=1e-5, err_msg=kind)


def test_tf_hub_interface(exported, tf_only):
  _, report = tf_only
  for name, (_, _, cfg, params) in exported.items():
    r = report[name]
    assert r["call_type"] == "list" and r["call_len"] == 1
    assert r["input_shape"] == [None] and r["input_dtype"] == "string"
    assert r["outputs"] == {"outputs": [[None, cfg.output_dim], "float32"]}
    assert r["empty"] == [0, cfg.output_dim]
    assert r["variables"] == len(tree.flatten(params)) and r["trainable"] == 0
    assert r["trainable_flags"] == 0  # frozen weights: a GradientTape does not watch them by itself
    assert r["vocab_asset"].endswith("assets/spiece.model")


def test_tokenization_in_graph(exported, tf_only, vocab_path):
  moved, _ = tf_only
  tok = vocab.Tokenizer(vocab_path)
  for name, (_, _, cfg, _) in exported.items():
    tokens = np.load(moved / f"{name}.tokens.npy")
    rows = tok.encode(SENTENCES, max_length=cfg.max_length)
    assert tokens.shape[1] <= cfg.max_length
    np.testing.assert_array_equal(tokens, vocab.pad_batch(rows, tokens.shape[1]))
    assert tokens[2].tolist()[:2] == [vocab.EOS_ID, 0]  # the empty string is EOS alone
    long_row = tokens[SENTENCES.index(LONG)]
    assert len(long_row) == cfg.max_length and long_row[-1] == vocab.EOS_ID


def test_vocabulary_asset_travels(exported, tf_only, monkeypatch):
  # encdec_first's vocabulary was deleted after export and the subprocess had no
  # ST5_VOCAB / ST5_DATA_DIR: it tokenised from the SavedModel alone.
  moved, report = tf_only
  want = _reference(exported, "encdec_first")[:3]  # uses $ST5_VOCAB: the native folder has no vocabulary
  assert not pathlib.Path(exported["encdec_first"][0], "spiece.model").exists()
  assert report["encdec_first"]["vocab_asset"].startswith(str(moved))
  monkeypatch.delenv("ST5_VOCAB")
  monkeypatch.delenv("ST5_DATA_DIR")
  d = moved / "encdec_first"
  assert paths.vocab_path(None, model_dir=d) == str(d / "assets" / "spiece.model")
  enc = SentenceEncoder.load(d)
  np.testing.assert_allclose(enc.encode(SENTENCES[:3]), want, atol=1e-5)


def test_sentence_encoder_and_load_model_read_the_savedmodel(exported):
  for name, (src, dst, cfg, params) in exported.items():
    enc = SentenceEncoder.load(dst)
    assert isinstance(enc, savedmodel.SavedModelEncoder) and enc.dim == cfg.output_dim
    want = _reference(exported, name)
    np.testing.assert_allclose(enc.encode(SENTENCES, batch_size=3), want, atol=1e-5)
    assert enc.encode([]).shape == (0, cfg.output_dim)
    np.testing.assert_allclose(enc.encode(SENTENCES[1], normalize_embeddings=True), want[1], atol=1e-5)
    assert enc.encode(SENTENCES, convert_to_tensor=True).shape == want.shape
    assert enc.tokenize(["Hello world"]) == [[8774, 296, vocab.EOS_ID]]
    # Parameters come back exactly, without tracing, for every st5_jax tool.
    loaded_cfg, flat = savedmodel.load_flat(dst)
    assert loaded_cfg == cfg
    want_flat = tree.flatten(params)
    assert sorted(flat) == sorted(want_flat)
    for k, v in want_flat.items():
      np.testing.assert_array_equal(flat[k], v, err_msg=k)
  cfg2, params2, _, fmt = load_model(exported["enc_mean"][1], t5_overrides={"scan_layers": True})
  assert fmt == "savedmodel" and cfg2.t5.scan_layers
  assert params2["encoder"]["layers"]["mlp"]["wo"]["kernel"].shape[0] == cfg2.t5.num_encoder_layers


def test_reexport_and_refusals(exported, tmp_path):
  _, dst, cfg, _ = exported["enc_mean"]
  with pytest.raises(FileExistsError):
    export_model(exported["enc_mean"][0], format="savedmodel", out=dst)
  # A SavedModel is itself a source: re-export with a shorter max length.
  again = tmp_path / "again"
  summary = export_model(dst, format="savedmodel", out=again, max_length=8, platforms=("cpu",))
  assert summary["source_format"] == "savedmodel" and savedmodel.read_config(again).max_length == 8
  enc = SentenceEncoder.load(again)
  assert len(enc.tokenize([LONG])[0]) == 8
  np.testing.assert_allclose(enc.encode(SENTENCES[:2]),
                             SentenceEncoder.load(exported["enc_mean"][0], max_length=8).encode(SENTENCES[:2]),
                             atol=1e-5)
  assert cli.main(["export", "--model", str(dst), "--format", "savedmodel", "--out", str(again)]) == 2
  assert not list(tmp_path.glob(".again*"))  # no staging directories left behind
