"""kill -9 the training job at N random moments (some inside checkpoint saves), rerun it each
time, and compare the final embeddings with an uninterrupted run's.

  python benchmarks/fault_probe.py --kills 5 --steps 40 --every 5 [--gin_file gin/st5_tiny_cpu.gin]

Default job: the tiny synthetic-data config of tests/test_faults_kill.py (no data needed).
`--gin_file` runs a real gin file instead (e.g. the README's st5_tiny_cpu.gin; its step count is
overridden by --steps). Kills inside saves use tests/faults_worker.py's ST5_FAULT_HANG hook:
the job stops at the chosen point of the save of a chosen step and is killed there.
Prints the kills survived and the max |difference| of the final embeddings.
"""

import argparse
import json
import os
import pathlib
import random
import signal
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
WORKER = REPO / "tests" / "faults_worker.py"


def _cmd(gin_file, workdir, steps, every):
  return [sys.executable, str(WORKER), "train", "--gin_file", str(gin_file), "--workdir", str(workdir),
          "--no_progress", f"--gin.TrainConfig.num_train_steps={steps}", f"--gin.TrainConfig.checkpoint_every={every}",
          "--gin.TrainConfig.keep_checkpoints=100"]


def _committed(workdir):
  d = workdir / "checkpoints"
  return sorted(int(p.name) for p in d.iterdir() if p.name.isdigit()) if d.exists() else []


def _embeddings(workdir):
  import jax
  import numpy as np
  from st5_jax.checkpoints import native
  from st5_jax.model.st5 import SentenceT5
  config, params, step = native.load_params(workdir)
  rng = np.random.default_rng(0)
  tokens = rng.integers(3, config.t5.vocab_size, size=(32, 16)).astype(np.int32)
  tokens[:, 12] = 1
  tokens[:, 13:] = 0
  emb = SentenceT5(config).apply({"params": params}, tokens, deterministic=True)
  return step, np.asarray(jax.device_get(emb))


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--kills", type=int, default=5)
  p.add_argument("--steps", type=int, default=40)
  p.add_argument("--every", type=int, default=5)
  p.add_argument("--save_fraction", type=float, default=0.5, help="share of kills landed inside a save")
  p.add_argument("--gin_file", default=None)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--keep", default=None, help="keep the work dirs here")
  args = p.parse_args()
  rnd = random.Random(args.seed)
  root = pathlib.Path(args.keep or tempfile.mkdtemp(prefix="fault_probe_"))
  root.mkdir(parents=True, exist_ok=True)
  gin_file = args.gin_file
  if gin_file is None:
    from test_faults_kill import GIN
    gin_file = root / "tiny.gin"
    gin_file.write_text(GIN.format(steps=args.steps, every=args.every))
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4")
  shared = pathlib.Path(os.environ.get("ST5_SHARED_DIR", REPO.parent / "shared"))
  env.setdefault("ST5_DATA_DIR", str(shared / "data"))
  env.setdefault("ST5_VOCAB", str(shared / "data" / "t5_spiece" / "spiece.model"))
  env.setdefault("JAX_PLATFORMS", "cpu")
  env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])

  t0 = time.time()
  straight = root / "straight"
  subprocess.run(_cmd(gin_file, straight, args.steps, args.every), env=env, check=True, capture_output=True)
  run_s = time.time() - t0
  print(f"uninterrupted run: {run_s:.0f} s", flush=True)

  wd = root / "killed"
  kills, finished_early, log = 0, 0, []
  for i in range(args.kills):
    done = _committed(wd)
    if done and done[-1] == args.steps:
      break
    in_save = rnd.random() < args.save_fraction
    run_env = dict(env)
    if in_save:
      start = (done[-1] if done else 0) // args.every + 1
      step = args.every * rnd.randint(start, max(start, args.steps // args.every))
      run_env["ST5_FAULT_HANG"] = f"{min(step, args.steps)}:{rnd.choice(['create', 'commit'])}"
      where = f"inside the save of step {run_env['ST5_FAULT_HANG']}"
    else:
      delay = rnd.uniform(0.1, 1.0) * run_s
      where = f"{delay:.1f} s after start"
    (wd / "FAULT_HANG").unlink(missing_ok=True)
    proc = subprocess.Popen(_cmd(gin_file, wd, args.steps, args.every), env=run_env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t = time.time()
    while proc.poll() is None:
      if (in_save and (wd / "FAULT_HANG").exists()) or (not in_save and time.time() - t > delay):
        proc.send_signal(signal.SIGKILL)
        break
      time.sleep(0.02)
    proc.wait()
    if proc.returncode == -signal.SIGKILL:
      kills += 1
      log.append(f"kill {kills}: {where}; committed before: {done[-1] if done else None}, after: "
                 f"{_committed(wd)[-1] if _committed(wd) else None}")
    else:
      finished_early += 1
      log.append(f"run {i + 1} ended (rc {proc.returncode}) before the kill ({where})")
    print(log[-1], flush=True)
  (wd / "FAULT_HANG").unlink(missing_ok=True)
  final = subprocess.run(_cmd(gin_file, wd, args.steps, args.every), env=env, capture_output=True)
  survived = kills if final.returncode == 0 else 0
  (sa, ea), (sb, eb) = _embeddings(straight), _embeddings(wd)
  import numpy as np
  diff = float(np.max(np.abs(ea - eb)))
  leftovers = [n for n in os.listdir(wd / "checkpoints") if "orbax-checkpoint-tmp" in n]
  result = {"kills": kills, "kills_survived": survived, "runs_that_ended_before_the_kill": finished_early,
            "final_step": [sa, sb], "max_abs_embedding_difference": diff, "bit_identical": bool(np.array_equal(ea, eb)),
            "torn_tmp_dirs_left": leftovers, "uninterrupted_run_s": round(run_s, 1)}
  print(json.dumps(result, indent=2))
  return 0 if survived == kills and diff == 0.0 and sa == sb == args.steps else 1


if __name__ == "__main__":
  sys.exit(main())
