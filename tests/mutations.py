"""Hand-written mutation check: break one behaviour of the core, run the tests that should see it.

Each mutation replaces one exact snippet (which must occur exactly once) in a copy of the
repository's tracked files under a temporary directory, then runs its test selection there
with that copy first on PYTHONPATH; the checkout itself is never modified. A mutant is
"killed" when pytest fails (exit code 1), "survived" when the tests pass (0), and "error"
for anything else (collection error, timeout) -- an error is not a kill.

  python tests/mutations.py                  all mutations
  python tests/mutations.py -k losses optim  only those whose id contains one of the words
  python tests/mutations.py --list           the mutations and their tests
  python tests/mutations.py --check          apply nothing: every snippet occurs once, every test file exists
  python tests/mutations.py --baseline       first run each distinct test selection unmutated
  tests/run.sh --mutations [args]            the same, in the test environment

127 mutants over losses (K hard negatives included), Adafactor and AdamW, the schedules, the train step
and loop, the poolings, layer attention, the checkpoint importers, orbax restore, partitioning rules,
batch geometry, the data converter, mixing, dedup, iterator state and elastic resume, export (SavedModel,
sentence-transformers), ConSERT's augmentations, SEED-Encoder's weak decoder, evaluation, early
stopping, retrieval metrics, BM25 and mining's false-negative filters. Each result records the test
that killed the mutant (the first FAILED line of pytest -x). Not part of the default test run (the
116 of 2026-12-02 took about 3.3 hours of per-mutant time on 2 shared cores). Results: docs/testing.md,
"The mutation check".
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
PART = ("tests/test_partitioning_rules.py",)
GEOM = ("tests/test_data_pipeline.py", "-k", "indivisible or every_data_axis or reader_assignment or two_data_axes")
CORRUPT = ("tests/test_train.py", "-k", "corrupt")
EXPORT_ST = ("tests/test_export_sentence_transformers.py", "-k", "parity")
EXPORT_SM = ("tests/test_export_savedmodel.py", "-k", "tokenization or tf_hub or tf_only_reload or read_the_savedmodel")
ADAMW = ("tests/test_optim_adamw.py",)
EARLY = ("tests/test_early_stopping.py", "-k", "best_keeper")
LOSSES_K = ("tests/test_losses.py", "-k", "k_negatives or weight_moves")
RET_METRICS = ("tests/test_retrieval_metrics.py", "-k", "ir_measures or known_answers")
MINE_FILTERS = ("tests/test_mine.py", "-k", "false_negative_filter")


def _k(path):
  return lambda words: (path, "-k", words)


DATA_K = _k("tests/test_data_pipeline.py")
CONSERT_K = _k("tests/test_consert.py")
SEED_K = _k("tests/test_seed_encoder.py")
LA_K = _k("tests/test_layer_attention.py")
EVAL_M = _k("tests/test_evaluation_metrics.py")
EVAL_L = _k("tests/test_evaluation_linear.py")

MUTATIONS = [
    # losses.py
    M("losses.temperature_multiplies", "st5_jax/losses.py", "return sims_BxC / temperature",
      "return sims_BxC * temperature", LOSSES, "logits divided by the temperature (eq. 13)"),
    M("losses.hard_negatives_dropped", "st5_jax/losses.py",
      # The negatives leave the softmax only: their logits stay computed (the metrics' shapes hold), so a
      # test must see the value, not a shape error.
      "xent_B, correct_B = _softmax_xent(logits_BxC, label_smoothing)",
      "xent_B, correct_B = _softmax_xent(logits_BxC[:, :B], label_smoothing)", LOSSES,
      "hard negatives in the denominator (eq. 14)"),
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
    M("losses.k_weight_on_first_negative_only", "st5_jax/losses.py", "jnp.tile(jnp.eye(B, dtype=jnp.float32), (1, K))",
      "jnp.eye(B, K * B, dtype=jnp.float32)", LOSSES_K, "SimCSE's weight on each of the query's own K negatives"),
    M("losses.k_negatives_rows_not_swapped", "st5_jax/losses.py", "jnp.swapaxes(right_neg, 0, 1).reshape(K * B, D)",
      "right_neg.reshape(K * B, D)", LOSSES_K, "[B, K, D] negatives as rows k*B + j (the towers' order)"),
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
    M("optim.count_not_incremented", "st5_jax/optim.py", "AdafactorState(count=optax.safe_increment(state.count)",
      "AdafactorState(count=state.count", OPTIM, "the step count drives decay and schedule"),
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
      "return losses.in_batch_softmax_loss(e[LEFT], e[RIGHT], [e[s] for s in negatives] or None, **loss_kw)",
      "return losses.in_batch_softmax_loss(e[LEFT], e[RIGHT], None, **loss_kw)",
      ("tests/test_train.py", "-k", "seqio"), "the step uses the hard negatives"),
    M("train.same_dropout_key_every_step", "st5_jax/train.py", "key = jax.random.fold_in(base_key, state.step)",
      "key = base_key", ("tests/test_train.py", "tests/test_grad_cache.py", "-k", "dropout"),
      "a new dropout mask each step"),
    M("train.init_from_thrown_away", "st5_jax/train.py",
      "state = init_state(setup, model_config, seed=tc.seed, init_params=init_params)",
      "state = init_state(setup, model_config, seed=tc.seed, init_params=None)", INIT_FROM,
      "init_from weights are used"),
    M("train.init_projection_ignored", "st5_jax/objectives/base.py", 'fresh_projection=(init_projection == "fresh")',
      "fresh_projection=False", INIT_FROM, "init_projection='fresh'"),
    M("train.init_from_beats_checkpoint", "st5_jax/train.py", "restored = restore_latest_good(mngr, setup)",
      "restored = None if init_from else restore_latest_good(mngr, setup)", INIT_FROM,
      "an existing checkpoint wins over init_from"),
    M("train.corrupt_checkpoint_starts_over", "st5_jax/checkpoints/state.py",
      "      restored = restore_state(mngr, step, setup)\n",
      "      restored = restore_state(mngr, step, setup) if step == max(mngr.all_steps()) else None\n",
      ("tests/test_train.py", "-k", "corrupt"), "fall back to the surviving checkpoint"),
    M("train.no_eval_during_training", "st5_jax/hooks.py", "metric=metric),\n                 every=eval_every)",
      "metric=metric),\n                 every=0)", ("tests/test_train.py", "-k", "eval_during"),
      "STS-B dev eval every eval_every steps"),
    # A ShardedEncoder rebuilt around the same `encode` hits JAX's jit caches (no new XLA compile, so the
    # compile-count test passes), but it compiles its buckets again through compile_together (a barrier per
    # bucket on a pod): the seqio test records those calls by name.
    M("train.eval_encoder_rebuilt_per_call", "st5_jax/evaluation/in_training.py",
      "  return DevEvaluator(sharded(encode, param_keys), metrics=metrics, data_dir=data_dir,\n"
      "                      document_encoder=None if document is None else sharded(*document))\n",
      "  return lambda params: DevEvaluator(sharded(encode, param_keys), metrics=metrics, data_dir=data_dir,\n"
      "                      document_encoder=None if document is None else sharded(*document))(params)\n",
      ("tests/test_train.py", "-k", "seqio"), "one compiled STS-B dev encoder for the run"),
    M("grad_cache.other_masks_in_backward", "st5_jax/objectives/grad_cache.py",
      "_, vjp = jax.vjp(lambda p: f(p, inputs_b, k), params)",
      "_, vjp = jax.vjp(lambda p: f(p, inputs_b, jax.random.fold_in(k, 1)), params)",
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
    M("hostmem.never_reexecuted", "st5_jax/cli.py", "    hostmem.reexec_with_hugetlb_malloc()  # docs/performance.md\n",
      "    pass\n",
      ("tests/test_hostmem.py",), "the st5 command runs on huge-page malloc"),
    M("metric_writer.event_files_share_a_name", "st5_jax/metric_writer.py",
      'filename_suffix=f".{os.getpid()}.{next(_WRITER_IDS)}"', 'filename_suffix=""',
      ("tests/test_hooks.py",), "one TensorBoard event file per writer"),
    # partitioning.py: the logical-axis rules and the mesh
    M("partitioning.heads_replicated", "st5_jax/partitioning.py", '    ("heads", "model"),\n',
      '    ("heads", None),\n', PART, "attention heads split over the model axis"),
    M("partitioning.mlp_replicated", "st5_jax/partitioning.py", '    ("mlp", "model"),\n', '    ("mlp", None),\n',
      PART, "the MLP's hidden dimension split over the model axis"),
    M("partitioning.embed_over_model", "st5_jax/partitioning.py", '    ("embed", "fsdp"),\n',
      '    ("embed", "model"),\n', PART, "embed split over fsdp (ZeRO-3), not the model axis"),
    M("partitioning.vocab_replicated", "st5_jax/partitioning.py", '    ("vocab", "model"),\n',
      '    ("vocab", None),\n', PART, "the embedding table's vocab split over the model axis"),
    M("partitioning.mesh_fill_ignores_known", "st5_jax/partitioning.py",
      "sizes[sizes.index(-1)] = num_devices // known", "sizes[sizes.index(-1)] = num_devices",
      ("tests/test_gin_and_launch.py", "-k", "mesh_config_fills"), "-1 takes the devices the other axes leave"),
    M("partitioning.divisibility_unchecked", "st5_jax/partitioning.py", "      if dim % size:\n",
      "      if False:\n", PART, "a dimension that does not divide by its mesh axes is named before compiling"),
    # batch_geometry.py
    M("batch_geometry.shards_first_axis_only", "st5_jax/batch_geometry.py",
      "return math.prod(mesh.shape[a] for a in data_axes)", "return mesh.shape[data_axes[0]]", GEOM,
      "the batch splits over every data axis"),
    M("batch_geometry.process_count_unchecked", "st5_jax/batch_geometry.py",
      "  if global_batch_size % process_count:\n", "  if False:\n", GEOM, "each process feeds an equal slice"),
    M("batch_geometry.adjacent_spans_not_merged", "st5_jax/batch_geometry.py", "      if a <= merged[-1][1]:\n",
      "      if a < merged[-1][1]:\n", GEOM, "a process's adjacent device rows form one slice"),
    M("batch_geometry.reader_is_process", "st5_jax/batch_geometry.py", "reader_id=distinct.index(mine)",
      "reader_id=process_index", GEOM, "processes replicating the same rows read the same shard"),
    M("batch_geometry.readers_per_process", "st5_jax/batch_geometry.py", "num_readers=len(distinct)",
      "num_readers=len(ranges)", GEOM, "one reader per distinct batch slice, not per process"),
    # orbax save/restore of the training state (checkpoints/state.py, train.py)
    M("restore.opt_state_reset", "st5_jax/checkpoints/state.py", 'opt_state=restored["opt_state"]), meta',
      'opt_state=jax.tree.map(jnp.zeros_like, restored["opt_state"])), meta', CORRUPT,
      "the optimizer state (Adafactor's v, the count) carries over a resume"),
    M("restore.step_from_zero", "st5_jax/checkpoints/state.py", 'jnp.asarray(meta["step"], jnp.int32)',
      "jnp.asarray(0, jnp.int32)", CORRUPT, "the step counter carries over a resume"),
    M("restore.data_state_not_restored", "st5_jax/train.py", '        stream.set_state(meta["data_state"])\n',
      "        pass\n", CORRUPT, "the data iterator resumes where the checkpoint left it"),
    M("restore.corrupt_left_in_place", "st5_jax/checkpoints/state.py", "    if bad:\n      _move_aside(mngr, bad)\n",
      "", CORRUPT, "unreadable newer steps are moved out of orbax's listing"),
    M("restore.opt_state_saved_as_params", "st5_jax/checkpoints/state.py",
      "opt_state=ocp.args.StandardSave(state.opt_state)", "opt_state=ocp.args.StandardSave(state.params)",
      ("tests/test_train.py", "-k", "different_mesh"), "the optimizer state is what is saved as opt_state"),
    # data: the mixing schedule, dedup windows, the iterator's state (st5_jax/data/)
    M("data.mixing_due_not_centred", "st5_jax/data/mixing.py", "times.append((pos + j + 0.5) / rate)",
      "times.append((pos + j) / rate)", DATA_K("schedule_is"), "item j of task t is due at (j + 1/2) / rate_t"),
    M("data.mixing_limits_ignored", "st5_jax/data/mixing.py",
      "avail = n if limits is None else max(0, min(n, int(limits[t] - pos)))", "avail = n", DATA_K("schedule_is"),
      "a task without repeat stops after one epoch"),
    M("data.mixture_rates_ignored", "st5_jax/data/mixing.py",
      "rates = np.asarray([float(provider.get_rate(t)) for t in tasks], np.float64)",
      "rates = np.ones(len(tasks), np.float64)", DATA_K("mixture_resume"), "a mixture follows its rates"),
    M("data.dedup_right_not_checked", "st5_jax/data/dedup.py",
      "if len(batches[j]) < batch_size and lk not in left_keys[j] and not (rk & right_keys[j]):",
      "if len(batches[j]) < batch_size and lk not in left_keys[j]:", DATA_K("dedup"),
      "no repeated right text (targets, hard negatives) in a batch"),
    M("data.dedup_no_swap", "st5_jax/data/dedup.py",
      "    elif _swap_into(i, keys, batches, left_keys, right_keys, open_batches):\n      continue\n", "",
      DATA_K("dedup_assign"), "a row that clashes everywhere swaps with a row of a full batch"),
    M("data.state_not_window_start", "st5_jax/data/iterator.py",
      "      if block is not None and self._block_index < len(block.batches):\n", "      if False:\n",
      DATA_K("dedup_removes"), "inside a dedup window the state points at the window's start (replayed)"),
    M("data.resume_skips_no_batches", "st5_jax/data/iterator.py",
      'block_start_step=int(state["block_start_step"]), positions=positions,',
      'block_start_step=int(state["step"]), positions=positions,', DATA_K("dedup_removes"),
      "a resumed window replays up to the saved step"),
    M("data.resume_positions_lost", "st5_jax/data/iterator.py",
      'positions = np.asarray([int(state["positions"][t.name]) for t in self.tasks], np.int64)',
      "positions = np.zeros(len(self.tasks), np.int64)", DATA_K("mixture_resume"),
      "each task's examples consumed carry over a resume"),
    M("data.state_mismatch_unchecked", "st5_jax/data/iterator.py", "    if diffs:\n      detail", "    if False:\n      detail",
      DATA_K("state_mismatch"), "a state from another task/seed/batch is refused"),
    M("data.elastic_skip_ignored", "st5_jax/data/elastic.py", "units.append([old_n, r, epoch, offset])",
      "units.append([old_n, r, epoch, 0])", ("tests/test_data_elastic.py",),
      "an elastic resume deals only the old readers' unread rest of their epoch"),
    M("data.elastic_carry_not_kept", "st5_jax/data/iterator.py", '    if carry:\n      state["elastic"] = carry\n', "",
      ("tests/test_data_elastic.py",), "a state saved inside the carry epoch resumes it"),
    M("data.epoch_seed_ignores_epoch", "st5_jax/data/streams.py",
      "rng = np.random.default_rng([self.seed, task_key(self.task.name), epoch])",
      "rng = np.random.default_rng([self.seed, task_key(self.task.name)])", DATA_K("reshuffled"),
      "each epoch is a new permutation"),
    # export: SavedModel and sentence-transformers (st5_jax/export/)
    M("export_st.dense_not_transposed", "st5_jax/export/sentence_transformers.py",
      'save_file({"linear.weight": np.ascontiguousarray(kernel_DxE.T)}',
      'save_file({"linear.weight": np.ascontiguousarray(kernel_DxE)}', EXPORT_ST,
      "the projection as torch's Linear.weight [out, in]"),
    M("export_st.mean_pooling_misnamed", "st5_jax/export/sentence_transformers.py",
      '"pooling_mode_mean_tokens": config.pooling == "enc_mean",', '"pooling_mode_mean_tokens": config.pooling == "mean",',
      EXPORT_ST, "enc_mean exports sentence-transformers' mean pooling"),
    M("export_st.no_normalize_module", "st5_jax/export/sentence_transformers.py", "    if config.normalize:\n      norm_dir",
      "    if False:\n      norm_dir", EXPORT_ST, "a normalised tower ends in a Normalize module"),
    M("export_st.max_seq_length_default", "st5_jax/export/sentence_transformers.py",
      'json.dumps({"max_seq_length": config.max_length,', 'json.dumps({"max_seq_length": 512,', EXPORT_ST,
      "the tower's max_length is sentence-transformers' max_seq_length"),
    M("export_sm.truncate_without_eos_room", "st5_jax/export/savedmodel.py",
      "self.tokenizer.tokenize(inputs)[:, : max_length - 1]", "self.tokenizer.tokenize(inputs)[:, : max_length]",
      EXPORT_SM, "in-graph truncation leaves room for EOS"),
    M("export_sm.no_eos", "st5_jax/export/savedmodel.py", "      tokens = tf.concat([pieces, eos], axis=1)\n",
      "      tokens = pieces\n", EXPORT_SM, "in-graph tokenisation appends EOS"),
    M("export_sm.trainable_variables", "st5_jax/export/savedmodel.py",
      "tf.Variable(np.asarray(value, np.float32), trainable=False, name=name)",
      "tf.Variable(np.asarray(value, np.float32), name=name)", EXPORT_SM, "the TF Hub module's weights are frozen"),
    M("export_sm.variables_misread", "st5_jax/checkpoints/savedmodel.py",
      "zip(meta[\"param_names\"], meta[\"param_shapes\"])", "zip(sorted(meta[\"param_names\"], key=len), meta[\"param_shapes\"])",
      EXPORT_SM, "load_flat reads each variable under its own name"),
    # ConSERT's augmentations (objectives/consert/augment.py)
    M("consert.token_cutoff_rounds", "st5_jax/objectives/consert/augment.py",
      "k_B = _count(L, lambda n: int(n * rate), jnp.sum(mask_BxL, axis=-1))",
      "k_B = _count(L, lambda n: round(n * rate), jnp.sum(mask_BxL, axis=-1))", CONSERT_K("token_cutoff or counts_are"),
      "token cutoff zeroes int(n * rate) rows (the official code's count)"),
    M("consert.feature_cutoff_one_more", "st5_jax/objectives/consert/augment.py", "return ranks_BxD >= int(dim * rate)",
      "return ranks_BxD > int(dim * rate)", CONSERT_K("feature_cutoff"), "feature cutoff zeroes int(d * rate) columns"),
    M("consert.dropout_hits_padding", "st5_jax/objectives/consert/augment.py",
      "eligible_BxLD = jnp.repeat(mask_BxL, dim, axis=1)", "eligible_BxLD = jnp.ones((B, L * dim), bool)",
      CONSERT_K("dropout_zeroes"), "dropout draws its elements from the real rows only"),
    M("consert.shuffle_moves_padding", "st5_jax/objectives/consert/augment.py",
      "return jnp.where(mask_BxL, shuffled_BxL, idx_L[None, :])", "return shuffled_BxL", CONSERT_K("shuffle_is"),
      "padding keeps its positions in the shuffle"),
    M("consert.span_keeps_rate", "st5_jax/objectives/consert/augment.py", "lambda n: max(int(n * (1 - rate)), 1)",
      "lambda n: max(int(n * rate), 1)", CONSERT_K("span_cutoff"), "span cutoff keeps a 1 - rate span"),
    M("consert.fgv_not_normalised", "st5_jax/objectives/consert/augment.py",
      "eps * g / (norm_BxLx1 + 1e-10), 0.0)", "eps * g, 0.0)", CONSERT_K("fgv"), "FGV: eps times the unit gradient"),
    # SEED-Encoder's weak decoder: its window and its targets (objectives/seed_encoder/)
    M("seed.window_one_wider", "st5_jax/objectives/seed_encoder/weak_decoder.py", "(j_1xT > i_Tx1 - window)",
      "(j_1xT >= i_Tx1 - window)", SEED_K("window_mask or sees_only"), "query i sees keys i-k < j <= i"),
    M("seed.window_forgets_start", "st5_jax/objectives/seed_encoder/weak_decoder.py",
      "((j_1xT > i_Tx1 - window) | (j_1xT == 0))", "(j_1xT > i_Tx1 - window)", SEED_K("window_mask or sees_only"),
      "every query also sees the start token"),
    M("seed.window_peeks_ahead", "st5_jax/objectives/seed_encoder/weak_decoder.py", "return (j_1xT <= i_Tx1) &",
      "return (j_1xT <= i_Tx1 + 1) &", SEED_K("window_mask or sees_only"), "the weak decoder is causal"),
    M("seed.weak_inputs_not_shifted", "st5_jax/objectives/seed_encoder/objective.py",
      "weak_decoder_input_tokens_BxS=None if weak_targets is None else shift_right(weak_targets)",
      "weak_decoder_input_tokens_BxS=None if weak_targets is None else weak_targets",
      SEED_K("loss_equals or uncorrupted"), "teacher forcing: inputs are the targets shifted right"),
    M("seed.weak_targets_corrupted", "st5_jax/objectives/seed_encoder/objective.py",
      "weak_targets = batch[WEAK_DECODER_TARGETS] if weight > 0 else None",
      "weak_targets = batch[ENCODER_INPUTS] if weight > 0 else None", SEED_K("loss_equals or uncorrupted"),
      "the weak decoder reconstructs the uncorrupted text"),
    M("seed.tied_logits_not_rescaled", "st5_jax/objectives/seed_encoder/weak_decoder.py",
      "logits_BxTxV = embedder.attend(y) / jnp.sqrt(jnp.float32(y.shape[-1]))", "logits_BxTxV = embedder.attend(y)",
      SEED_K("tied_embedding_over_sqrt_d"), "tied logits rescaled by 1/sqrt(d)"),
    M("seed.memory_always_pooled", "st5_jax/objectives/seed_encoder/weak_decoder.py",
      'return projected_BxE if self.seed.memory == "projected" else pooled_BxD', "return pooled_BxD",
      SEED_K("one_memory_slot"), "memory='projected' feeds the projected vector"),
    # layer attention pooling (model/layer_attention.py), besides the two SimCSE loss mutants above
    M("layer_attention.scores_over_sqrt_d", "st5_jax/model/layer_attention.py",
      'jnp.einsum("bqd,bnd->bqn", q_BxNxD, k_BxNxD) / N', 'jnp.einsum("bqd,bnd->bqn", q_BxNxD, k_BxNxD) / jnp.sqrt(D)',
      LA_K("at_inference"), "scores divided by the number of layers N, not sqrt(D)"),
    M("layer_attention.eos_index_past_the_end", "st5_jax/model/layer_attention.py",
      "jnp.maximum(jnp.sum(mask_BxL.astype(jnp.int32), axis=1) - 1, 0)",
      "jnp.maximum(jnp.sum(mask_BxL.astype(jnp.int32), axis=1), 0)", LA_K("at_inference"),
      "the EOS query is the last non-padding token"),
    M("layer_attention.mean_over_padding", "st5_jax/model/layer_attention.py",
      "/ jnp.maximum(jnp.sum(m, axis=1), 1e-9)[None, :, None]", "/ m.shape[1]", LA_K("at_inference"),
      "m_l averages the non-padding tokens"),
    M("layer_attention.concat_first_layer", "st5_jax/model/layer_attention.py",
      "cat_Bx2D = jnp.concatenate([c_NxBxD[-1], o_BxD], axis=-1)", "cat_Bx2D = jnp.concatenate([c_NxBxD[0], o_BxD], axis=-1)",
      LA_K("at_inference"), "z reads c_L, the last layer's query token"),
    M("layer_attention.relu_at_inference", "st5_jax/model/layer_attention.py", "    slope = RRELU_EVAL_SLOPE\n",
      "    slope = 0.0\n", LA_K("at_inference"), "RReLU's mean slope 11/48 at inference"),
    M("layer_attention.v_shares_k_draw", "st5_jax/model/layer_attention.py",
      "(B, N, N, D)), key=k_v)", "(B, N, N, D)), key=k_k)", LA_K("in_training"),
      "K and V get independent RReLU draws"),
    # evaluation: correlations, cosine, SentEval's k-fold protocols (st5_jax/evaluation/)
    M("eval.ties_min_rank", "st5_jax/evaluation/metrics.py", "mean_rank_G = starts_G + (counts_G + 1) / 2.0",
      "mean_rank_G = starts_G + 1.0", EVAL_M("spearman"), "tied values get their average rank"),
    M("eval.spearman_without_ranks", "st5_jax/evaluation/metrics.py", "return pearson(rankdata(a_N), rankdata(b_N))",
      "return pearson(a_N, b_N)", EVAL_M("spearman"), "Spearman is Pearson of ranks"),
    M("eval.pearson_not_centred", "st5_jax/evaluation/metrics.py",
      "b_N = np.asarray(b_N, np.float64) - np.mean(b_N)", "b_N = np.asarray(b_N, np.float64)", EVAL_M("pearson"),
      "Pearson centres both sides"),
    M("eval.f1_without_factor_two", "st5_jax/evaluation/metrics.py", "float(2 * tp / denom)", "float(tp / denom)",
      EVAL_M("classification"), "F1 = 2 tp / (|true| + |pred|)"),
    M("eval.cosine_unnormalised", "st5_jax/evaluation/sts.py",
      "np.where(denom_N > 0, dots_N / np.where(denom_N > 0, denom_N, 1.0), 0.0)", "dots_N", EVAL_M("cosine"),
      "STS scores cosine similarity"),
    M("eval.subset_wmean_unweighted", "st5_jax/evaluation/sts.py", "spearman_wmean=float(np.average(sp, weights=w))",
      "spearman_wmean=float(sp.mean())", EVAL_M("per_subset"), "SentEval's weighted mean over subsets"),
    M("eval.inner_kfold_scores_an_inner_fold", "st5_jax/evaluation/transfer.py",
      "test = 100 * per_outer[np.arange(kfold), best, kfold]", "test = 100 * per_outer[np.arange(kfold), best, 0]",
      EVAL_L("inner_kfold"), "the outer test fold is scored by the model fitted on the whole outer train"),
    M("eval.kfold_select_no_refit", "st5_jax/evaluation/transfer.py", "test_pred = pred_NxP[n_tr:, best, kfold]",
      "test_pred = pred_NxP[n_tr:, best, 0]", EVAL_L("kfold_select"), "the chosen C is refitted on all of train"),
    M("eval.kfold_select_dev_on_train_rows", "st5_jax/evaluation/transfer.py",
      "for j, (_, va) in enumerate(folds)])", "for j, (va, _) in enumerate(folds)])", EVAL_L("kfold_select"),
      "C is chosen on each fold's held-out rows"),
    # AdamW and its warm-up/linear schedule (optim.py make_adamw / warmup_linear_schedule)
    M("adamw.warmup_off_by_one", "st5_jax/optim.py", "up = step / max(warmup, 1)", "up = (step + 1) / max(warmup, 1)",
      ADAMW, "warm-up from lr * 0 at step 0 (transformers' get_linear_schedule_with_warmup)"),
    M("adamw.decay_over_all_steps", "st5_jax/optim.py", "(num_train_steps - step) / max(num_train_steps - warmup, 1)",
      "(num_train_steps - step) / max(num_train_steps, 1)", ADAMW, "linear decay over the steps after warm-up"),
    M("adamw.decay_mask_inverted", "st5_jax/optim.py", "return str(name) not in no_decay",
      "return str(name) in no_decay", ADAMW, "no weight decay on biases and layer-norm scales"),
    M("adamw.eps_inside_sqrt", "st5_jax/optim.py", "out = jax.tree.map(lambda m, v: m / (jnp.sqrt(v) + eps), mu, nu)",
      "out = jax.tree.map(lambda m, v: m / jnp.sqrt(v + eps), mu, nu)", ADAMW,
      "transformers.AdamW's m / (sqrt(v) + eps)"),
    M("adamw.decay_before_step", "st5_jax/optim.py", "u - lr * weight_decay * (p + u) if k else u",
      "u - lr * weight_decay * p if k else u", ADAMW, "uncorrected AdamW decays the parameters after the Adam step"),
    M("adamw.no_grad_clipping", "st5_jax/optim.py",
      "return optax.chain(optax.clip_by_global_norm(config.max_grad_norm), adamw), schedule", "return adamw, schedule",
      ADAMW, "gradients clipped to global norm max_grad_norm"),
    # early stopping (hooks.py BestKeeper)
    M("early_stopping.min_delta_ignored", "st5_jax/hooks.py", "score > self.best + self.config.min_delta",
      "score > self.best", EARLY, "an improvement must exceed min_delta"),
    M("early_stopping.patience_off_by_one", "st5_jax/hooks.py", "self.bad >= self.config.patience",
      "self.bad > self.config.patience", EARLY, "stop after `patience` evaluations without improvement"),
    M("early_stopping.bad_not_reset", "st5_jax/hooks.py", "self.best, self.best_step, self.bad = float(score), step, 0",
      "self.best, self.best_step = float(score), step", EARLY, "an improvement resets the patience count"),
    M("early_stopping.nan_can_be_best", "st5_jax/hooks.py", "    if not math.isfinite(score):", "    if False:",
      EARLY, "a NaN score never becomes the best"),
    M("early_stopping.patience_not_restored", "st5_jax/hooks.py",
      'self.bad: int = int(r.get("bad_evaluations", 0))', "self.bad: int = 0", EARLY,
      "a resumed run keeps its patience count"),
    # retrieval metrics (retrieval/metrics.py), BM25 (retrieval/bm25.py), mining's false-negative filters
    M("retrieval.mrr_cutoff_off_by_one", "st5_jax/retrieval/metrics.py",
      "1.0 / (first + 1) if first is not None and first < k", "1.0 / (first + 1) if first is not None and first <= k",
      RET_METRICS, "MRR@k counts a first relevant document at ranks 1..k only"),
    M("retrieval.ndcg_natural_log", "st5_jax/retrieval/metrics.py",
      "      dcg = sum(g / math.log2(i + 2)", "      dcg = sum(g / math.log(i + 2)", RET_METRICS,
      "DCG discounts by log2(rank + 1), as its ideal DCG"),
    M("retrieval.map_over_min_k_r", "st5_jax/retrieval/metrics.py", "value = precision_sum[cut] / n_relevant",
      "value = precision_sum[cut] / min(k, n_relevant)", RET_METRICS,
      "MAP@k divides by R (trec_eval map_cut), not sentence-transformers' min(k, R)"),
    M("bm25.k1_b_ignored", "st5_jax/retrieval/bm25.py", 'bm25s.BM25(method="lucene", k1=k1, b=b)',
      'bm25s.BM25(method="lucene")', ("tests/test_mine.py", "tests/test_evaluation_retrieval.py", "-k",
                                     "numpy_lucene_bm25 or bm25_row_equals"), "BM25 scores with the given k1 and b"),
    M("mine.range_min_off_by_one", "st5_jax/data/offline/mine.py", "    if rank < config.range_min:\n",
      "    if rank <= config.range_min:\n", MINE_FILTERS, "range_min drops ranks 0..range_min-1"),
    M("mine.margin_flipped", "st5_jax/data/offline/mine.py", "score > margin_limit", "score < margin_limit",
      MINE_FILTERS, "margin drops candidates scoring above p - margin"),
    M("mine.relative_margin_scales_p", "st5_jax/data/offline/mine.py",
      "floor - abs(floor) * config.relative_margin", "floor * (1 - config.relative_margin)", MINE_FILTERS,
      "relative_margin stays below p when p < 0"),
]


def _copy_repo(dst: pathlib.Path) -> None:
  files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                         check=True, capture_output=True).stdout.decode().split("\0")
  for f in filter(None, files):
    src = REPO / f
    if src.is_file():
      (dst / f).parent.mkdir(parents=True, exist_ok=True)
      shutil.copy2(src, dst / f)


def stale(mutations=MUTATIONS, root: pathlib.Path = REPO) -> list[str]:
  """One line per problem that would stop a run: a snippet not found exactly once, a missing test file, a
  repeated id (nothing is applied; the check reads the files under `root`)."""
  problems = [f"{i}: the id is used twice" for i in sorted({m.id for m in mutations})
              if sum(m.id == i for m in mutations) > 1]
  for m in mutations:
    path = root / m.path
    n = path.read_text().count(m.old) if path.is_file() else 0
    if n != 1:
      problems.append(f"{m.id}: the snippet occurs {n} times in {m.path}: {m.old!r}")
    problems += [f"{m.id}: no test file {t}" for t in m.tests if t.endswith(".py") and not (root / t).is_file()]
  return problems


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


def killed_by(detail: str) -> str:
  """The test id of pytest's first FAILED line ("FAILED tests/x.py::test_y[p] - msg" -> "tests/x.py::test_y[p]")."""
  return detail.split(" ")[1] if detail.startswith("FAILED ") else ""


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("-k", nargs="*", default=[], help="run mutations whose id contains any of these words")
  ap.add_argument("--list", action="store_true")
  ap.add_argument("--check", action="store_true",
                  help="apply nothing; exit 1 listing each snippet not found exactly once, missing test file, repeated id")
  ap.add_argument("--baseline", action="store_true", help="run each test selection unmutated first")
  ap.add_argument("--timeout", type=int, default=1200)
  ap.add_argument("--json", help="write the results here")
  args = ap.parse_args(argv)
  chosen = [m for m in MUTATIONS if (not args.k or any(w in m.id for w in args.k))]
  if args.check:
    problems = stale(chosen)
    print("\n".join(problems) if problems else f"all {len(chosen)} snippets occur exactly once")
    return 1 if problems else 0
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
                          why=m.why, killed_by=killed_by(detail) if verdict == "killed" else "",
                          detail=detail))
      print(f"{verdict:8s} {m.id:40s} {secs:5.0f}s  {detail}", flush=True)
  counts = {v: sum(r["verdict"] == v for r in results) for v in ("killed", "survived", "error")}
  print(f"\n{counts['killed']} killed, {counts['survived']} survived, {counts['error']} errors "
        f"of {len(results)} mutants")
  if args.json:
    pathlib.Path(args.json).write_text(json.dumps(dict(counts=counts, results=results), indent=2))
  return 0 if counts["survived"] == counts["error"] == 0 else 1


if __name__ == "__main__":
  sys.exit(main())
