"""tests/timeline.py: a worker's idle time at the end and between tests, from the conftest timeline."""

import json
import os
import pathlib
import subprocess
import sys

import timeline


def test_idle_time_between_tests_and_at_the_end():
  rows = [{"worker": "gw0", "test": "a", "start": 100.0, "end": 130.0},
          {"worker": "gw0", "test": "b", "start": 135.0, "end": 160.0},
          {"worker": "gw1", "test": "c", "start": 101.0, "end": 111.0}]
  text = timeline.summarise(rows, last=1)
  assert "span 60 s" in text and "3 tests, 65 s of tests" in text
  assert "gw0: 2 tests, busy 55 s, between tests 5 s, first at +0 s, done at +60 s (idle 0 s at the end)" in text
  assert "gw1: 1 tests, busy 10 s, between tests 0 s, first at +1 s, done at +11 s (idle 49 s at the end)" in text
  assert "  b\n" in text + "\n" and "  a\n" not in text + "\n"  # only the last test of gw0 is listed
  assert not any(line.startswith("    +") for line in timeline.summarise(rows, last=0).splitlines())


def test_the_conftest_hook_writes_one_line_per_test(tmp_path):
  (tmp_path / "test_two.py").write_text("def test_a():\n  pass\n\ndef test_b():\n  pass\n")
  out = tmp_path / "tl.jsonl"
  tests_dir = str(pathlib.Path(__file__).resolve().parent)
  env = dict(os.environ, ST5_TEST_TIMELINE=str(out),
             PYTHONPATH=os.pathsep.join([tests_dir, os.environ.get("PYTHONPATH", "")]))
  env.pop("PYTEST_XDIST_WORKER", None)  # set when this test runs on an xdist worker: the child is not one
  # This suite's conftest as a plugin of a pytest run on another folder.
  cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "conftest", "-c", os.devnull,
         "--rootdir", str(tmp_path), str(tmp_path / "test_two.py")]
  proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
  rows = [json.loads(line) for line in out.read_text().splitlines()]
  assert [r["test"].rsplit("::", 1)[1] for r in rows] == ["test_a", "test_b"]
  assert all(r["worker"] == "main" and r["end"] >= r["start"] for r in rows)
