"""benchmarks/compare_torch.py --quick: both sides' figures, and identical weights on both sides."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

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
  figures = json.loads(out_json.read_text())
  rows = figures["rows"]
  assert figures["matmul_peak"]["peak"] == max(figures["matmul_peak"]["jax"], figures["matmul_peak"]["torch"]) > 0
  for row in rows:  # the ceiling (model FLOPs at the matmul peak) bounds both sides
    rate = "examples_per_s" if row["part"] == "train" else "sentences_per_s"
    assert row["torch"][rate] < row["ceiling"] and row["jax"][rate] < row["ceiling"], row
  assert len(re.findall(r"\|\s+ceiling [\d.]+ (?:examples|sentences)/s = [\d.]+x torch$", proc.stdout, re.M)) == 3
  for row in rows:
    if row["part"] == "train":  # same weights, same batch: the same first loss
      assert row["first_loss_abs_diff"] < 1e-3 * abs(row["torch"]["first_loss"]), row
    else:  # the whole STS-B slice, each side with its own tokenizer
      assert row["encode_outputs_max_abs_diff"] < 1e-4, row


def test_gpu_script_falls_back_to_cpu_tiny(tmp_path):
  # A machine whose nvidia-smi lists no GPU: the script must say so and run the tiny CPU shapes.
  fake_bin = tmp_path / "bin"
  fake_bin.mkdir()
  (fake_bin / "nvidia-smi").write_text("#!/bin/sh\nexit 0\n")
  (fake_bin / "nvidia-smi").chmod(0o755)
  out = tmp_path / "figures"
  env = dict(os.environ, PATH=f"{fake_bin}:{os.environ['PATH']}", ST5_PYTHON=sys.executable, ST5_GPU_OUT=str(out),
             ST5_GPU_PEAK_TFLOPS="0.001", PYTHONPATH=str(REPO))
  env.pop("XLA_FLAGS", None)
  proc = subprocess.run(["bash", str(REPO / "benchmarks" / "gpu.sh")], cwd=REPO, env=env, capture_output=True,
                        text=True, timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "no NVIDIA GPU found" in proc.stderr
  for size in ("t5_tiny", "t5_1_1_tiny"):
    r = json.loads((out / f"bench_{size}.json").read_text())
    assert r["backend"] == "cpu" and r["towers"] == 3 and r["global_batch"] == 8
    row = re.search(rf"^{size}\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)%", proc.stdout, re.M)
    assert row, proc.stdout
    # MFU = achieved model FLOP/s / the peak (here ST5_GPU_PEAK_TFLOPS = 1 GFLOP/s).
    assert float(row[4]) == pytest.approx(100 * r["achieved_flops_per_sec"] / 1e9, rel=2e-3, abs=0.06)
  assert "MFU against ST5_GPU_PEAK_TFLOPS" in proc.stdout


def test_profile_step_quick(tmp_path):
  out_json = tmp_path / "profile.json"
  proc = _run([str(REPO / "benchmarks" / "profile_step.py"), "--quick", "--json", str(out_json)], tmp_path)
  assert proc.returncode == 0, proc.stderr[-3000:]
  prof = json.loads(out_json.read_text())
  total = prof["thunk_ms_per_step"]
  # Every traced op is attributed to one kind and one phase.
  assert sum(prof["kinds_ms"].values()) == pytest.approx(total, rel=1e-6)
  assert sum(prof["phases_ms"].values()) == pytest.approx(total, rel=1e-6)
  assert prof["kinds_ms"]["matmul"] > 0 and prof["phases_ms"]["forward"] > 0 and prof["phases_ms"]["backward"] > 0
  assert prof["phases_ms"].get("unattributed", 0) < 0.2 * total
  assert "matmul" in proc.stdout and "backward" in proc.stdout
