"""Hand-written mutation check: break one behaviour of the core, run the tests that should see it.

Each mutation replaces one exact snippet (which must occur exactly once) in a copy of the
repository's tracked files under a temporary directory, then runs its test selection there
with that copy first on PYTHONPATH; the checkout itself is never modified. A mutant is
"killed" when pytest fails (exit code 1), "survived" when the tests pass (0), and "error"
for anything else (collection error, timeout) -- an error is not a kill.

  python tests/mutations.py                  all mutations
  python tests/mutations.py -k losses optim  only those whose id contains one of the words
  python tests/mutations.py --list           the mutations and their tests
  python tests/mutations.py --baseline       first run each distinct test selection unmutated
  tests/run.sh --mutations [args]            the same, in the test environment

Not part of the default test run (about 1-1.5 hours on 2 shared cores). Results: docs/testing.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]


@dataclasses.dataclass(frozen=True)
class Mutation:
  id: str
  path: str  # relative to the repository root
  old: str
  new: str
  tests: tuple[str, ...]  # pytest arguments (paths, -k selections)
  why: str  # the behaviour it breaks


M = Mutation
LOSSES = ("tests/test_losses.py",)
OPTIM = ("tests/test_optim.py",)
MODEL = ("tests/test_model.py", "tests/test_checkpoints_hf.py", "-k", "pooled or padding or poolings_match")
T5X = ("tests/test_checkpoints_t5x.py",)
HF = ("tests/test_checkpoints_hf.py",)
INIT_FROM = ("tests/test_train.py", "-k", "init_from")
DATA = ("tests/test_data_pipeline.py", "tests/test_tasks.py")

MUTATIONS = [
    # losses.py
    M("losses.temperature_multiplies", "st5_jax/losses.py", "return sims_BxC / temperature",
      "return sims_BxC * temperature", LOSSES, "logits divided by the temperature (eq. 13)"),
    M("losses.hard_negatives_dropped", "st5_jax/losses.py",
      "cands_CxD = right_BxD if right_neg_BxD is None else jnp.concatenate([right_BxD, right_neg_BxD], axis=0)",
      "cands_CxD = right_BxD", LOSSES, "hard negatives in the denominator (eq. 14)"),
    M("losses.label_smoothing_over_batch", "st5_jax/losses.py", "label_smoothing / C",
      "label_smoothing / B", LOSSES, "smoothing mass spread over all C candidates"),
    M("losses.bidirectional_weight", "st5_jax/losses.py", "loss = 0.5 * (loss + jnp.mean(xent_rev_B))",
      "loss = loss + 0.5 * jnp.mean(xent_rev_B)", LOSSES, "mean of both directions"),
    M("losses.uniformity_t1", "st5_jax/losses.py", "-2.0 * sq_NxN, -jnp.inf", "-1.0 * sq_NxN, -jnp.inf",
      LOSSES, "uniformity at t=2 (eq. 15)"),
    M("losses.simcse_weight_on_positive", "st5_jax/losses.py", "((0, 0), (B, 0))", "((0, 0), (0, B))",
      ("tests/test_layer_attention.py", "-k", "simcse"), "SimCSE weight on the own hard negative"),
    M("losses.simcse_not_cosine", "st5_jax/losses.py", "left_BxD, right_BxD = _unit(left_BxD), _unit(right_BxD)",
      "pass", ("tests/test_layer_attention.py", "-k", "simcse"), "SimCSE cosine similarity"),
    # optim.py
    M("optim.decay_rate_ignored", "st5_jax/optim.py", "decay = 1.0 - t ** (-config.decay_rate)",
      "decay = 1.0 - t ** (-0.3)", OPTIM, "beta2_t = 1 - t^-0.8"),
    M("optim.no_clipping", "st5_jax/optim.py",
      "y = y / jnp.maximum(1.0, _rms(y, plan.rms_dims) / config.clipping_threshold)", "y = y", OPTIM,
      "update clipping at RMS 1"),
    M("optim.clipping_over_whole_tensor", "st5_jax/optim.py",
      "y = y / jnp.maximum(1.0, _rms(y, plan.rms_dims) / config.clipping_threshold)",
      "y = y / jnp.maximum(1.0, _rms(y, None) / config.clipping_threshold)", OPTIM,
      "clipping per layer of a scanned stack"),
    M("optim.momentum_no_ema", "st5_jax/optim.py", "m = config.momentum * m + (1.0 - config.momentum) * u",
      "m = config.momentum * m + u", OPTIM, "momentum as an EMA of the scaled update"),
    M("optim.no_param_scale_floor", "st5_jax/optim.py",
      "scale = lr * jnp.maximum(_rms(p.astype(jnp.float32), plan.rms_dims), EPSILON2)",
      "scale = lr * _rms(p.astype(jnp.float32), plan.rms_dims)", OPTIM, "epsilon2 floor of the parameter scale"),
    M("optim.factored_row_not_normalised", "st5_jax/optim.py",
      "row_factor = (v_row / jnp.mean(v_row, axis=row_in_v_row, keepdims=True)) ** -0.5",
      "row_factor = v_row ** -0.5", OPTIM, "factored v_hat = v_row v_col / mean(v_row)"),
    M("optim.count_not_incremented", "st5_jax/optim.py", "count=optax.safe_increment(state.count)",
      "count=state.count", OPTIM, "the step count drives decay and schedule"),
    M("optim.schedule_decays_over_all_steps", "st5_jax/optim.py",
      "frac_left = jnp.clip((num_train_steps - step) / decay_steps, 0.0, 1.0)",
      "frac_left = jnp.clip((num_train_steps - step) / num_train_steps, 0.0, 1.0)",
      ("tests/test_train.py", "-k", "schedule"), "linear decay over the last 90%"),
    M("optim.factor_threshold_off_by_one", "st5_jax/optim.py", "if shape[row] >= min_dim_size_to_factor:",
      "if shape[row] > min_dim_size_to_factor:", OPTIM, "factor dims >= 128"),
    # the train step and loop (train.py)
    M("train.no_update", "st5_jax/train.py", "params = optax.apply_updates(state.params, updates)",
      "params = state.params", ("tests/test_train.py", "-k", "loss_goes_down"), "the update is applied"),
    M("train.hard_negatives_not_embedded", "st5_jax/objectives/contrastive.py",
      "return losses.in_batch_softmax_loss(emb[LEFT], emb[RIGHT], emb.get(RIGHT_NEG), **loss_kw)",
      "return losses.in_batch_softmax_loss(emb[LEFT], emb[RIGHT], None, **loss_kw)",
      ("tests/test_train.py", "-k", "seqio"), "the step uses the hard negatives"),
    M("train.same_dropout_key_every_step", "st5_jax/train.py", "key = jax.random.fold_in(base_key, state.step)",
      "key = base_key", ("tests/test_train.py", "tests/test_grad_cache.py", "-k", "dropout"),
      "a new dropout mask each step"),
    M("train.init_from_thrown_away", "st5_jax/train.py",
      "state = init_state(setup, model_config, seed=tc.seed, init_params=init_params)",
      "state = init_state(setup, model_config, seed=tc.seed, init_params=None)", INIT_FROM,
      "init_from weights are used"),
    M("train.init_projection_ignored", "st5_jax/train.py", 'fresh_projection=(init_projection == "fresh")',
      "fresh_projection=False", INIT_FROM, "init_projection='fresh'"),
    M("train.init_from_beats_checkpoint", "st5_jax/train.py", "restored = restore_latest_good(mngr, setup)",
      "restored = None if init_from else restore_latest_good(mngr, setup)", INIT_FROM,
      "an existing checkpoint wins over init_from"),
    M("train.corrupt_checkpoint_starts_over", "st5_jax/checkpoints/state.py",
      "      restored = restore_state(mngr, step, setup)\n",
      "      restored = restore_state(mngr, step, setup) if step == max(mngr.all_steps()) else None\n",
      ("tests/test_train.py", "-k", "corrupt"), "fall back to the surviving checkpoint"),
    M("train.no_eval_during_training", "st5_jax/train.py", "                 every=tc.eval_every)",
      "                 every=0)", ("tests/test_train.py", "-k", "eval_during"), "STS-B dev eval every eval_every steps"),
    M("train.eval_encoder_rebuilt_per_call", "st5_jax/train.py", "  return evaluator\n",
      "  return lambda params: make_sts_dev_eval(setup, model_config, data_dir=data_dir, vocab_file=vocab_file,\n"
      "                                          rules=rules, batch_size=batch_size)(params)\n",
      ("tests/test_train.py", "-k", "compiles_its_encoder_once"), "one compiled STS-B dev encoder for the run"),
    M("grad_cache.other_masks_in_backward", "st5_jax/objectives/grad_cache.py",
      "_, vjp = jax.vjp(lambda p: embed(p, inputs_b, k), params)",
      "_, vjp = jax.vjp(lambda p: embed(p, inputs_b, jax.random.fold_in(k, 1)), params)",
      ("tests/test_grad_cache.py", "-k", "dropout"), "the same dropout masks in GradCache's two passes"),
    M("bench.tokens_one_tower", "st5_jax/commands/bench.py",
      '"tokens_per_sec": args.batch * args.length * len(sides) / step_s',
      '"tokens_per_sec": args.batch * args.length / step_s', ("tests/test_bench.py",),
      "st5 bench counts every tower's tokens"),
    # model/st5.py poolings
    M("st5.mean_over_padding", "st5_jax/model/st5.py", "return total_BxD / jnp.maximum(jnp.sum(m, axis=1), 1e-9)",
      "return total_BxD / m.shape[1]", MODEL, "mean over non-padding tokens"),
    M("st5.first_is_last", "st5_jax/model/st5.py", "return encoded_BxLxD[:, 0].astype(jnp.float32)",
      "return encoded_BxLxD[:, 1].astype(jnp.float32)", MODEL, "enc_first takes token 0"),
    M("st5.decoder_start_eos", "st5_jax/model/st5.py",
      "start_Bx1 = jnp.full((tokens_BxL.shape[0], 1), DECODER_START_ID, jnp.int32)",
      "start_Bx1 = jnp.full((tokens_BxL.shape[0], 1), 1, jnp.int32)", MODEL, "decoder fed the start token 0"),
    M("st5.pad_in_mask", "st5_jax/model/st5.py", "    mask_BxL = tokens_BxL > 0\n", "    mask_BxL = tokens_BxL >= 0\n",
      MODEL, "padding masked out of pooling and cross-attention"),
    M("st5.not_normalised", "st5_jax/model/st5.py",
      "return l2_normalize(x_BxD) if self.config.normalize else x_BxD", "return x_BxD", MODEL,
      "L2-normalised output"),
    M("t5.dense_ignores_bf16", "st5_jax/model/t5.py",
      'return jnp.einsum("...d,df->...f", x.astype(self.dtype), kernel.astype(self.dtype))',
      'return jnp.einsum("...d,df->...f", x, kernel)', ("tests/test_model.py", "-k", "bfloat16"),
      "projections compute in the configured bfloat16"),
    # checkpoint importers
    M("hf.attention_not_transposed", "st5_jax/checkpoints/hf.py",
      'return f"{stack}/layers_{block}/{t5x_module}/{_ATTN[m[1]]}/kernel", True',
      'return f"{stack}/layers_{block}/{t5x_module}/{_ATTN[m[1]]}/kernel", False', HF,
      "HF [out, in] -> T5X [in, out]"),
    M("hf.relpos_not_transposed", "st5_jax/checkpoints/hf.py",
      'return f"{stack}/relpos_bias/rel_embedding", True', 'return f"{stack}/relpos_bias/rel_embedding", False',
      HF, "relative position bias layout"),
    M("t5x.gated_gets_relu", "st5_jax/checkpoints/t5x.py", 'mlp_activations=("gelu", "linear") if gated',
      'mlp_activations=("relu", "linear") if gated', T5X, "T5.1.1 gated-GELU inferred"),
    M("t5x.logits_always_tied", "st5_jax/checkpoints/t5x.py",
      'logits_via_embedding="decoder/logits_dense/kernel" not in flat', "logits_via_embedding=True", T5X,
      "untied logits of T5.1.1"),
    M("loader.fresh_projection_ignored", "st5_jax/checkpoints/loader.py", "  if fresh_projection:\n",
      "  if False:\n", INIT_FROM, "fresh projection replaces the checkpoint's"),
    # the data converter
    M("convert.no_eos", "st5_jax/data/convert.py", "    tokens_BxL[np.arange(n), lengths_B] = eos\n",
      "    pass\n", DATA, "EOS after the (trimmed) text"),
    M("convert.no_trim_room_for_eos", "st5_jax/data/convert.py",
      "keep = length - 1 if eos is not None else length", "keep = length - 1", DATA, "trim leaves room for EOS"),
    M("convert.negative_length_from_inputs", "st5_jax/data/convert.py",
      'lengths["negative_targets"] = lengths["targets"]', 'lengths["negative_targets"] = lengths["inputs"]',
      ("tests/test_data_seqio.py", "tests/test_data_bad_input.py"), "negative_targets defaults to targets' length"),
    # the host side of a run
    M("hostmem.never_reexecuted", "st5_jax/cli.py", "    hostmem.reexec_with_hugetlb_malloc()\n", "    pass\n",
      ("tests/test_hostmem.py",), "the st5 command runs on huge-page malloc"),
    M("metric_writer.event_files_share_a_name", "st5_jax/metric_writer.py",
      'filename_suffix=f".{os.getpid()}.{next(_WRITER_IDS)}"', 'filename_suffix=""',
      ("tests/test_hooks.py",), "one TensorBoard event file per writer"),
]


def _copy_repo(dst: pathlib.Path) -> None:
  files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                         check=True, capture_output=True).stdout.decode().split("\0")
  for f in filter(None, files):
    src = REPO / f
    if src.is_file():
      (dst / f).parent.mkdir(parents=True, exist_ok=True)
      shutil.copy2(src, dst / f)


def _apply(root: pathlib.Path, m: Mutation) -> None:
  path = root / m.path
  text = path.read_text()
  n = text.count(m.old)
  if n != 1:
    raise SystemExit(f"mutation {m.id}: the snippet occurs {n} times in {m.path} (the code moved; update it): "
                     f"{m.old!r}")
  path.write_text(text.replace(m.old, m.new))


def _pytest(root: pathlib.Path, tests: tuple[str, ...], timeout: int) -> tuple[str, float, str]:
  # The copy has no ../shared next to it: point the tests at this checkout's.
  env = dict(os.environ, PYTHONPATH=str(root),
             ST5_SHARED_DIR=os.environ.get("ST5_SHARED_DIR", str(REPO.parent / "shared")))
  t0 = time.time()
  try:
    out = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests], cwd=root,
                         env=env, capture_output=True, text=True, timeout=timeout)
  except subprocess.TimeoutExpired:
    return "error", time.time() - t0, "timeout"
  tail = (out.stdout + out.stderr).strip().splitlines()
  verdict = {0: "survived", 1: "killed"}.get(out.returncode, "error")
  failed = [l for l in tail if l.startswith("FAILED")]
  if not failed and any(l.startswith("ERROR") for l in tail):
    verdict = "error"  # a fixture or collection error is not a kill
  return verdict, time.time() - t0, (failed[0] if failed else tail[-1] if tail else "")[:200]


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("-k", nargs="*", default=[], help="run mutations whose id contains any of these words")
  ap.add_argument("--list", action="store_true")
  ap.add_argument("--baseline", action="store_true", help="run each test selection unmutated first")
  ap.add_argument("--timeout", type=int, default=1200)
  ap.add_argument("--json", help="write the results here")
  args = ap.parse_args(argv)
  chosen = [m for m in MUTATIONS if (not args.k or any(w in m.id for w in args.k))]
  if args.list:
    for m in chosen:
      print(f"{m.id:40s} {m.path:32s} {' '.join(m.tests)}")
    return 0
  results = []
  with tempfile.TemporaryDirectory(prefix="st5_mutations_") as tmp:
    root = pathlib.Path(tmp) / "repo"
    if args.baseline:
      _copy_repo(root)
      for tests in dict.fromkeys(m.tests for m in chosen):
        verdict, secs, detail = _pytest(root, tests, args.timeout)
        print(f"baseline {' '.join(tests)}: {'pass' if verdict == 'survived' else 'FAIL ' + detail} ({secs:.0f}s)",
              flush=True)
        if verdict != "survived":
          return 2
      shutil.rmtree(root)
    for m in chosen:
      _copy_repo(root)
      _apply(root, m)
      verdict, secs, detail = _pytest(root, m.tests, args.timeout)
      shutil.rmtree(root)
      results.append(dict(id=m.id, path=m.path, verdict=verdict, seconds=round(secs), tests=" ".join(m.tests),
                          why=m.why, detail=detail))
      print(f"{verdict:8s} {m.id:40s} {secs:5.0f}s  {detail}", flush=True)
  counts = {v: sum(r["verdict"] == v for r in results) for v in ("killed", "survived", "error")}
  print(f"\n{counts['killed']} killed, {counts['survived']} survived, {counts['error']} errors "
        f"of {len(results)} mutants")
  if args.json:
    pathlib.Path(args.json).write_text(json.dumps(dict(counts=counts, results=results), indent=2))
  return 0 if counts["survived"] == counts["error"] == 0 else 1


if __name__ == "__main__":
  sys.exit(main())
