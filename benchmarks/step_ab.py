"""Train-step speed of this checkout against a pinned earlier commit, on this machine, in interleaved rounds.

    python benchmarks/step_ab.py                                        # b5f931f, 7 rounds of 40 steps
    python benchmarks/step_ab.py --base HEAD~3 --rounds 9 --steps 80 --json ab.json
    python benchmarks/step_ab.py --size t5_tiny --steps 2 --rounds 1    # `st5 bench` flags override its defaults

Each run is `python -m st5_jax.cli bench --size t5_mini --batch 64 --length 32 --negatives --encode_sentences 0
--steps N` (issue 38's command; any other flags go to `st5 bench`, the last of a flag wins; `--no_negatives`
drops the hard-negative tower) in a fresh process from this one venv: "base" with PYTHONPATH and cwd on a
detached `git worktree` of --base in a temporary folder (removed at the end, also on Ctrl-C), "head" on this
checkout's working tree (uncommitted changes included). A few lines of wrapper code assert in each child that
st5_jax was imported from its side's root, then call the same `st5_jax.cli.main` that `st5` calls, so both sides
re-execute themselves with huge-page malloc alike (st5_jax/hostmem.py); the GLIBC_TUNABLES each side ran under
is read back from its bench JSON. Rounds alternate the order (base-head, head-base, ...) so drift hits both sides
evenly. Both sides get the same environment: JAX_PLATFORMS=cpu, and XLA_FLAGS without the tests' fake device
count (one CPU device, as a user runs it). Prints figures; asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.realpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
BENCH_DEFAULTS = ["--size", "t5_mini", "--batch", "64", "--length", "32", "--encode_sentences", "0"]
_MARK = "step_ab st5_jax:"
# Runs in each child: fail unless st5_jax came from the side's root, then be `st5` (re-exec included).
_CHILD = f"""
import os, sys
import st5_jax
root, path = os.environ["STEP_AB_ROOT"], os.path.realpath(st5_jax.__file__)
assert path.startswith(root + os.sep), f"imported st5_jax from {{path}}, expected under {{root}}"
print({_MARK!r}, path, flush=True)
from st5_jax import cli
sys.exit(cli.main())
"""


def git(*args: str) -> str:
  return subprocess.run(["git", *args], cwd=REPO, check=True, capture_output=True, text=True).stdout.strip()


def child_env(root: str) -> dict:
  env = dict(os.environ, PYTHONPATH=root, STEP_AB_ROOT=root, JAX_PLATFORMS="cpu")
  env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split()
                              if not f.startswith("--xla_force_host_platform_device_count="))
  env.pop("ST5_HUGETLB_MALLOC_REEXECUTED", None)  # an inherited one would stop one side's re-exec (hostmem.py)
  return env


def run_side(side: str, root: str, bench_args: list[str], json_path: str) -> dict:
  """One `st5 bench` run from `root`; its JSON figures plus the st5_jax it imported."""
  proc = subprocess.run([sys.executable, "-c", _CHILD, "bench", *bench_args, "--json", json_path],
                        cwd=root, env=child_env(root), capture_output=True, text=True)
  if proc.returncode != 0:
    sys.stderr.write(proc.stderr[-3000:])
    lines = proc.stderr.strip().splitlines() or ["(no output)"]
    raise SystemExit(f"step_ab.py: the {side} run failed (exit {proc.returncode}): {lines[-1]}")
  paths = set(re.findall(rf"^{_MARK} (.+)$", proc.stdout, re.M))
  assert len(paths) == 1, f"{side}: expected one st5_jax path in the child's output, got {paths}"
  with open(json_path) as f:
    return dict(json.load(f), st5_jax=paths.pop())


def round_order(i: int) -> list[str]:
  """base-head, head-base, base-head, ...: a drift in the machine's speed hits both sides evenly."""
  return ["base", "head"] if i % 2 == 0 else ["head", "base"]


def summary(xs: list[float]) -> dict:
  med = statistics.median(xs)
  return {"median": med, "min": min(xs), "max": max(xs), "spread_pct": 100 * (max(xs) - min(xs)) / med}


def cpu_model() -> str:
  try:
    with open("/proc/cpuinfo") as f:
      return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "unknown")
  except OSError:
    return "unknown"


def main() -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
  p.add_argument("--base", default="b5f931f", help="The pinned earlier commit (any git revision).")
  p.add_argument("--rounds", type=int, default=7, help="Rounds; each runs both sides once, order alternating.")
  p.add_argument("--steps", type=int, default=40, help="Timed steps per run (`st5 bench --steps`).")
  p.add_argument("--no_negatives", action="store_true", help="Two towers: leave out `st5 bench --negatives`.")
  p.add_argument("--json", default=None, help="Also write every figure as JSON to this file.")
  args, extra = p.parse_known_args()
  if args.rounds < 1 or args.steps < 1:
    p.error(f"--rounds and --steps must be at least 1, got {args.rounds} and {args.steps}")
  try:
    base_commit = git("rev-parse", "--verify", "--quiet", args.base + "^{commit}")
  except subprocess.CalledProcessError:
    p.error(f"--base {args.base!r} is not a commit of the repository at {REPO}")
  bench_args = BENCH_DEFAULTS + ([] if args.no_negatives else ["--negatives"]) + extra + ["--steps", str(args.steps)]
  signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))  # so `finally` removes the worktree

  tmp = os.path.realpath(tempfile.mkdtemp(prefix="step_ab_"))
  worktree = os.path.join(tmp, "base")
  roots = {"base": worktree, "head": REPO}
  rounds, load_start = [], os.getloadavg()
  try:
    git("worktree", "add", "--detach", worktree, base_commit)
    for i in range(args.rounds):
      order = round_order(i)
      r = {"round": i + 1, "order": order}
      for side in order:
        r[side] = run_side(side, roots[side], bench_args, os.path.join(tmp, f"{side}_{i}.json"))
      r["ratio"] = r["head"]["examples_per_sec"] / r["base"]["examples_per_sec"]
      rounds.append(r)
      print(f"round {i + 1}/{args.rounds} ({'-'.join(order)}): base {r['base']['examples_per_sec']:.1f}  "
            f"head {r['head']['examples_per_sec']:.1f} examples/s  head/base {r['ratio']:.3f}", flush=True)
  finally:
    subprocess.run(["git", "worktree", "remove", "--force", worktree], cwd=REPO, capture_output=True)
    subprocess.run(["git", "worktree", "prune"], cwd=REPO, capture_output=True)
    shutil.rmtree(tmp, ignore_errors=True)

  sides = {s: summary([r[s]["examples_per_sec"] for r in rounds]) for s in ("base", "head")}
  ratios = [r["ratio"] for r in rounds]
  head_commit = git("rev-parse", "--short", "HEAD")
  out = {
      "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
      "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "load_start": load_start, "load_end": os.getloadavg()},
      "base": {"ref": args.base, "commit": git("rev-parse", "--short", base_commit), "root": worktree},
      "head": {"commit": head_commit, "describe": git("describe", "--always", "--dirty"), "root": REPO,
               "label": f"working tree of {head_commit}"},
      "env": {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": child_env(REPO)["XLA_FLAGS"]},
      "command": "PYTHONPATH=ROOT python -m st5_jax.cli bench " + shlex.join(bench_args) + " --json F  (cwd ROOT)",
      "script": shlex.join([sys.executable, *sys.argv]),
      "rounds": rounds,
      "summary": {**sides, "ratio_of_medians": sides["head"]["median"] / sides["base"]["median"],
                  "paired_ratio": {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios),
                                   "head_faster_rounds": sum(x > 1 for x in ratios), "rounds": len(ratios)}},
  }
  for s in ("base", "head"):
    out[s]["glibc_tunables"] = sorted({r[s].get("glibc_tunables", "(not reported)") for r in rounds})
    out[s]["st5_jax"] = sorted({r[s]["st5_jax"] for r in rounds})

  m, b, h, sm = out["machine"], out["base"], out["head"], out["summary"]
  print(f"\ndate     {out['date']}")
  print(f"machine  {m['cpu']}, {m['cores']} cores, load {m['load_start'][0]:.2f} at start, {m['load_end'][0]:.2f} "
        f"at end")
  print(f"base     {b['commit']} ({b['ref']}), st5_jax from {b['st5_jax']}, GLIBC_TUNABLES {b['glibc_tunables']}")
  print(f"head     {h['label']} ({h['describe']}), st5_jax from {h['st5_jax']}, GLIBC_TUNABLES {h['glibc_tunables']}")
  print(f"command  JAX_PLATFORMS=cpu XLA_FLAGS={shlex.quote(out['env']['XLA_FLAGS'])} {out['command']}")
  print("\nround  order      base ex/s  head ex/s  head/base")
  for r in rounds:
    print(f"{r['round']:<6} {'-'.join(r['order']):<10} {r['base']['examples_per_sec']:>9.1f}  "
          f"{r['head']['examples_per_sec']:>9.1f}  {r['ratio']:>9.3f}")
  print("\nside   median ex/s  min-max          spread")
  for s in ("base", "head"):
    x = sm[s]
    print(f"{s:<6} {x['median']:>11.1f}  {x['min']:>6.1f}-{x['max']:<7.1f}  {x['spread_pct']:>5.1f}%")
  pr = sm["paired_ratio"]
  print(f"\nhead/base: ratio of medians {sm['ratio_of_medians']:.3f}; per-round ratios median {pr['median']:.3f} "
        f"(min-max {pr['min']:.3f}-{pr['max']:.3f}), head faster in {pr['head_faster_rounds']} of {pr['rounds']}")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(out, f, indent=2)
  return 0


if __name__ == "__main__":
  try:
    sys.exit(main())
  except KeyboardInterrupt:
    sys.exit("step_ab.py: interrupted (the worktree was removed)")
