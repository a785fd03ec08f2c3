"""benchmarks/compare_torch.py --quick: both sides' figures, and identical weights on both sides."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]


def _run(args, tmp_path, env_extra=None):
  env = dict(os.environ, PYTHONPATH=str(REPO), **(env_extra or {}))
  env.pop("XLA_FLAGS", None)  # one CPU device, as a user runs it
  return subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=900)


def test_compare_torch_quick(tmp_path):
  out_json = tmp_path / "figures.json"
  proc = _run([str(REPO / "benchmarks" / "compare_torch.py"), "--quick", "--json", str(out_json)], tmp_path)
  assert proc.returncode == 0, proc.stderr[-3000:]
  train = re.findall(r"^train\s+(\S+)\s+agreement max\|diff\| (\S+).*torch ([\d.]+) examples/s\s+st5_jax ([\d.]+) "
                     r"examples/s\s+ratio ([\d.]+)", proc.stdout, re.M)
  encode = re.findall(r"^encode\s+(\S+)\s+agreement max\|diff\| (\S+).*torch ([\d.]+) sentences/s\s+st5_jax ([\d.]+) "
                      r"sentences/s\s+ratio ([\d.]+)", proc.stdout, re.M)
  assert [t[0] for t in train] == ["t5_tiny", "t5_1_1_tiny"], proc.stdout
  assert [e[0] for e in encode] == ["t5_1_1_tiny"], proc.stdout
  for _, diff, torch_rate, jax_rate, ratio in train + encode:
    assert float(diff) < 1e-4
    assert float(torch_rate) > 0 and float(jax_rate) > 0
    assert abs(float(ratio) - float(jax_rate) / float(torch_rate)) < 0.02 * float(ratio) + 0.01
  rows = json.loads(out_json.read_text())["rows"]
  for row in rows:
    if row["part"] == "train":  # same weights, same batch: the same first loss
      assert row["first_loss_abs_diff"] < 1e-3 * abs(row["torch"]["first_loss"]), row
    else:  # the whole STS-B slice, each side with its own tokenizer
      assert row["encode_outputs_max_abs_diff"] < 1e-4, row
