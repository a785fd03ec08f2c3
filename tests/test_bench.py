"""`st5 bench`: a smoke run whose printed figures are checked for consistency, not speed."""

import json
import math

import flax.linen as nn
import jax
import pytest

from st5_jax import cli, configs
from st5_jax.model import abstract_params


# `--negatives` alone is one hard-negative tower (three towers); `--negatives 3` three (five towers).
@pytest.mark.parametrize("negatives,towers,encode", [(["--negatives"], 3, 64), (["--negatives", "3"], 5, 0)])
def test_bench_reports_consistent_figures(tmp_path, capsys, negatives, towers, encode):
  path = tmp_path / "bench.json"
  assert cli.main(["bench", "--size", "t5_tiny", "--batch", "16", "--length", "16", *negatives, "--steps", "2",
                   "--encode_sentences", str(encode), "--json", str(path)]) == 0
  out = json.loads(path.read_text())
  printed = capsys.readouterr().out
  assert all(k in printed for k in out)  # the table prints every figure the JSON has
  assert (out["devices"], out["global_batch"], out["length"], out["towers"]) == (8, 16, 16, towers)
  assert out["examples_per_sec"] == pytest.approx(16 / out["step_seconds"])
  assert out["tokens_per_sec"] == pytest.approx(16 * 16 * towers / out["step_seconds"])
  assert out["achieved_flops_per_sec"] == pytest.approx(out["step_flops"] / out["step_seconds"])
  assert out["fraction_of_matmul_peak"] == pytest.approx(out["achieved_flops_per_sec"]
                                                         / out["matmul_peak_flops_per_sec"])
  assert ("encode_sentences_per_sec" in out) == bool(encode)
  assert out.get("encode_sentences_per_sec", 1) > 0
  # The step's FLOPs against the 6 x parameters x tokens rule (forward 2, backward 4) over the
  # encoder and projection, for every tower of 16 x 16 tokens: attention scores and logits add a few percent.
  cfg = configs.ST5Config(t5=configs.t5_size("t5_tiny"), embedding_dim=32)
  flat = jax.tree_util.tree_flatten_with_path(nn.unbox(abstract_params(cfg)))[0]
  n = sum(math.prod(x.shape) for p, x in flat if jax.tree_util.keystr(p).startswith(("['encoder']",
                                                                                      "['projection_layer']")))
  assert 1.0 < out["step_flops"] / (6 * n * 16 * 16 * towers) < 1.2


def test_a_negative_count_of_negatives_is_one_clear_line(capsys):
  assert cli.main(["bench", "--negatives", "-1"]) == cli.USER_ERROR_EXIT
  assert capsys.readouterr().err == "st5 bench: error: --negatives must be >= 0 (hard negatives per example), got -1\n"
