"""Host memory: glibc's malloc on transparent huge pages, for the `st5` command.

XLA:CPU allocates a step's temporaries afresh on every call, and glibc serves large blocks
from fresh mmaps (or trims them back to the kernel), so each step faults its whole working
set in 4 KiB pages: about 92,000 page faults per `t5_mini` train step on the development
machine, about a quarter of the step's time (docs/performance.md). glibc >= 2.35 can back
malloc with transparent huge pages (tunable `glibc.malloc.hugetlb=1`: 2 MiB pages, 512x
fewer faults); glibc reads tunables only when a process starts, so `st5` re-executes itself
once with it set. Nothing else changes: same program, same PID, same numbers.

`ST5_HUGETLB_MALLOC=0` leaves malloc alone. Library users set it themselves:
`GLIBC_TUNABLES=glibc.malloc.hugetlb=1 python my_script.py`.

Python's cyclic garbage collector: `st5` also raises its thresholds (`GC_THRESHOLD`), below.
"""

from __future__ import annotations

import gc
import os
import platform
import sys
from typing import Mapping

TUNABLE = "glibc.malloc.hugetlb=1"
OPT_OUT = "ST5_HUGETLB_MALLOC"  # "0": never re-execute
_DONE = "ST5_HUGETLB_MALLOC_REEXECUTED"  # set before the exec: at most one re-exec, even if glibc drops the tunable
_THP = "/sys/kernel/mm/transparent_hugepage/enabled"
MIN_GLIBC = (2, 35)  # the first glibc with glibc.malloc.hugetlb


def thp_mode(path: str = _THP) -> str | None:
  """The kernel's transparent huge page mode ('always', 'madvise', 'never'), None if unknown."""
  try:
    text = open(path, encoding="ascii").read()
  except OSError:
    return None
  start, end = text.find("["), text.find("]")
  return text[start + 1:end] if 0 <= start < end else None


def wanted(environ: Mapping[str, str], *, system: str, libc: tuple[str, str], thp: str | None) -> bool:
  """Whether re-executing with the tunable would change anything (a pure decision, for tests)."""
  if environ.get(OPT_OUT, "1") == "0" or environ.get(_DONE):
    return False
  if "glibc.malloc.hugetlb" in environ.get("GLIBC_TUNABLES", ""):
    return False  # the user chose a value
  if system != "Linux" or libc[0] != "glibc" or thp not in ("always", "madvise"):
    return False
  try:
    version = tuple(int(x) for x in libc[1].split(".")[:2])
  except ValueError:
    return False
  return version >= MIN_GLIBC


def with_tunable(environ: Mapping[str, str]) -> dict[str, str]:
  """A copy of `environ` with the tunable appended to GLIBC_TUNABLES (colon-separated, as glibc reads it)."""
  env = dict(environ)
  env["GLIBC_TUNABLES"] = ":".join(t for t in (env.get("GLIBC_TUNABLES", ""), TUNABLE) if t)
  env[_DONE] = "1"
  return env


def reexec_with_hugetlb_malloc() -> None:
  """Replaces this process by itself with the tunable set, when `wanted`; returns otherwise.

  Call it first thing in a program's entry point, before threads or files are opened.
  """
  argv = getattr(sys, "orig_argv", None)
  if not argv or not sys.executable:
    return
  if not wanted(os.environ, system=platform.system(), libc=platform.libc_ver(), thp=thp_mode()):
    return
  sys.stdout.flush()
  sys.stderr.flush()
  os.execve(sys.executable, [sys.executable, *argv[1:]], with_tunable(os.environ))


# CPython collects its youngest generation every 700 net allocations of container objects,
# and each full collection walks every object alive: the millions that importing JAX,
# TensorFlow and seqio leave behind. JAX's tracing and lowering allocate millions more,
# so with the defaults a process spends over a tenth of its time in the collector: 9.7 s of
# a 70 s compile-bound test file (tests/test_layer_attention.py), 2.3 s of each pod-rehearsal
# worker's start, most of it in full collections during the imports. With these thresholds:
# 3.6 s and 0.8 s (gc.callbacks timing, docs/performance.md). Cycles are still collected,
# 70x less often; reference counting frees everything else at once, as before.
GC_THRESHOLD = (50_000, 20, 20)


def raise_gc_threshold() -> None:
  """Sets `GC_THRESHOLD` for this process; call it before the heavy imports."""
  gc.set_threshold(*GC_THRESHOLD)
