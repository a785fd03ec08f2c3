"""The tests' persistent-cache guard (tests/conftest.py): executables whose collectives sit in a
loop body are compiled every time, all others are cached.

jaxlib 0.10.2 loads the former without the order between the loop's collectives and the ones
outside it; the guard is what lets every in-process test use the cache.
"""

import pathlib

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import Mesh, PartitionSpec as P

from conftest import has_nested_collectives


def _step(nested):
  mesh = Mesh(jax.devices()[:2], ("x",))

  def two_collectives(a_Bx2):
    def body(i, c):
      del i
      return c + jax.lax.psum(c, "x") * 1e-3  # a collective in a while body
    looped = jax.lax.fori_loop(0, 3, body, a_Bx2) if nested else a_Bx2 * 2.0
    return looped, jax.lax.all_gather(a_Bx2, "x", tiled=True)  # and one outside it

  return jax.jit(jax.shard_map(two_collectives, mesh=mesh, in_specs=P("x"), out_specs=(P("x"), P()), check_vma=False))


def _hlo(nested):
  return _step(nested).lower(jnp.ones((4, 2))).compile().as_text()


def test_nested_collectives_are_found_in_loop_bodies_only():
  assert has_nested_collectives(_hlo(nested=True))
  assert not has_nested_collectives(_hlo(nested=False))  # its all-gather is in ENTRY
  assert not has_nested_collectives("HloModule m\n\nENTRY %main () -> f32[] {\n  %a = f32[] all-reduce(%p)\n}\n")


@pytest.mark.parametrize("nested", [True, False])
def test_only_executables_without_nested_collectives_reach_the_cache(nested, tmp_path):
  from jax._src import compilation_cache  # pylint: disable=g-import-not-at-top

  cache_dir = tmp_path / "xla_cache"
  before = (jax.config.jax_compilation_cache_dir, jax.config.jax_persistent_cache_min_compile_time_secs)
  jax.config.update("jax_compilation_cache_dir", str(cache_dir))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  compilation_cache.reset_cache()
  try:
    jax.clear_caches()
    out = _step(nested)(jnp.arange(8.0).reshape(4, 2))
    jax.block_until_ready(out)
  finally:
    jax.config.update("jax_compilation_cache_dir", before[0])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", before[1])
    compilation_cache.reset_cache()
  entries = [p.name for p in pathlib.Path(cache_dir).rglob("*") if p.name.startswith("jit_two_collectives-")]
  assert bool(entries) == (not nested), entries
