"""benchmarks/step_ab.py with HEAD as base: both sides ran from their own roots, figures agree, worktree removed."""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "step_ab.py"


def test_step_ab_runs_both_sides_and_cleans_up(tmp_path):
  out_json = tmp_path / "ab.json"
  # From a folder outside the checkout, with the tests' 8-device XLA_FLAGS inherited: the script drops the count.
  assert "--xla_force_host_platform_device_count=8" in os.environ["XLA_FLAGS"]  # (conftest.py)
  args = ["--base", "HEAD", "--rounds", "1", "--steps", "1", "--no_negatives", "--size", "t5_tiny", "--batch", "8",
          "--length", "8", "--json", str(out_json)]
  proc = subprocess.run([sys.executable, str(SCRIPT), *args], cwd=tmp_path, capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  ab = json.loads(out_json.read_text())

  (r,) = ab["rounds"]
  assert r["order"] == ["base", "head"]
  for side in ("base", "head"):  # the bench flags reached both sides; one CPU device, as a user runs it
    f = r[side]
    assert (f["size"], f["global_batch"], f["length"], f["towers"], f["devices"]) == ("t5_tiny", 8, 8, 2, 1)
    assert f["examples_per_sec"] == pytest.approx(8 / f["step_seconds"]) and f["examples_per_sec"] > 0
    assert ab["summary"][side]["median"] == ab["summary"][side]["min"] == f["examples_per_sec"]
    assert ab["summary"][side]["spread_pct"] == 0
  assert r["ratio"] == pytest.approx(r["head"]["examples_per_sec"] / r["base"]["examples_per_sec"])
  assert ab["summary"]["ratio_of_medians"] == pytest.approx(r["ratio"])
  assert ab["summary"]["paired_ratio"]["median"] == pytest.approx(r["ratio"])
  assert ab["summary"]["paired_ratio"]["head_faster_rounds"] == int(r["ratio"] > 1)
  assert "--negatives" not in ab["command"] and "--size t5_tiny" in ab["command"]
  assert ab["base"]["glibc_tunables"] == ab["head"]["glibc_tunables"]  # both sides ran under the same malloc

  # Each side imported st5_jax from its own root: the base's worktree (outside the checkout), the head's checkout.
  worktree = pathlib.Path(ab["base"]["root"])
  assert not worktree.is_relative_to(REPO)
  assert ab["base"]["st5_jax"] == [str(worktree / "st5_jax" / "__init__.py")]
  assert ab["head"]["st5_jax"] == [str(REPO / "st5_jax" / "__init__.py")]
  head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, check=True, capture_output=True, text=True)
  assert ab["base"]["commit"] == ab["head"]["commit"] == head.stdout.strip()

  # The worktree is gone: from the disk and from git's list.
  assert not worktree.exists() and not worktree.parent.exists()
  listed = subprocess.run(["git", "worktree", "list", "--porcelain"], cwd=REPO, check=True, capture_output=True,
                          text=True).stdout
  assert str(worktree) not in listed

  assert "head/base: ratio of medians" in proc.stdout and f"{r['ratio']:.3f}" in proc.stdout

  # Rounds alternate their order (one round above runs only the first).
  spec = importlib.util.spec_from_file_location("step_ab", SCRIPT)
  step_ab = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(step_ab)
  assert [step_ab.round_order(i) for i in range(3)] == [["base", "head"], ["head", "base"], ["base", "head"]]
