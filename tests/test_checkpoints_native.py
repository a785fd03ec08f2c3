"""Loading native work dirs restores only params, exactly, and logs no orbax warnings."""

from __future__ import annotations

import logging

import flax.linen as nn
import jax
import numpy as np
import orbax.checkpoint as ocp

from st5_jax import configs
from st5_jax.checkpoints import native, tree
from st5_jax.model import init_params


def _tiny():
  cfg = configs.ST5Config(t5=configs.t5_size("t5_tiny"), pooling="enc_mean", embedding_dim=16, max_length=32)
  return cfg, jax.device_get(nn.unbox(init_params(cfg, jax.random.PRNGKey(0))))


def _warnings(caplog):
  return [f"{r.name}: {r.getMessage()}" for r in caplog.records if r.levelno >= logging.WARNING]


def test_work_dir_with_optimizer_and_meta_loads_params_quietly(tmp_path, caplog):
  cfg, params = _tiny()
  native.write_config(tmp_path, cfg)
  # A training work dir: params, opt_state and meta items at two steps.
  opt_state = jax.tree.map(lambda x: np.zeros_like(x), params)
  mngr = native.checkpoint_manager(tmp_path, max_to_keep=3)
  for step in (3, 5):
    scaled = jax.tree.map(lambda x, s=step: x * s, params)
    mngr.save(step, args=ocp.args.Composite(params=ocp.args.StandardSave(scaled),
                                            opt_state=ocp.args.StandardSave(opt_state),
                                            meta=ocp.args.JsonSave({"step": step})))
  mngr.wait_until_finished()
  mngr.close()

  caplog.clear()
  with caplog.at_level(logging.INFO):  # absl's records propagate to the root logger
    loaded_cfg, loaded, step = native.load_params(tmp_path)
    _, at3, step3 = native.load_params(tmp_path / "checkpoints" / "3")
  assert _warnings(caplog) == []
  assert loaded_cfg == cfg and step == 5 and step3 == 3
  want5, want3 = tree.flatten(params), tree.flatten(at3)
  got = tree.flatten(loaded)
  assert sorted(got) == sorted(want5)  # params only: nothing of opt_state or meta
  for k, v in want5.items():
    np.testing.assert_array_equal(got[k], v * 5, err_msg=k)
    np.testing.assert_array_equal(want3[k], v * 3, err_msg=k)


def test_saved_model_folder_loads_quietly(tmp_path, caplog, vocab_path):
  from st5_jax import SentenceEncoder

  cfg, params = _tiny()
  native.save_model(tmp_path, cfg, params, step=7, vocab_file=vocab_path)
  caplog.clear()
  with caplog.at_level(logging.INFO):
    enc = SentenceEncoder.load(tmp_path)
  assert _warnings(caplog) == []
  assert enc.encode(["a sentence"]).shape == (1, 16)
