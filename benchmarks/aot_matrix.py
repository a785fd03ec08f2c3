"""Every paper run x TPU generation through `st5 aot`: compile what is missing, then print docs/tpu.md's tables.

  python benchmarks/aot_matrix.py --results DIR --compile [-j 2] [-k 11b]   # resumable: skips finished reports
  python benchmarks/aot_matrix.py --results DIR > tables.md                  # docs/tpu.md's tables

DIR/other_slices/*.json, reports of other slices or meshes than the matrix's (e.g. `st5 aot --gin RUN.gin
--gin targets/v6e_256.gin --slice v6e-64 --json ...`), get a table of their own.

Each compile is its own `st5 aot --gin RUN.gin [--gin targets/T.gin] --json DIR/RUN__T.json` process
(T = `v4` for a run's own v4 slice), the reports `tests/run.sh --aot-all` writes with ST5_AOT_RESULTS=DIR.
Every step time here is the compiled program's roofline ESTIMATE (st5_jax/aot.py), never a measurement.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import pathlib
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]

SIZES = ["base", "large", "3b", "11b", "1_1_base", "1_1_large", "1_1_xl", "1_1_xxl"]
PAPER_RUNS = [f"st5_{size}_{arch}{stage}.gin"
              for size in SIZES for arch in ("enc", "encdec") for stage in ("", "_stage2")]
LARGE = ("3b", "11b", "1_1_xl", "1_1_xxl")
GENERATIONS = ("v4", "v5e", "v5p", "v6e")
# The slice each generation runs a size on (v4: the run's own target). Other slices (e.g. targets/v6e_64.gin, cheaper
# for 11B) are A/Bs in DIR/other_slices.
SMALL_TARGET = {"v5e": "v5e_16", "v5p": "v5p_16", "v6e": "v6e_16"}
LARGE_TARGET = {"v5e": "v5e_256", "v5p": "v5p_128", "v6e": "v6e_256"}
STEPS = {"stage 1": 50_000, "stage 2": 3_000}  # the paper's steps per stage (docs/training.md)


def size_of(run: str) -> str:
  return run[len("st5_"):].rsplit("_enc", 1)[0]


def stage_of(run: str) -> str:
  return "stage 2" if run.endswith("_stage2.gin") else "stage 1"


def target(run: str, generation: str) -> str | None:
  """The target gin file (under gin/targets/) of `run` on `generation`; None: the run's own (v4) slice."""
  if generation == "v4":
    return None
  return (LARGE_TARGET if size_of(run) in LARGE else SMALL_TARGET)[generation]


def report_path(results: pathlib.Path, run: str, generation: str) -> pathlib.Path:
  return results / f"{run[:-len('.gin')]}__{target(run, generation) or 'v4'}.json"


def compile_one(results: pathlib.Path, run: str, generation: str, timeout: int, *, redo: bool = False) -> str:
  """Compiles `run` for `generation`'s target into its report in `results`; one line saying how it went."""
  out = report_path(results, run, generation)
  if out.exists() and not redo:
    return f"{out.name}: already there"
  t = target(run, generation)
  env = dict(os.environ)
  env.pop("JAX_PLATFORMS", None)  # st5 aot asks libtpu for the topology
  tmp = out.with_suffix(".json.tmp")
  tmp.unlink(missing_ok=True)  # a killed compile's leftover is not this compile's report
  command = [sys.executable, "-m", "st5_jax.cli", "aot", "--gin", run, *(["--gin", f"targets/{t}.gin"] if t else []),
             "--json", str(tmp)]
  start = time.time()
  try:
    proc = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO, timeout=timeout)
  except subprocess.TimeoutExpired:
    return f"{out.name}: timed out after {timeout} s"
  log = results / f"{out.stem}.log"
  log.unlink(missing_ok=True)
  # Exit 1 with a report: compiled, does not fit (stderr says why and what would make it fit). Anything else
  # but 0 is a failure, whatever was written.
  fits = json.loads(tmp.read_text())["fits"] if tmp.exists() and proc.returncode in (0, 1) else None
  if proc.returncode or fits is None:
    log.write_text(proc.stdout + proc.stderr)
  if fits is None or fits != (proc.returncode == 0):
    return f"{out.name}: failed (rc {proc.returncode}; {log.name})"
  tmp.rename(out)  # only a whole report counts as done, so an interrupted matrix resumes
  return f"{out.name}: {time.time() - start:.0f} s" + ("" if fits else f", does not fit ({log.name})")


def load(results: pathlib.Path) -> dict[tuple[str, str], dict]:
  found = {}
  for run in PAPER_RUNS:
    for generation in GENERATIONS:
      path = report_path(results, run, generation)
      if path.exists():
        found[run, generation] = json.loads(path.read_text())
  return found


def chip_hours(r: dict, run: str) -> str:
  """Chips x the run's steps x the estimated step time, in hours (one decimal below 10: stage 2 is short)."""
  hours = r["devices"] * STEPS[stage_of(run)] * r["roofline_step_seconds"] / 3600
  return f"{hours:,.1f}" if hours < 10 else f"{hours:,.0f}"


def _estimate_cells(r: dict, run: str) -> str:
  """'fits: total / HBM | step time: compute / HBM / ICI | implied MFU | chip-hours' of one report."""
  return (f"{'yes' if r['fits'] else '**no**'}: {r['total_bytes'] / 2**30:.2f} / {r['hbm_bytes'] / 2**30:.0f} GiB | "
          f"**{r['roofline_step_seconds']:.3f} s**: {r['roofline_compute_seconds']:.3f} / "
          f"{r['roofline_memory_seconds']:.3f} / {r['roofline_collective_seconds']:.3f} | {r['implied_mfu']:.0%} | "
          f"{chip_hours(r, run)} ({STEPS[stage_of(run)]:,} steps)")


def load_others(folder: pathlib.Path) -> dict[str, dict]:
  """{file name: report} of the A/B reports in `folder` (none if it does not exist)."""
  return {p.name: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))}


def tables(found: dict[tuple[str, str], dict], others: dict[str, dict] | None = None) -> str:
  """The run x generation table, the per-chip detail of its compiled rows and the cheapest slice per run (among
  the matrix's targets and the `others` reports of the same run)."""
  lines = ["| gin file | gen. | target: slice (chips), mesh | fits: per-chip total / HBM | step time, roofline "
           "ESTIMATE: compute / HBM / ICI | implied MFU (estimate) | chip-hours of the run (estimate) |",
           "|---|---|---|---|---|---|---|"]
  for run in PAPER_RUNS:
    for generation in GENERATIONS:
      t = target(run, generation)
      target_label = f"targets/{t}.gin" if t else "its own (v4)"
      r = found.get((run, generation))
      if r is None:
        command = f"st5 aot --gin {run}" + (f" --gin targets/{t}.gin" if t else "")
        lines.append(f"| {run} | {generation} | {target_label} | not compiled yet: `{command}` | | | |")
        continue
      mesh = " x ".join(str(v) for v in r["mesh"].values())
      lines.append(f"| {run} | {generation} | {target_label}: {r['topology']} ({r['devices']}), {mesh} | "
                   f"{_estimate_cells(r, run)} |")
  lines += ["", "| gin file | gen. | per-chip: state / temps (GiB) | compiled FLOPs per chip | XLA cost analysis FLOPs "
            "(loop bodies once) | HBM bytes per chip | ICI bytes sent per chip | loops (trip counts) | compile |",
            "|---|---|---|---|---|---|---|---|---|"]
  for (run, generation), r in found.items():
    loops = ", ".join(str(n) for n in sorted(set(n for n in r.get("loop_trip_counts") or [] if n)))
    lines.append(f"| {run} | {generation} | {r['state_bytes'] / 2**30:.2f} / {r['temp_bytes'] / 2**30:.2f} | "
                 f"{r['compiled_flops']:.3e} | {r['xla_cost_flops']:.3e} | {r['bytes_accessed']:.3e} | "
                 f"{r['collective_bytes']:.3e} | {loops} | {r['compile_seconds']:.0f} s |")
  lines += ["", "| gin file | chip-hours (estimate) by compiled generation | cheapest compiled slice that fits (other "
            "slices too) |",
            "|---|---|---|"]
  for run in PAPER_RUNS:
    done = [(g, found[run, g]) for g in GENERATIONS if (run, g) in found]
    if not done:
      continue
    by_gen = ", ".join(f"{g} {chip_hours(r, run)}" + ("" if r["fits"] else " (does not fit)") for g, r in done)
    labels = {g: f"{g}, targets/{target(run, g)}.gin" if target(run, g) else "v4, its own target" for g, _ in done}
    fitting = [(r["devices"] * r["roofline_step_seconds"], labels[g], r) for g, r in done if r["fits"]]
    fitting += [(r["devices"] * r["roofline_step_seconds"], f"{r['topology']}, other_slices/{name}", r)
                for name, r in (others or {}).items() if r["name"].split(" + ")[0] == run and r["fits"]]
    if fitting:
      _, best_label, r = min(fitting, key=lambda x: x[0])
      best = f"{best_label} ({r['devices']} chips): {chip_hours(r, run)} chip-hours"
    else:
      best = "none of the compiled slices"
    missing = [g for g in GENERATIONS if (run, g) not in found]
    lines.append(f"| {run} | {by_gen}{' (not compiled: ' + ', '.join(missing) + ')' if missing else ''} | {best} |")
  return "\n".join(lines)


def other_slices_table(folder: pathlib.Path) -> str:
  """One row per report in `folder` (A/Bs: another slice or mesh than the matrix's target), by file name."""
  lines = ["| report | gin files | slice (chips), mesh data x fsdp x model | fits: per-chip total / HBM | step time, "
           "roofline ESTIMATE: compute / HBM / ICI | implied MFU (estimate) | chip-hours of the run (estimate) |",
           "|---|---|---|---|---|---|---|"]
  for path in sorted(folder.glob("*.json")):
    r = json.loads(path.read_text())
    run = r["name"].split(" + ")[0]
    mesh = " x ".join(str(v) for v in r["mesh"].values())
    lines.append(f"| {path.name} | {r['name']} | {r['topology']} ({r['devices']}), {mesh} | "
                 f"{_estimate_cells(r, run)} |")
  return "\n".join(lines)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--results", default=os.environ.get("ST5_AOT_RESULTS"), required="ST5_AOT_RESULTS" not in os.environ,
                 help="Folder of the RUN__TARGET.json reports (default: $ST5_AOT_RESULTS).")
  p.add_argument("--compile", action="store_true", help="Compile the missing reports first.")
  p.add_argument("-j", "--jobs", type=int, default=1, help="Compiles at once (each mostly uses one core).")
  p.add_argument("-k", "--only", default="", help="Compile only runs / targets whose 'RUN TARGET' contains this.")
  p.add_argument("--timeout", type=int, default=3600, help="Seconds per compile.")
  args = p.parse_args(argv)
  results = pathlib.Path(args.results)
  results.mkdir(parents=True, exist_ok=True)
  if args.compile:
    todo = [(run, g) for run in PAPER_RUNS for g in GENERATIONS
            if args.only in f"{run} {target(run, g) or 'v4'}" and not report_path(results, run, g).exists()]
    print(f"{len(todo)} compiles to run", file=sys.stderr, flush=True)
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
      futures = [pool.submit(compile_one, results, run, g, args.timeout) for run, g in todo]
      for future in concurrent.futures.as_completed(futures):
        print(future.result(), file=sys.stderr, flush=True)
  others = load_others(results / "other_slices")
  print(tables(load(results), others))
  if others:
    print("\n" + other_slices_table(results / "other_slices"))
  return 0


if __name__ == "__main__":
  sys.exit(main())
