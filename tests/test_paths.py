"""The path layer against a GCS emulator: files, globs, listings, local copies, model formats on gs://."""

import os
import subprocess
import sys

import flax.linen as nn
import jax
import numpy as np
import pytest

from st5_jax import configs, paths
from st5_jax.checkpoints import loader, native
from st5_jax.model.st5 import init_params


def test_files_and_globs_on_gcs(gcs, tmp_path):
  base = gcs.url("paths", "basic")
  paths.write_text(f"{base}/a/x.tsv", "q\ta\r\nq2\ta2\n")
  paths.write_bytes(f"{base}/a/y.tsv", b"\xff\xfe")
  paths.write_text(f"{base}/b/z.json", "{}")
  assert paths.read_text(f"{base}/a/x.tsv") == "q\ta\r\nq2\ta2\n"  # no newline translation
  assert paths.read_bytes(f"{base}/a/y.tsv") == b"\xff\xfe" and paths.size(f"{base}/a/y.tsv") == 2
  assert paths.glob(f"{base}/a/*.tsv") == [f"{base}/a/x.tsv", f"{base}/a/y.tsv"]
  assert paths.glob(f"{base}/*/*.json") == [f"{base}/b/z.json"]
  assert paths.glob(f"{base}/a/*.csv") == []
  assert paths.is_dir(f"{base}/a") and not paths.is_file(f"{base}/a")
  assert paths.is_file(f"{base}/b/z.json") and not paths.exists(f"{base}/nothing")
  # Local copies for libraries that only open local files, and uploads of local writes.
  local = paths.local_dir(f"{base}/a")
  assert sorted(os.listdir(local)) == ["x.tsv", "y.tsv"] and not paths.is_remote(local)
  with paths.staged_output(f"{base}/out") as out:
    os.makedirs(out)
    with open(os.path.join(out, "f.txt"), "w") as f:
      f.write("done")
  assert paths.read_text(f"{base}/out/f.txt") == "done"
  assert paths.tensorstore_kvstore(f"{base}/arr") == {"driver": "gcs", "bucket": gcs.bucket,
                                                      "path": "paths/basic/arr"}


def test_listings_see_what_other_processes_write(gcs):
  """A cached listing once hid new checkpoint steps written by another process."""
  base = gcs.url("paths", "fresh")
  paths.write_text(f"{base}/1.txt", "1")
  assert paths.glob(f"{base}/*.txt") == [f"{base}/1.txt"]
  assert [p.name for p in paths.path(base).iterdir()] == ["1.txt"]  # how orbax lists checkpoint steps
  code = f"from st5_jax import paths; paths.write_text('{base}/2.txt', '2')"
  subprocess.run([sys.executable, "-c", code], env=dict(os.environ, **gcs.env()), check=True, timeout=120)
  assert [p.name for p in paths.path(base).iterdir()] == ["1.txt", "2.txt"]
  assert paths.glob(f"{base}/*.txt") == [f"{base}/1.txt", f"{base}/2.txt"]


def test_a_work_dir_on_gcs_is_native_not_t5x(gcs, vocab_path, fixtures_dir):
  """Issue 11, item 1: every gs:// path used to be detected as a legacy T5X checkpoint."""
  cfg = configs.ST5Config(t5=configs.t5_size("t5_tiny", vocab_size=384, dropout_rate=0.0), embedding_dim=8)
  params = jax.device_get(nn.unbox(init_params(cfg, jax.random.PRNGKey(0))))
  url = gcs.url("paths", "model")
  native.save_model(url, cfg, params, step=7, vocab_file=vocab_path)
  assert loader.detect_format(url) == "native"
  assert loader.detect_format(f"{url}/checkpoints/7") == "native"
  assert native.step_to_load(url) == (url, 7)
  got_cfg, got, report, fmt = loader.load_model(url)
  assert fmt == "native" and got_cfg == cfg
  np.testing.assert_array_equal(got["encoder"]["layers_0"]["mlp"]["wi"]["kernel"],
                                params["encoder"]["layers_0"]["mlp"]["wi"]["kernel"])
  assert loader.resolve_vocab(url, "native") == f"{url}/spiece.model"
  # A T5X checkpoint on gs:// is still one (the real fixture, uploaded).
  t5x_url = gcs.upload(fixtures_dir / "t5x_tiny_dual_encoder_checkpoint_1000", "paths", "t5x")
  assert loader.detect_format(t5x_url) == "t5x"
  with pytest.raises(FileNotFoundError, match="does not exist"):
    loader.detect_format(gcs.url("paths", "missing"))
  paths.write_text(gcs.url("paths", "junk", "x.txt"), "x")
  with pytest.raises(ValueError, match="Cannot tell the format"):
    loader.detect_format(gcs.url("paths", "junk"))


def test_data_dir_and_vocabulary_on_gcs(gcs, data_dir, monkeypatch):
  """Issue 11, item 2: a gs:// data dir stopped training before step 0."""
  url = gcs.upload(data_dir / "t5_spiece", "paths", "data", "t5_spiece")
  root = gcs.url("paths", "data")
  monkeypatch.setenv(paths.DATA_DIR_ENV, root)
  monkeypatch.delenv(paths.VOCAB_ENV, raising=False)
  assert os.fspath(paths.data_dir()) == root
  assert paths.vocab_path() == f"{url}/spiece.model"
  from st5_jax import vocab as vocab_lib
  assert vocab_lib.Tokenizer(paths.vocab_path()).encode(["Hello world"], max_length=8) == [[8774, 296, 1]]
  with pytest.raises(paths.MissingFileError, match="does not exist"):
    paths.data_dir(gcs.url("paths", "no_such_dir"))


def test_remove_interrupted_writes_removes_only_the_named_parts_temporary_files(tmp_path):
  """A killed `write_bytes` leaves `.NAME.tmp-PID`; a resumed writer removes its own parts' leftovers only."""
  names = [".part-00003.jsonl.tmp-41", ".part-00004.jsonl.tmp-7", ".shard-00003.npy.tmp-41", "part-00003.jsonl",
           ".part-00003.jsonl"]
  for name in names:
    (tmp_path / name).write_text("x")
  removed = paths.remove_interrupted_writes(str(tmp_path), "part", {3})
  assert removed == [".part-00003.jsonl.tmp-41"]
  assert sorted(os.listdir(tmp_path)) == sorted(set(names) - set(removed))
  assert paths.remove_interrupted_writes(str(tmp_path / "missing"), "part", {3}) == []
  # The real leftover of a write: the temporary name write_bytes uses.
  target = tmp_path / "shard-00009.npy"
  tmp = target.parent / f".{target.name}.tmp-{os.getpid()}"
  tmp.write_bytes(b"half")
  assert paths.remove_interrupted_writes(str(tmp_path), "shard", {9}) == [tmp.name]
