"""Where a train step's time goes on this backend: a jax.profiler trace, attributed to HLO ops.

    python benchmarks/profile_step.py                                  # T5.1.1-small, batch 64, length 32, 1 negative
    python benchmarks/profile_step.py --size t5_mini --steps 5
    python benchmarks/profile_step.py --quick                          # t5_tiny, seconds (tests)

Runs the real jitted step of `st5_jax.train.build` (as `st5 bench`), traces --steps steps
with `jax.profiler.trace(create_perfetto_trace=True)`, and sums the duration of every
executed thunk (event arg `hlo_op`) of the step's module. Each op is looked up in the
compiled HLO text and put in a kind (matmul: a dot or a fusion containing one; scatter;
gather; reduce; elementwise fusion; copy/transpose; other) and a phase read from its
`op_name` metadata (forward; backward = `transpose(`; optimizer = outside the
gradient's jvp/transpose: the Adafactor update and the metrics' norms; loss). Prints both tables and the top ops. Figures, no assertions.
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import pathlib
import re
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

_INSTR = re.compile(r"^\s*(?:ROOT\s+)?(%?[\w.\-]+)\s*=\s*[^=]*?\s([a-z][\w\-]*)\(")
_CALLS = re.compile(r"calls=(%?[\w.\-]+)")
_OPNAME = re.compile(r'op_name="([^"]*)"')


def parse_hlo(text: str) -> dict[str, dict]:
  """instruction name -> {opcode, calls, op_name, computation} for every instruction of a module."""
  out, comps, comp = {}, collections.defaultdict(list), None
  for line in text.splitlines():
    if not line.startswith(" ") and "{" in line and ("%" in line or "ENTRY" in line or "(" in line):
      comp = line.split("(")[0].replace("ENTRY", "").strip().lstrip("%")
      continue
    m = _INSTR.match(line)
    if not m:
      continue
    name, opcode = m[1].lstrip("%"), m[2]
    calls = _CALLS.search(line)
    opn = _OPNAME.search(line)
    out[name] = {"opcode": opcode, "calls": calls[1].lstrip("%") if calls else None,
                 "op_name": opn[1] if opn else "", "computation": comp}
    comps[comp].append(opcode)
  for v in out.values():
    v["fused_opcodes"] = comps.get(v["calls"], []) if v["calls"] else []
  return out


def kind_of(info: dict | None) -> str:
  if info is None:
    return "other"
  ops = set(info["fused_opcodes"]) | {info["opcode"]}
  if ops & {"dot", "convolution"} or info["opcode"] == "custom-call":
    return "matmul"
  if "scatter" in ops:
    return "scatter"
  if "gather" in ops:
    return "gather"
  if ops & {"reduce", "reduce-window"}:
    return "reduce"
  if info["opcode"] in ("copy", "transpose") or (info["opcode"] == "fusion" and ops <= {"fusion", "copy", "transpose",
                                                                                        "parameter", "bitcast"}):
    return "copy/transpose"
  if info["opcode"] == "fusion":
    return "elementwise fusion"
  return "other"


def phase_of(info: dict | None) -> str:
  name = (info or {}).get("op_name", "")
  if not name:
    return "unattributed"
  if "transpose(" in name:
    return "backward"
  if re.search(r"in_batch_softmax|contrastive|xent|log_softmax|softmax_loss", name):
    return "loss"
  if "jvp(" in name or "SentenceT5" in name:
    return "forward"
  return "optimizer"  # outside value_and_grad: optax has no named scopes, so only `jit(step...)/mul` etc.


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--size", default="t5_1_1_small")
  p.add_argument("--batch", type=int, default=64)
  p.add_argument("--length", type=int, default=32)
  p.add_argument("--no_negatives", action="store_true")
  p.add_argument("--projection", type=int, default=768)
  p.add_argument("--steps", type=int, default=3, help="Traced steps (after one untraced warm-up step).")
  p.add_argument("--quick", action="store_true", help="t5_tiny, batch 8, length 16, projection 32, 2 steps.")
  p.add_argument("--top", type=int, default=15)
  p.add_argument("--trace_dir", default=None, help="Keep the trace here (default: a temporary folder).")
  p.add_argument("--json", default=None)
  args = p.parse_args(argv)
  if args.quick:
    args.size, args.batch, args.length, args.projection, args.steps = "t5_tiny", 8, 16, 32, 2

  import jax
  import numpy as np

  from st5_jax import configs, features, partitioning, train

  model = configs.ST5Config(t5=configs.t5_size(args.size, dtype="float32", dropout_rate=0.0), pooling="enc_mean",
                            embedding_dim=args.projection, max_length=args.length)
  tc = train.TrainConfig(num_train_steps=args.steps + 2, global_batch_size=args.batch)
  mesh = partitioning.make_mesh(partitioning.MeshConfig())
  setup = train.build(model, tc, mesh)
  sides = [features.LEFT, features.RIGHT] + ([] if args.no_negatives else [features.RIGHT_NEG])
  rng = np.random.default_rng(0)
  host = {k: rng.integers(3, 32000, size=(args.batch, args.length)).astype(np.int32) for k in sides}
  for v in host.values():
    v[:, -1] = 1
  batch = {k: jax.device_put(v, partitioning.batch_sharding(mesh)) for k, v in host.items()}
  trace_dir = args.trace_dir or tempfile.mkdtemp(prefix="st5_profile_")
  with jax.set_mesh(mesh):
    state = train.init_state(setup, model, seed=0)
    compiled = setup.step_fn.lower(state, batch).compile()
    hlo = parse_hlo(compiled.as_text())
    state, m = setup.step_fn(state, batch)
    jax.block_until_ready(m)
    t = time.perf_counter()
    with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
      for _ in range(args.steps):
        state, m = setup.step_fn(state, batch)
      jax.block_until_ready(m)
    wall = (time.perf_counter() - t) / args.steps

  files = glob.glob(os.path.join(trace_dir, "**", "*.trace.json.gz"), recursive=True)
  if not files:
    raise FileNotFoundError(f"No *.trace.json.gz written under {trace_dir}")
  events = json.load(gzip.open(sorted(files)[-1]))["traceEvents"]
  by_op = collections.Counter()
  step_us = 0.0
  for e in events:
    a = e.get("args") or {}
    if e.get("ph") != "X":
      continue
    if a.get("hlo_op") and "step" in a.get("hlo_module", ""):
      by_op[a["hlo_op"]] += e["dur"]
    elif e["name"] == "ThunkExecutor::Execute (wait for completion)":
      step_us += e["dur"]
  total = sum(by_op.values())
  kinds, phases = collections.Counter(), collections.Counter()
  for op, us in by_op.items():
    kinds[kind_of(hlo.get(op))] += us
    phases[phase_of(hlo.get(op))] += us
  n = args.steps
  print(f"# {args.size} batch {args.batch} length {args.length} towers {len(sides)}: wall {wall * 1e3:.1f} ms/step, "
        f"thunks {total / n / 1e3:.1f} ms/step (sum of op durations; ops can overlap), "
        f"load average {os.getloadavg()[0]:.2f}")
  for title, table in (("kind", kinds), ("phase", phases)):
    print(f"\n{title:<20} ms/step   share")
    for k, us in table.most_common():
      print(f"{k:<20} {us / n / 1e3:8.1f}  {us / total:6.1%}")
  print(f"\n{'top ops':<28} {'ms/step':>8}  share  kind / phase / op_name")
  for op, us in by_op.most_common(args.top):
    info = hlo.get(op)
    print(f"{op:<28} {us / n / 1e3:8.2f}  {us / total:5.1%}  {kind_of(info)} / {phase_of(info)} / "
          f"{(info or {}).get('op_name', '')[-110:]}")
  if args.json:
    pathlib.Path(args.json).write_text(json.dumps({
        "wall_ms_per_step": wall * 1e3, "thunk_ms_per_step": total / n / 1e3,
        "kinds_ms": {k: v / n / 1e3 for k, v in kinds.items()}, "phases_ms": {k: v / n / 1e3 for k, v in phases.items()},
        "top_ops": [[op, us / n / 1e3] for op, us in by_op.most_common(args.top)]}, indent=2))
  del step_us
  return 0


if __name__ == "__main__":
  sys.exit(main())
