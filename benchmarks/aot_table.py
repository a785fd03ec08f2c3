"""Runs `st5 aot` for gin files and prints the markdown table of docs/tpu.md.

  python benchmarks/aot_table.py st5_3b_enc.gin st5_11b_encdec.gin ... > table.md
"""

import json
import os
import subprocess
import sys
import tempfile


def main(names):
  env = dict(os.environ)
  env.pop("JAX_PLATFORMS", None)
  print("| gin file | slice (chips) | mesh data x fsdp x model | batch x lengths | params | per-chip args | "
        "per-chip temps | per-chip total / HBM | step FLOPs | step at 50% MFU | compile |")
  print("|---|---|---|---|---|---|---|---|---|---|---|")
  for name in names:
    with tempfile.TemporaryDirectory() as d:
      out = subprocess.run([sys.executable, "-m", "st5_jax.cli", "aot", "--gin", name, "--json", f"{d}/r.json"],
                           capture_output=True, text=True, env=env)
      if not os.path.exists(f"{d}/r.json"):
        print(f"| {name} | failed: {out.stderr.strip().splitlines()[-1][:120]} |||||||||")
        continue
      r = json.load(open(f"{d}/r.json"))
    g = lambda b: f"{b / 2**30:.2f} GiB"  # noqa: E731
    mesh = " x ".join(str(v) for v in r["mesh"].values())
    lengths = "/".join(str(v) for v in r["lengths"].values())
    print(f"| {name} | {r['topology']} ({r['devices']}) | {mesh} | {r['global_batch_size']} x {lengths} | "
          f"{r['params'] / 1e9:.2f} B | {g(r['argument_bytes'])} | {g(r['temp_bytes'])} | "
          f"{g(r['total_bytes'])} / {g(r['hbm_bytes'])}{'' if r['fits'] else ' **does not fit**'} | "
          f"{r['step_flops']:.2e} | {r['roofline_step_seconds']:.3f} s (estimate), MFU {r['implied_mfu']:.0%} | {r['compile_seconds']:.0f} s |", flush=True)


if __name__ == "__main__":
  main(sys.argv[1:])
