"""st5_jax/hostmem.py: the `st5` command re-executes itself once with huge-page malloc."""

from __future__ import annotations

import gc
import json
import os
import pathlib
import platform
import re
import subprocess
import sys

import pytest

from st5_jax import cli, hostmem

REPO = pathlib.Path(__file__).resolve().parents[1]
LINUX = dict(system="Linux", libc=("glibc", "2.36"), thp="madvise")


@pytest.mark.parametrize("environ, kw, expected", [
    ({}, LINUX, True),
    ({}, dict(LINUX, thp="always"), True),
    ({"GLIBC_TUNABLES": "glibc.malloc.tcache_count=0"}, LINUX, True),
    ({hostmem.OPT_OUT: "0"}, LINUX, False),
    ({hostmem.OPT_OUT: "1"}, LINUX, True),
    ({"ST5_HUGETLB_MALLOC_REEXECUTED": "1"}, LINUX, False),  # never twice
    ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}, LINUX, False),  # the user's own choice stands
    ({}, dict(LINUX, thp="never"), False),
    ({}, dict(LINUX, thp=None), False),
    ({}, dict(LINUX, libc=("glibc", "2.34")), False),
    ({}, dict(LINUX, libc=("glibc", "2.35")), True),
    ({}, dict(LINUX, libc=("", "")), False),  # musl
    ({}, dict(LINUX, system="Darwin", libc=("", "")), False),
])
def test_wanted(environ, kw, expected):
  assert hostmem.wanted(environ, **kw) is expected


def test_with_tunable_appends_to_the_users_tunables():
  env = hostmem.with_tunable({"GLIBC_TUNABLES": "glibc.malloc.tcache_count=0", "X": "1"})
  assert env["GLIBC_TUNABLES"] == "glibc.malloc.tcache_count=0:glibc.malloc.hugetlb=1"
  assert env["X"] == "1" and env["ST5_HUGETLB_MALLOC_REEXECUTED"] == "1"
  assert hostmem.with_tunable({})["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=1"


def test_thp_mode_reads_the_bracketed_mode(tmp_path):
  f = tmp_path / "enabled"
  f.write_text("always [madvise] never\n")
  assert hostmem.thp_mode(str(f)) == "madvise"
  assert hostmem.thp_mode(str(tmp_path / "missing")) is None


def test_main_called_from_python_never_reexecutes(monkeypatch, capsys):
  def boom():
    raise AssertionError("re-executed from a Python caller")
  monkeypatch.setattr(hostmem, "reexec_with_hugetlb_malloc", boom)
  with pytest.raises(SystemExit) as e:
    cli.main(["bench", "--help"])
  assert e.value.code == 0
  assert "--negatives" in capsys.readouterr().out


_GC_PROBE = """
import gc, sys
from st5_jax import cli
before = gc.get_threshold()
sys.argv = ["st5", *sys.argv[1:]]
try:
  cli.main()  # as the `st5` program runs it
except SystemExit:
  pass
print(before, gc.get_threshold())
"""


def test_st5_raises_the_gc_thresholds_and_a_python_caller_keeps_its_own():
  env = dict(os.environ, ST5_HUGETLB_MALLOC="0")  # no re-exec: this process prints what main() left
  out = subprocess.run([sys.executable, "-c", _GC_PROBE, "bench", "--help"], capture_output=True, text=True,
                       env=env, timeout=120)
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stdout.strip().splitlines()[-1] == "(700, 10, 10) (50000, 20, 20)"  # CPython's defaults, then ours
  gc.set_threshold(700, 10, 10)
  try:
    with pytest.raises(SystemExit):
      cli.main(["bench", "--help"])  # a library call: the caller's interpreter is left as it was
    assert gc.get_threshold() == (700, 10, 10)
  finally:
    gc.set_threshold(*hostmem.GC_THRESHOLD)  # as conftest set it for this test process


def _platform_has_hugetlb_malloc() -> bool:
  """Linux, glibc >= 2.35 and transparent huge pages on: re-derived here, not through hostmem."""
  libc, version = platform.libc_ver()
  thp = pathlib.Path("/sys/kernel/mm/transparent_hugepage/enabled")
  mode = re.search(r"\[(\w+)\]", thp.read_text()) if thp.exists() else None
  return (platform.system() == "Linux" and libc == "glibc" and mode is not None
          and mode[1] in ("always", "madvise") and tuple(map(int, version.split(".")[:2])) >= (2, 35))


def _bench(tmp_path, name, **env_extra):
  out = tmp_path / f"{name}.json"
  env = {k: v for k, v in os.environ.items()
         if k not in ("XLA_FLAGS", "GLIBC_TUNABLES", hostmem.OPT_OUT, "ST5_HUGETLB_MALLOC_REEXECUTED")}
  env.update(PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu", **env_extra)
  proc = subprocess.run([sys.executable, "-m", "st5_jax.cli", "bench", "--size", "t5_tiny", "--batch", "64",
                         "--length", "32", "--negatives", "--steps", "5", "--encode_sentences", "0", "--json", str(out)],
                        cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(out.read_text())


@pytest.fixture(scope="module")
def benches(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("hostmem")
  return _bench(tmp, "on"), _bench(tmp, "off", **{hostmem.OPT_OUT: "0"})


def test_st5_sets_huge_page_malloc_only_where_the_platform_has_it(benches):
  on, off = benches
  assert off["glibc_tunables"] == ""  # the opt-out is honoured everywhere
  assert on["glibc_tunables"] == (hostmem.TUNABLE if _platform_has_hugetlb_malloc() else "")


def test_st5_on_huge_page_malloc_faults_less(benches):
  if not _platform_has_hugetlb_malloc():
    thp = pathlib.Path("/sys/kernel/mm/transparent_hugepage/enabled")
    pytest.skip(f"needs Linux, glibc >= 2.35 and transparent huge pages on; here {platform.system()}, "
                f"{platform.libc_ver()}, THP {thp.read_text().strip() if thp.exists() else 'absent'}")
  on, off = benches
  # Measured here: ~1,300 vs ~13,900 faults per t5_tiny step (the working set in 2 MiB pages, not 4 KiB).
  assert on["page_faults_per_step"] < 0.5 * off["page_faults_per_step"], (on, off)
