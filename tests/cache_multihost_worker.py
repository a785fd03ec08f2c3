"""One process of a multi-process read of a token cache (tests/test_data_cache.py starts two).

argv: CACHE_ROOT OUT_JSON
Env: JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID, as tests/multihost_worker.py.
Reads 12 global batches, saves the state (a collective) after 5, and checks that a fresh
iterator restored from it continues with exactly batches 6-12; writes the state too (the
test resumes it on one reader: an elastic resume).
"""

import json
import pathlib
import sys

from st5_jax import multihost

multihost.maybe_initialize()

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402

from st5_jax.data import tasks  # noqa: E402
from st5_jax.data.iterator import make_train_iterator  # noqa: E402

root, out_json = sys.argv[1], sys.argv[2]
mesh = jax.make_mesh((jax.device_count(),), ("data",))
kw = dict(task=tasks.STAGE2_SNLI_TRIPLES, split="validation", feature_lengths={"inputs": 40, "targets": 40},
          global_batch_size=32, mesh=mesh, seed=4, shuffle_buffer_size=64, cache_dir=root)


def global_rows(batch):
  return {k: np.asarray(multihost_utils.process_allgather(v, tiled=True)) for k, v in sorted(batch.items())}


it = make_train_iterator(**kw)
batches, state = [], None
for step in range(12):
  if step == 5:
    state = it.get_state()
  batches.append(global_rows(next(it)))
resumed = make_train_iterator(**kw)
resumed.set_state(json.loads(json.dumps(state)))
again = [global_rows(next(resumed)) for _ in batches[5:]]  # every process makes the same collectives
same = all(np.array_equal(b[k], ref[k]) for b, ref in zip(again, batches[5:]) for k in ref)
stream = resumed._streams[0]  # pylint: disable=protected-access
pathlib.Path(out_json).write_text(json.dumps({
    "process": jax.process_index(), "processes": jax.process_count(), "reader": it.reader_id,
    "shards": stream.shards, "resume_same": bool(same), "cursor_readers": sorted(state["cursors"]),
    "resume_records_read": stream.resume_records_read, "state": state,
    "batches": [{k: v.tolist() for k, v in b.items()} for b in batches]}))
