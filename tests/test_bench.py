"""`st5 bench`: a smoke run whose printed figures are checked for consistency, not speed."""

import json
import math

import flax.linen as nn
import jax
import pytest

from st5_jax import cli, configs
from st5_jax.model import abstract_params


def test_bench_reports_consistent_figures(tmp_path, capsys):
  path = tmp_path / "bench.json"
  assert cli.main(["bench", "--size", "t5_tiny", "--batch", "16", "--length", "16", "--steps", "2", "--negatives",
                   "--encode_sentences", "64", "--json", str(path)]) == 0
  out = json.loads(path.read_text())
  printed = capsys.readouterr().out
  assert all(k in printed for k in out)  # the table prints every figure the JSON has
  assert (out["devices"], out["global_batch"], out["length"], out["towers"]) == (8, 16, 16, 3)
  assert out["examples_per_sec"] == pytest.approx(16 / out["step_seconds"])
  assert out["tokens_per_sec"] == pytest.approx(16 * 16 * 3 / out["step_seconds"])
  assert out["achieved_flops_per_sec"] == pytest.approx(out["step_flops"] / out["step_seconds"])
  assert out["fraction_of_matmul_peak"] == pytest.approx(out["achieved_flops_per_sec"]
                                                         / out["matmul_peak_flops_per_sec"])
  assert out["encode_sentences_per_sec"] > 0
  # The step's FLOPs against the 6 x parameters x tokens rule (forward 2, backward 4) over the
  # encoder and projection, for 3 towers of 16 x 16 tokens: attention scores add a few percent.
  cfg = configs.ST5Config(t5=configs.t5_size("t5_tiny"), embedding_dim=32)
  flat = jax.tree_util.tree_flatten_with_path(nn.unbox(abstract_params(cfg)))[0]
  n = sum(math.prod(x.shape) for p, x in flat if jax.tree_util.keystr(p).startswith(("['encoder']",
                                                                                      "['projection_layer']")))
  assert 1.0 < out["step_flops"] / (6 * n * 16 * 16 * 3) < 1.2
