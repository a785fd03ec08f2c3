"""What reaches the workers of launch/tpu_run.sh: the slice's ssh command and the --local-pod rehearsal.

A slice's worker runs the trainer from a fresh ssh login, so only what the launcher puts into
the remote command reaches it: every exported ST5_* variable, TFDS_DATA_DIR and each
`--env NAME` (docs/tpu.md, "What reaches the workers"). The rehearsal starts its processes
from `env -i` with the same forwarded variables, so a variable the launcher drops is missing
there too. Also: the docs' rehearsal emulator (`python tests/gcs_emulator.py`) honours
`ifGenerationMatch`.
"""

import json
import os
import pathlib
import shlex
import socket
import subprocess
import sys
import urllib.error
import urllib.request

REPO = pathlib.Path(__file__).resolve().parents[1]
TPU_RUN = str(REPO / "launch" / "tpu_run.sh")
LOGIN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # the rehearsal's fresh login

# Values that a shell would split, expand or evaluate if the launcher quoted them wrongly.
GLOB = "gs://b/mined/part-*.jsonl"
TRICKY = "a  b \"dq\" 'sq' ; echo pwned $HOME ${X:-y} `id` $(id) * ? [a] ~ \\ \n\ttab é"
# Set on the launching side and never forwarded: credentials, this machine's JAX and XLA settings,
# a name that only looks like the project's.
NOT_FORWARDED = {"GOOGLE_APPLICATION_CREDENTIALS": "/home/me/key.json", "JAX_ENABLE_X64": "1",
                 "XLA_FLAGS": "--xla_dump_to=/tmp/nowhere", "ST5TEST_LOCAL_ONLY": "1"}

PROBE = '''
"""Imported by the probe gin file in each rehearsal worker: records what the worker sees, then stops it."""
import json
import os

import jax
from st5_jax import paths

with open("/proc/self/environ", "rb") as f:  # the environment the process was started with
  environ = dict(kv.decode("utf-8", "surrogateescape").split("=", 1) for kv in f.read().split(b"\\0") if kv)
data = paths.resolve_data_dir()  # the trainer's own resolution: gin, else $ST5_DATA_DIR
record = {{"environ": environ, "data_dir": data, "marker": paths.read_text(paths.join(data, "marker.txt"))}}
with open(os.path.join({out!r}, "worker" + os.environ["JAX_PROCESS_ID"] + ".json"), "w", encoding="utf-8") as f:
  json.dump(record, f)
jax.distributed.shutdown()  # every worker gets here: the coordinator stops cleanly
os._exit(0)  # the probe ends the worker before any training
'''


def _launcher_env(**extra):
  env = dict(os.environ, ST5_USER_HARD_NEGATIVES=GLOB, ST5_TEST_TRICKY=TRICKY, **NOT_FORWARDED, **extra)
  env["ST5_HUGETLB_MALLOC"] = "0"  # no re-exec: /proc/self/environ is exactly what the launcher gave
  return env


def test_local_pod_workers_get_only_what_the_slice_gets(gcs, tmp_path):
  """The rehearsal's workers read their data through the forwarded ST5_DATA_DIR; nothing else leaks in."""
  data = gcs.url("launch_env", "data")
  gcs_marker = "read through the forwarded ST5_DATA_DIR"
  from st5_jax import paths
  paths.write_text(f"{data}/marker.txt", gcs_marker)
  probe_dir = tmp_path / "probe"
  probe_dir.mkdir()
  (probe_dir / "launch_env_probe.py").write_text(PROBE.format(out=str(tmp_path)))
  gin = tmp_path / "probe.gin"
  gin.write_text("import launch_env_probe\n")
  env = _launcher_env(ST5_DATA_DIR=data, TFDS_DATA_DIR="/data/tfds dir", PYTHONPATH=str(probe_dir),
                      ST5_LOCAL_POD_DEVICES="2", **gcs.env())
  out = subprocess.run([TPU_RUN, "--gin", str(gin), "--local-pod", "2", "--workdir", str(tmp_path / "wd"),
                        "--env", "PYTHONPATH"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
  forwarded = {k: v for k, v in env.items() if k.startswith("ST5_")}
  forwarded.update(TFDS_DATA_DIR=env["TFDS_DATA_DIR"], PYTHONPATH=str(probe_dir))
  note = next(l for l in out.stderr.splitlines() if "environment forwarded to the workers:" in l)
  assert sorted(note.split(": ", 1)[1].split()) == sorted(forwarded)  # the launcher says what it forwards
  for i in range(2):
    record = json.loads((tmp_path / f"worker{i}.json").read_text())
    assert record["data_dir"] == data and record["marker"] == gcs_marker
    rehearsal = {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
                 "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": str(i), "ST5_MULTIHOST": "1",
                 "STORAGE_EMULATOR_HOST": gcs.host}
    login = {"PATH": LOGIN_PATH, "HOME": os.path.expanduser("~"), "LANG": "C.UTF-8"}
    environ = record["environ"]
    assert environ.pop("JAX_COORDINATOR_ADDRESS").startswith("127.0.0.1:")
    # Exactly a fresh login, the forwarded variables byte for byte, and the rehearsal's own part.
    assert environ == {**login, **forwarded, **rehearsal}
    assert all(environ.get(k) != v for k, v in NOT_FORWARDED.items())


def _fake_gcloud(tmp_path):
  """A stand-in for Google's CLI on PATH: records each call's argv, does nothing."""
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  gcloud = bin_dir / "gcloud"
  gcloud.write_text(f"#!{sys.executable}\nimport json, sys\n"
                    f"with open({str(tmp_path / 'gcloud.jsonl')!r}, 'a') as f:\n"
                    "  f.write(json.dumps(sys.argv[1:]) + '\\n')\n")
  gcloud.chmod(0o755)
  return bin_dir


def test_slice_command_carries_the_forwarded_variables_intact(tmp_path):
  """The --tpu path with a fake gcloud: its --command, run by a shell from a fresh login, gives the
  trainer every forwarded value byte-identical and nothing else of the launching shell."""
  bin_dir = _fake_gcloud(tmp_path)
  env = _launcher_env(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", TMPDIR=str(tmp_path),
                      ST5_DATA_DIR="gs://bkt/data", MY_SETTING="chosen by --env", STORAGE_EMULATOR_HOST="http://127.0.0.1:1",
                      JAX_PLATFORMS="cpu")
  out = subprocess.run([TPU_RUN, "--gin", "st5_11b_encdec.gin", "--tpu", "my-tpu", "--zone", "us-central2-b",
                        "--workdir", "gs://bkt/run", "--env", "MY_SETTING", "--takeover", "--lease_expiry_s", "120",
                        "--gin.TrainConfig.num_train_steps=5"],
                       env=env, capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stderr[-3000:]
  calls = [json.loads(line) for line in (tmp_path / "gcloud.jsonl").read_text().splitlines()]
  assert [c[3] for c in calls] == ["scp", "ssh", "ssh"]
  train = calls[-1]
  assert "--worker=all" in train
  remote = train[train.index("--command") + 1]
  # The worker: a fresh login's shell in the home folder holding the shipped tree, and a fake trainer
  # that prints its argv and environment.
  home = tmp_path / "worker_home"
  fake = home / "st5_jax" / ".venv" / "bin" / "st5"
  fake.parent.mkdir(parents=True)
  fake.write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                  "print(json.dumps({'argv': sys.argv[1:], 'env': dict(os.environ)}))\n")
  fake.chmod(0o755)
  # Files an unquoted glob would match in the worker's directory.
  (home / "st5_jax" / "gs:" / "b" / "mined").mkdir(parents=True)
  (home / "st5_jax" / "gs:" / "b" / "mined" / "part-1.jsonl").write_text("")
  (home / "st5_jax" / "a").write_text("")
  login = {"PATH": LOGIN_PATH, "HOME": str(home), "LANG": "C.UTF-8"}
  got = subprocess.run(["bash", "-c", remote], env=login, cwd=home, capture_output=True, text=True, timeout=60)
  assert got.returncode == 0, got.stderr
  seen = json.loads(got.stdout)
  assert seen["argv"][:3] == ["train", "--gin_file", "gin/st5_11b_encdec.gin"]
  # st5 train's work-dir flags (the lease's refusal names --takeover) reach every worker's trainer.
  assert seen["argv"][3:] == ["--workdir", "gs://bkt/run", "--no_progress", "--takeover", "--lease_expiry_s", "120",
                              "--gin.TrainConfig.num_train_steps=5"]
  forwarded = {k: v for k, v in env.items() if k.startswith("ST5_")}
  forwarded["MY_SETTING"] = "chosen by --env"
  assert seen["env"]["ST5_TEST_TRICKY"] == TRICKY and seen["env"]["ST5_USER_HARD_NEGATIVES"] == GLOB
  # What bash itself sets in any shell (PWD, SHLVL, _) aside, the trainer sees the login, the forwarded
  # variables and ST5_MULTIHOST=1: not the emulator, this machine's JAX_PLATFORMS, XLA_FLAGS or credentials.
  environ = {k: v for k, v in seen["env"].items() if k not in ("PWD", "OLDPWD", "SHLVL", "_")}
  assert environ == {**login, **forwarded, "ST5_MULTIHOST": "1"}


def test_tpu_run_env_flag_errors():
  for bad, message in (("NOT_SET_ANYWHERE_42", "is not set"), ("A-B", "needs a variable name")):
    env = {k: v for k, v in os.environ.items() if k != bad}
    out = subprocess.run([TPU_RUN, "--gin", "st5_tiny_cpu.gin", "--env", bad, "--dry-run"], env=env,
                         capture_output=True, text=True)
    assert out.returncode == 2 and message in out.stderr, out.stderr


def _free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def test_docs_rehearsal_emulator_honours_generation_preconditions(tmp_path):
  """docs/tpu.md starts `python tests/gcs_emulator.py` (not the plain gcp-storage-emulator): a second
  create-only write (ifGenerationMatch=0) of an object is refused, as on GCS."""
  docs = (REPO / "docs" / "tpu.md").read_text(encoding="utf-8")
  rehearsal = docs.split("## Rehearse on this machine", 1)[1].split("\n## ", 1)[0]
  assert "\npython tests/gcs_emulator.py --port 9023 --bucket BUCKET &" in rehearsal
  assert "\ngcp-storage-emulator start" not in rehearsal  # no command line starts the plain one
  port = _free_port()
  # From outside the checkout, as a user's shell runs it (st5_jax from the installed package).
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  server = subprocess.Popen([sys.executable, str(REPO / "tests" / "gcs_emulator.py"), "--port", str(port),
                             "--bucket", "bkt"], env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
  try:
    banner = server.stdout.readline()
    assert f"STORAGE_EMULATOR_HOST=http://127.0.0.1:{port}" in banner, banner + server.stdout.read()

    def create(body):
      url = (f"http://127.0.0.1:{port}/upload/storage/v1/b/bkt/o?uploadType=media&name=lease.json"
             f"&ifGenerationMatch=0")
      request = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "text/plain"})
      try:
        with urllib.request.urlopen(request, timeout=30) as response:
          return response.status
      except urllib.error.HTTPError as e:
        return e.code

    assert create(b"first") == 200
    assert create(b"second") == 412
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/download/storage/v1/b/bkt/o/lease.json?alt=media",
                                timeout=30) as response:
      assert response.read() == b"first"
  finally:
    server.terminate()
    server.wait(timeout=30)


def test_local_run_passes_st5_trains_work_dir_flags():
  """The local form: --allow_config_change and --lease_renew_s reach `st5 train`, which accepts them."""
  out = subprocess.run([TPU_RUN, "--gin", "st5_tiny_cpu.gin", "--workdir", "wd", "--allow_config_change",
                        "--lease_renew_s", "30", "--dry-run"], capture_output=True, text=True, timeout=60)
  assert out.returncode == 0, out.stderr
  words = shlex.split(out.stdout.strip().splitlines()[-1])
  assert words[:2] == ["st5", "train"] and words[-3:] == ["--allow_config_change", "--lease_renew_s", "30"]
  from st5_jax import cli  # the real parser of the command the launcher runs
  args, extra = cli.build_parser().parse_known_args(words[1:])
  assert args.allow_config_change and args.lease_renew_s == 30.0 and not extra
