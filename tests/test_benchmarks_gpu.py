"""benchmarks/gpu_compare.py on this CPU with tiny shapes: both sides, same model FLOPs, same model.

The GPU run itself needs a GPU; this keeps the script from rotting: one tiny run (both sides,
both torch encoders, in parallel), the torch-only T5 encoder against transformers'
T5EncoderModel, and the opt-in fused attention against the default one.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]


def _module():
  spec = importlib.util.spec_from_file_location("gpu_compare", REPO / "benchmarks" / "gpu_compare.py")
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def test_gpu_compare_tiny_both_sides(tmp_path):
  out_json = tmp_path / "figures.json"
  env = dict(os.environ, PYTHONPATH=str(REPO))
  env.pop("XLA_FLAGS", None)  # one CPU device, as a user runs it
  proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_compare.py"), "--tiny", "--parallel",
                         "--sentences", "16", "--count_flops", "--torch_impl", "transformers,torch_only",
                         "--json", str(out_json)], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  res = json.loads(out_json.read_text())
  assert res["backend"] == "cpu" and res["peak_flops"] is None  # MFU is n/a on a CPU
  assert res["torch_impl"] == ["transformers", "torch_only"]
  assert {"jax", "flax", "torch", "transformers"} <= set(res["versions"])
  rows = res["rows"]
  assert not [r for r in rows if "error" in r], rows
  for part in ("train", "encode"):
    part_rows = [r for r in rows if r["part"] == part]
    assert sorted((r["side"], r["impl"]) for r in part_rows) == [
        ("st5_jax", None), ("torch", "torch_only"), ("torch", "transformers")], part_rows
    for r in part_rows:
      assert r["per_s"] > 0 and r["flops_per_s"] > 0 and r["mfu"] is None
    # The same model FLOPs per example, each side's from its own model's shapes.
    assert len({r["flops_per_item"] for r in part_rows}) == 1, part_rows
    jax_row = next(r for r in part_rows if r["side"] == "st5_jax")
    torch_row = next(r for r in part_rows if r["impl"] == "transformers")
    assert jax_row["ratio"] == pytest.approx(jax_row["per_s"] / torch_row["per_s"])
  train = [r for r in rows if r["part"] == "train"]
  for r in train:
    if r["side"] == "torch":  # torch's own FLOP counter agrees with the analytic model FLOPs
      assert r["counted_flops_per_item"] == pytest.approx(r["flops_per_item"], rel=1e-3)
  # Same initial weights and batch, float32: the three first-step losses are one model's.
  losses = [r["first_loss"] for r in train]
  assert max(losses) - min(losses) < 1e-4 * abs(losses[0]), losses
  # One table with both sides, the versions and the device.
  out = proc.stdout
  assert "# device: cpu" in out and "# versions: " in out and "st5_jax/torch" in out
  table = [line for line in out.splitlines() if line.startswith("t5_1_1_tiny ")]
  for label in ("st5_jax: base", "torch: transformers T5EncoderModel", "torch: torch-only T5 encoder"):
    assert sum(label in line for line in table) == 2, out  # train and encode


@pytest.mark.parametrize("size", ["t5_1_1_tiny", "t5_tiny"])
def test_torch_only_encoder_matches_transformers(size):
  import torch  # the test extra's: a missing one fails here, never skips
  import transformers
  from st5_jax import configs
  from st5_jax.checkpoints import hf

  mod = _module()
  c = hf.hf_config_from_t5(configs.t5_size(size), encoder_only=True)
  c.update(dropout_rate=0.0)
  torch.manual_seed(0)
  ref = transformers.T5EncoderModel(transformers.T5Config(**c)).eval()
  with torch.no_grad():  # non-trivial norm scales and bias table, so a misplaced one shows
    for name, p in ref.named_parameters():
      if "layer_norm" in name:
        p.uniform_(0.5, 1.5)
  ours = mod.torch_t5_encoder_class()(c).eval()
  ours.load_state_dict(ref.state_dict())  # strict: every key of T5EncoderModel, none more
  rng = np.random.default_rng(0)
  tokens_BxL = rng.integers(3, 32000, size=(4, 40))
  for i, n in enumerate([40, 31, 7, 1]):  # padding, and a row of EOS only
    tokens_BxL[i, n - 1], tokens_BxL[i, n:] = 1, 0
  ids = torch.from_numpy(tokens_BxL).long()
  mask = (ids > 0).long()
  with torch.no_grad():
    want = ref(input_ids=ids, attention_mask=mask).last_hidden_state
    got = ours(ids, mask)
  m = mask.bool()
  assert torch.max(torch.abs(got[m] - want[m])).item() < 1e-4  # real positions
  assert torch.isfinite(got).all()
  # Model FLOPs from either module's own shapes are the same.
  assert mod.torch_model_t5_config(ours) == mod.torch_model_t5_config(ref)


def test_torch_side_falls_back_without_transformers(monkeypatch):
  # A bare image: torch but no transformers. The torch side must still run, and say what it ran.
  import torch
  mod = _module()
  monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` raises ImportError
  threads = torch.get_num_threads()
  try:
    res = mod.torch_worker(dict(size="t5_1_1_tiny", batch=4, length=8, projection=16, steps=2, time_s=0.5,
                                dtype="float32", sentences=8, same_weights=False, torch_impl="auto",
                                torch_compile="off", torch_optimizer="adamw", torch_threads=1, encode=False))
  finally:
    torch.set_num_threads(threads)
  assert res["impl"] == "torch_only" and res["versions"]["transformers"] is None
  assert res["examples_per_s"] > 0 and np.isfinite(res["first_loss"])


def test_fused_attention_matches_default():
  import jax
  import jax.numpy as jnp

  from st5_jax import configs
  from st5_jax.model import st5, t5

  assert t5._attention_impl == "einsum"  # the default is untouched
  cfg = configs.ST5Config(t5=configs.t5_size("t5_1_1_tiny", dropout_rate=0.0), embedding_dim=16, max_length=24)
  params = st5.init_params(cfg, jax.random.PRNGKey(0))
  model = st5.SentenceT5(cfg)
  tokens_BxL = np.array(np.random.default_rng(0).integers(3, 32000, size=(3, 24)), np.int32)
  tokens_BxL[1, 10:] = 0
  tokens_BxL[2, 3:] = 0

  def loss(p):
    emb_BxD = model.apply({"params": p}, jnp.asarray(tokens_BxL))
    return jnp.sum(emb_BxD * jnp.arange(16.0)), emb_BxD

  # A fresh jit per kernel: the kernel is read when the function is traced.
  (want_l, want), want_g = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
  prev = t5.set_attention_impl("xla")
  try:
    (got_l, got), got_g = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
  finally:
    t5.set_attention_impl(prev)
  np.testing.assert_allclose(got, want, atol=1e-5)
  np.testing.assert_allclose(got_l, want_l, rtol=1e-5)
  for g, w in zip(jax.tree.leaves(got_g), jax.tree.leaves(want_g)):
    np.testing.assert_allclose(g, w, atol=1e-5, rtol=1e-4)
  with pytest.raises(ValueError, match="attention impl"):
    t5.set_attention_impl("flash")


def test_variants_combine():
  mod = _module()
  v = mod.variant_spec("scan_dots+batch512+xla_lhs+xla_triton_gemm_off")
  assert v["scan"] and v["remat"] == "dots" and v["batch"] == 512
  assert v["xla_flags"] == ["--xla_gpu_enable_latency_hiding_scheduler=true", "--xla_gpu_enable_triton_gemm=false"]
  assert set(mod.AB_ORDER) <= set(mod.VARIANTS)
  with pytest.raises(ValueError, match="unknown variant"):
    mod.variant_spec("base+warp_speed")
  assert mod.peak_flops("NVIDIA H200", "gpu")[0] == 989e12
  assert mod.peak_flops("cpu", "cpu")[0] is None
