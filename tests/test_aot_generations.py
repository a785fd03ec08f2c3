"""Today's TPU generations through `st5 aot`: the pinned libtpu describes v4, v5e, v5p and v6e
slices with the hosts Cloud TPU builds them from; a tiny step compiles for one small topology of
each generation through the command's own code path, with the roofline estimate from that
chip's figures; the target files combine with any run; and (marker `aot_all`) every paper run
compiles for each generation's target and fits.
"""

import importlib.util
import itertools
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

from st5_jax import aot, gin_config
from st5_jax.gin_config import parse_gin

REPO = pathlib.Path(__file__).resolve().parents[1]

# Slice -> (topology, chips, hosts), as Google's Cloud TPU docs list them: v4 and v5p hosts hold 4
# chips (a 2x2x1 tray); a v5e/v6e slice of up to 8 chips is one host, larger ones are made of
# 4-chip VMs (the v6e table: 4x4 = 4 VMs, 16x16 = 64 VMs of ct6e-standard-4t).
SLICES = {
    "v4-8": ("v4:2x2x1", 4, 1),
    "v4-16": ("v4:2x2x2", 8, 2),
    "v4-256": ("v4:4x4x8", 128, 32),
    "v5p-8": ("v5:2x2x1", 4, 1),
    "v5p-16": ("v5:2x2x2", 8, 2),
    "v5p-128": ("v5:4x4x4", 64, 16),
    "v5e-4": ("v5e:2x2", 4, 1),
    "v5e-8": ("v5e:2x4", 8, 1),
    "v5e-16": ("v5e:4x4", 16, 4),
    "v5e-64": ("v5e:8x8", 64, 16),
    "v5e-256": ("v5e:16x16", 256, 64),
    "v6e-4": ("v6e:2x2", 4, 1),
    "v6e-8": ("v6e:2x4", 8, 1),
    "v6e-16": ("v6e:4x4", 16, 4),
    "v6e-64": ("v6e:8x8", 64, 16),
    "v6e-256": ("v6e:16x16", 256, 64),
}
GENERATION = {"v4": ("TPU v4", "v4"), "v5p": ("TPU v5", "v5p"), "v5e": ("TPU v5 lite", "v5e"),
              "v6e": ("TPU v6 lite", "v6e")}


@pytest.mark.parametrize("slice_name", SLICES)
def test_libtpu_describes_the_slice_with_its_real_hosts(slice_name):
  topology, chips, hosts = SLICES[slice_name]
  assert aot.topology_for_slice(slice_name) == topology
  devices = list(aot.get_topology(topology).devices)  # raises, naming the topology, where libtpu cannot
  kind, generation = GENERATION[slice_name.split("-")[0]]
  assert len(devices) == chips and {d.device_kind for d in devices} == {kind}
  assert aot.chip_spec(devices[0]).generation == generation
  per_host = {}
  for d in devices:
    per_host[d.process_index] = per_host.get(d.process_index, 0) + 1
  assert len(per_host) == hosts and set(per_host.values()) == {chips // hosts}
  sides = [int(n) for n in topology.split(":")[1].split("x")] + [1]  # a 2D slice is one chip deep
  assert {tuple(d.coords) for d in devices} == set(itertools.product(*(range(n) for n in sides[:3])))


def test_host_shapes_per_generation():
  assert aot.host_bounds("v4:4x4x8") == aot.host_bounds("v5:2x2x2") == (2, 2, 1)
  assert aot.host_bounds("v5e:2x4") == aot.host_bounds("v6e:2x4") == (2, 4, 1)  # one 8-chip VM
  assert aot.host_bounds("v5e:2x2") == (2, 2, 1)
  assert aot.host_bounds("v5e:16x16") == aot.host_bounds("v6e:4x4") == (2, 2, 1)  # 4-chip VMs
  with pytest.raises(ValueError, match="Unknown TPU topology"):
    aot.host_bounds("v7x:2x2x1")


# Small enough to compile in seconds: the trainer's step (scanned, rematerialised, bfloat16) of
# T5 tiny (2 layers), pairs of 8 tokens, no dropout.
TINY = """
include 'runs/base.gin'
include 'models/t5_tiny.gin'
st5_model.embedding_dim = 32
st5_model.dropout_rate = 0.0
st5_model.dtype = 'bfloat16'
st5_model.scan_layers = True
st5_model.remat_policy = 'full'
TASK_FEATURE_LENGTHS = {'inputs': 8, 'targets': 8}
DataConfig.task = 'st5_snli_devtest_triples'
TrainConfig.global_batch_size = 16
TrainConfig.num_train_steps = 10
"""
# One small topology per generation.
TINY_SLICES = ("v4-8", "v5e-4", "v5p-8", "v6e-4")


@pytest.fixture(scope="module")
def tiny_reports(tmp_path_factory):
  """`st5 aot --gin tiny.gin --slice S` for each of TINY_SLICES, in one process (cli.main, as `st5`)."""
  out = tmp_path_factory.mktemp("aot_generations")
  (out / "tiny.gin").write_text(TINY)
  script = ("import sys\nfrom st5_jax import cli\n"
            f"for s in {TINY_SLICES!r}:\n"
            f"  rc = cli.main(['aot', '--gin', '{out}/tiny.gin', '--slice', s, '--json', f'{out}/{{s}}.json'])\n"
            "  print('::', s, rc, flush=True)\n")
  env = dict(os.environ)
  env.pop("JAX_PLATFORMS", None)  # compile-only TPU devices need the TPU plugin
  proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=900)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  return {s: json.loads((out / f"{s}.json").read_text()) for s in TINY_SLICES}, proc.stdout


@pytest.mark.parametrize("slice_name", TINY_SLICES)
def test_st5_aot_compiles_a_tiny_step_for_each_generation(slice_name, tiny_reports):
  reports, stdout = tiny_reports
  assert f":: {slice_name} 0" in stdout  # exit status 0: it fits
  r = reports[slice_name]
  kind, generation = GENERATION[slice_name.split("-")[0]]
  chip = next(c for c in aot.CHIPS.values() if c.generation == generation)
  assert r["device_kind"] == kind and r["devices"] == 4 and r["hosts"] == 1
  assert r["topology"] == aot.topology_for_slice(slice_name)
  assert r["fits"] and 0 < r["total_bytes"] < r["hbm_bytes"] == chip.hbm_bytes
  assert 0 < r["state_bytes"] <= r["argument_bytes"]
  # The roofline comes from the compiled program and this chip's own figures.
  assert (r["peak_bf16_flops"], r["hbm_bytes_per_s"], r["ici_bytes_per_s"]) == (
      chip.peak_bf16_flops, chip.hbm_bytes_per_s, chip.ici_bytes_per_s)
  assert r["loop_trip_counts"] and set(r["loop_trip_counts"]) == {2}  # the 2 scanned layers, found
  # Every layer runs forward twice (remat) and backward once: at least the model's FLOPs per chip.
  assert r["compiled_flops"] >= r["step_flops"] / r["devices"]
  # XLA's cost analysis ran the scanned layer once; the report adds the second layer's iteration.
  assert r["compiled_flops"] > r["xla_cost_flops"] > 0 and r["bytes_accessed"] > r["xla_cost_bytes"] > 0
  assert r["bytes_accessed"] > 0 and r["collective_bytes"] > 0  # data parallel: gradients all-reduced
  assert r["roofline_compute_seconds"] == pytest.approx(r["compiled_flops"] / chip.peak_bf16_flops)
  assert r["roofline_memory_seconds"] == pytest.approx(r["bytes_accessed"] / chip.hbm_bytes_per_s)
  assert r["roofline_collective_seconds"] == pytest.approx(r["collective_bytes"] / chip.ici_bytes_per_s)
  assert r["roofline_step_seconds"] == pytest.approx(
      max(r["roofline_compute_seconds"], r["roofline_memory_seconds"]) + r["roofline_collective_seconds"])
  assert r["implied_mfu"] == pytest.approx(
      r["step_flops"] / (r["roofline_step_seconds"] * 4 * chip.peak_bf16_flops))
  assert 0 < r["implied_mfu"] < 1
  assert "predicted_step_seconds" not in r


def test_st5_aot_prints_the_estimate_as_an_estimate(tiny_reports):
  _, stdout = tiny_reports
  assert stdout.count("step time (estimate)") == len(TINY_SLICES)
  assert stdout.count("implied MFU (estimate)") == len(TINY_SLICES)
  assert "per-chip total" in stdout and "predicted" not in stdout


# Target -> (topology, mesh data x fsdp x model): data parallel on the small slices (Base, Large),
# the state sharded over every chip on the large ones (3B, 11B), as targets/v4_256.gin does.
NEW_TARGETS = {"targets/v5e_16.gin": ("v5e:4x4", (-1, 1, 1)), "targets/v5e_64.gin": ("v5e:8x8", (1, -1, 1)),
               "targets/v5e_256.gin": ("v5e:16x16", (1, -1, 1)),
               "targets/v5p_16.gin": ("v5:2x2x2", (-1, 1, 1)), "targets/v5p_128.gin": ("v5:4x4x4", (1, -1, 1)),
               "targets/v6e_16.gin": ("v6e:4x4", (-1, 1, 1)), "targets/v6e_64.gin": ("v6e:8x8", (1, -1, 1)),
               "targets/v6e_256.gin": ("v6e:16x16", (1, -1, 1))}


@pytest.mark.parametrize("target", NEW_TARGETS)
@pytest.mark.parametrize("run", ["st5_base_enc.gin", "st5_11b_encdec.gin", "st5_1_1_large_enc_stage2.gin"])
def test_a_target_combines_with_any_run(run, target):
  """`--gin RUN.gin --gin targets/X.gin`: the target's slice and mesh win over the run's own, whatever it set;
  every line of the target is the one the run ends with (none is dead)."""
  parse_gin([run, target], ["run.init_from = None"])
  spec = gin_config.run_spec()
  topology, mesh = NEW_TARGETS[target]
  assert spec.target["topology"] == topology == aot.topology_for_slice(spec.target["slice"])
  assert (spec.mesh.data, spec.mesh.fsdp, spec.mesh.model) == mesh
  assert (spec.model.t5.dtype, spec.model.t5.scan_layers, spec.model.t5.remat_policy) == ("bfloat16", True, "full")
  bindings = gin_config.trace([run, target], search_paths=[str(REPO / "gin")])
  last = {b.key: b for b in bindings}
  dead = [f"{b.file}:{b.line}: {b.key}" for b in bindings
          if pathlib.Path(b.file).name == pathlib.Path(target).name and last[b.key] is not b]
  assert not dead


# The paper's runs (both architectures, stage 1 and stage 2) x {v4, v5e, v5p, v6e}: each must compile
# for its generation's target and fit. The matrix (runs, the target of each generation) is
# benchmarks/aot_matrix.py's, which prints docs/tpu.md's table from the reports. `tests/run.sh --aot-all`
# runs them (one compile each, 1.5-7 min on 2 cores); with ST5_AOT_RESULTS=DIR each report is also
# written to DIR/RUN__TARGET.json, where `benchmarks/aot_matrix.py --results DIR` reads it.
_spec = importlib.util.spec_from_file_location("aot_matrix", REPO / "benchmarks" / "aot_matrix.py")
aot_matrix = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(aot_matrix)
PAPER_RUNS = aot_matrix.PAPER_RUNS


def test_the_paper_run_list_is_complete():
  shipped = sorted(p.name for p in (REPO / "gin").glob("st5_*.gin")
                   if not p.name.endswith("_cache.gin") and "_lap" not in p.name and "tiny" not in p.name)
  assert sorted(PAPER_RUNS) == shipped


@pytest.mark.aot_all
@pytest.mark.parametrize("generation", aot_matrix.GENERATIONS)
@pytest.mark.parametrize("run", PAPER_RUNS)
def test_every_paper_run_fits_each_generation(run, generation, tmp_path):
  out = pathlib.Path(os.environ.get("ST5_AOT_RESULTS", tmp_path))
  out.mkdir(parents=True, exist_ok=True)
  # The script's own compile (its report kept whole, and kept when it does not fit), redone every time.
  said = aot_matrix.compile_one(out, run, generation, timeout=3600, redo=True)
  log = out / (aot_matrix.report_path(out, run, generation).stem + ".log")
  # Anything but "RUN__T.json: N s" (timed out, failed, does not fit) fails, with st5 aot's output where kept.
  assert re.fullmatch(r"\S+\.json: \d+ s", said), said + "\n" + (log.read_text()[-4000:] if log.exists() else "")
  r = json.loads(aot_matrix.report_path(out, run, generation).read_text())
  assert r["fits"] and r["device_kind"] == GENERATION[generation][0]
  assert r["roofline_step_seconds"] > 0 and 0 < r["implied_mfu"] < 1


def _report(devices, seconds, fits=True, hbm=16):
  return {"mesh": {"data": devices, "fsdp": 1, "model": 1}, "topology": f"x:{devices}", "devices": devices,
          "fits": fits, "total_bytes": 3 * 2**30, "hbm_bytes": hbm * 2**30, "roofline_step_seconds": seconds,
          "roofline_compute_seconds": seconds / 2, "roofline_memory_seconds": seconds,
          "roofline_collective_seconds": 0.0,
          "implied_mfu": 0.5, "state_bytes": 2**30, "temp_bytes": 2 * 2**30, "compiled_flops": 1e12,
          "xla_cost_flops": 1e11, "bytes_accessed": 1e10, "collective_bytes": 1e8, "loop_trip_counts": [12, 0, 12],
          "compile_seconds": 100.0}


def test_the_matrix_tables_name_the_cheapest_fitting_slice_and_the_missing_rows(tmp_path):
  run = "st5_large_enc.gin"
  reports = {"v4": _report(16, 0.4), "v5e": _report(16, 0.2, fits=False), "v5p": _report(8, 0.5)}
  for generation, r in reports.items():
    aot_matrix.report_path(tmp_path, run, generation).write_text(json.dumps(r))
  aot_matrix.report_path(tmp_path, "st5_11b_encdec_stage2.gin", "v6e").write_text(json.dumps(_report(256, 0.01)))
  # Another slice of the same run: cheaper than the matrix's targets for the 11B run, dearer for the Large one.
  others = {"st5_11b_encdec_stage2__v6e_64.json": dict(_report(64, 0.02), name="st5_11b_encdec_stage2.gin + x.gin"),
            "st5_large_enc__v4_32.json": dict(_report(16, 0.9), name="st5_large_enc.gin")}
  main, detail, cheapest = aot_matrix.tables(aot_matrix.load(tmp_path), others).split("\n\n")
  rows = {tuple(c.strip() for c in line.split("|")[1:3]): line for line in main.splitlines()[2:]}
  assert len(rows) == len(PAPER_RUNS) * 4  # one row per run x generation, compiled or not
  # chip-hours = chips x steps x estimate: v4 16 x 50,000 x 0.4 s = 89; v5p 8 x 50,000 x 0.5 s = 56 (cheapest that
  # fits: v5e's 44 does not fit); stage 2 runs 3,000 steps: 256 x 3,000 x 0.01 s = 2.1 (one decimal below 10).
  assert "| 89 (50,000 steps) |" in rows[run, "v4"] and "| 56 (50,000 steps) |" in rows[run, "v5p"]
  assert "**no**: 3.00 / 16 GiB" in rows[run, "v5e"] and "targets/v5e_16.gin: x:16 (16), 16 x 1 x 1" in rows[run, "v5e"]
  assert "| 2.1 (3,000 steps) |" in rows["st5_11b_encdec_stage2.gin", "v6e"]
  assert "not compiled yet: `st5 aot --gin st5_large_enc.gin --gin targets/v6e_16.gin`" in rows[run, "v6e"]
  assert "not compiled yet: `st5 aot --gin st5_base_enc.gin`" in rows["st5_base_enc.gin", "v4"]
  assert cheapest.splitlines()[2:] == [
      f"| {run} | v4 89, v5e 44 (does not fit), v5p 56 (not compiled: v6e) | "
      "v5p, targets/v5p_16.gin (8 chips): 56 chip-hours |",
      "| st5_11b_encdec_stage2.gin | v6e 2.1 (not compiled: v4, v5e, v5p) | x:64, other_slices/"
      "st5_11b_encdec_stage2__v6e_64.json (64 chips): 1.1 chip-hours |"]
  assert len(detail.splitlines()) == 2 + 4
  assert f"| {run} | v5p | 1.00 / 2.00 | 1.000e+12 | 1.000e+11 | 1.000e+10 | 1.000e+08 | 12 | 100 s |" in detail


def test_a_timed_out_matrix_compile_is_reported_and_a_finished_report_is_not_redone(tmp_path):
  assert aot_matrix.compile_one(tmp_path, "st5_base_enc.gin", "v5e", timeout=1).endswith("timed out after 1 s")
  assert not list(tmp_path.glob("*.json"))
  done = aot_matrix.report_path(tmp_path, "st5_base_enc.gin", "v5e")
  assert done.name == "st5_base_enc__v5e_16.json"
  done.write_text("{}")
  assert aot_matrix.compile_one(tmp_path, "st5_base_enc.gin", "v5e", timeout=1).endswith("already there")
  redone = aot_matrix.compile_one(tmp_path, "st5_base_enc.gin", "v5e", timeout=1, redo=True)
  assert redone.endswith("timed out after 1 s")


def test_docs_tpu_md_shows_the_matrix_of_the_committed_reports():
  """docs/tpu.md's run x generation tables are benchmarks/aot_matrix.py's output for docs/aot_reports/, and each
  report is `st5 aot`'s own for the run, the target and the generation its file name says."""
  reports = REPO / "docs" / "aot_reports"
  found = aot_matrix.load(reports)
  assert len(found) == len(list(reports.glob("*.json")))  # no stray report the table would leave out
  for (run, generation), r in found.items():
    target = aot_matrix.target(run, generation)
    assert r["name"] == run + (f" + {target}.gin" if target else ""), (run, generation)
    assert r["device_kind"] == GENERATION[generation][0] and r["compiled"], (run, generation)
    # ... and of today's gin files: a target whose slice or mesh changed makes its reports stale.
    parse_gin([run] + ([f"targets/{target}.gin"] if target else []), ["run.init_from = None"])
    spec = gin_config.run_spec()
    assert r["topology"] == spec.target["topology"], (run, generation)
    assert tuple(r["mesh"].values()) == spec.mesh.shape(r["devices"]), (run, generation)
  tpu_md = (REPO / "docs" / "tpu.md").read_text()
  assert aot_matrix.tables(found, aot_matrix.load_others(reports / "other_slices")) in tpu_md
  # The A/Bs of other slices and meshes: each named after its run, and shown as the script prints them.
  others = sorted((reports / "other_slices").glob("*.json"))
  assert others and all(json.loads(p.read_text())["name"].split(" + ")[0] == p.name.split("__")[0] + ".gin"
                        for p in others)
  assert aot_matrix.other_slices_table(reports / "other_slices") in tpu_md
