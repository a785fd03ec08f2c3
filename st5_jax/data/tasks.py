"""Sentence-T5 seqio tasks and mixtures, registered on import.

Stage 1 (question-answer pairs, in-batch negatives only):
  st5_reqa_squad_sentences       SQuAD v1.1 *train* question -> sentence holding the answer (ReQA), when
                                 squad_v1.1/train-v1.1.json is in the data folder. Never SQuAD dev: GLUE
                                 QNLI dev (SentGLUE-QNLI) is made from it.
  st5_qatar_living_good_answers  Qatar Living question -> comment labelled Good.
  st5_qatar_living_perfect_match Qatar Living question -> related question labelled PerfectMatch.
  st5_trecqa_positives           TREC-QA question -> answer sentence (label 1).
  st5_wikiqa_positives           WikiQA question -> answer sentence (label 1).
  st5_stage1_public_qa           mixture of the four above (not ReQA), rates proportional to size.
  st5_user_qa_pairs              users' files (gin `st5_jax.data.user_qa_pairs` or $ST5_USER_QA_PAIRS).

Stage 2 (NLI triples: premise, entailment, contradiction as hard negative):
  st5_snli_devtest_triples       nli/snli_devtest_triples_derived.csv; train = rows with
                                 split=dev (3,172), validation = rows with split=test (3,167),
                                 all = both (6,339).
  st5_simcse_nli_triples         SimCSE's nli_for_simcse.csv at nli/nli_for_simcse.csv (the paper's 275K).
  st5_user_nli_triples           users' files (gin `st5_jax.data.user_nli_triples` or $ST5_USER_NLI_TRIPLES).

The objectives' own tasks are registered by their modules (st5_jax/objectives/: ConSERT's
consert_*, SEED-Encoder's st5_seed_*), imported by the gin layer and the top-level `tasks`.

From the public TFDS catalogue (st5_jax.data.tfds_tasks; TPU VMs read gs://tfds-data):
  st5_tfds_snli_triples, st5_tfds_multi_nli_triples, st5_tfds_nli_triples (their mixture),
  st5_tfds_reqa_squad (SQuAD v1.1 train).

Public tasks are decontaminated: an example sharing a text with any evaluation set is
dropped and counted (st5_jax.data.overlap; `st5 data overlap` reports overlaps).

Public tasks read <data_dir>/prepared/<task>/<split>.jsonl when `st5 data prepare`
wrote it, otherwise they build the same examples in memory from the raw files under
the data folder ($ST5_DATA_DIR or gin `st5_jax.data.options.data_dir`). Importing this
module (or the top-level `tasks` package, which re-exports it) registers them.
"""

from st5_jax.data import builders as _b
from st5_jax.data import registry as _r
from st5_jax.data import tfds_tasks as _tfds
from st5_jax.data.registry import register_mixture, register_user_task  # noqa: F401 (public API)
from st5_jax.data.vocabulary import get_vocabulary  # noqa: F401 (public API)

REQA_SQUAD = "st5_reqa_squad_sentences"
QATAR_LIVING_GOOD = "st5_qatar_living_good_answers"
QATAR_LIVING_PERFECT_MATCH = "st5_qatar_living_perfect_match"
TRECQA = "st5_trecqa_positives"
WIKIQA = "st5_wikiqa_positives"
# The default stage-1 mixture: every public QA task available here (ReQA needs SQuAD train).
STAGE1_PUBLIC_TASKS = (QATAR_LIVING_GOOD, QATAR_LIVING_PERFECT_MATCH, TRECQA, WIKIQA)
STAGE1_PUBLIC_QA_MIXTURE = "st5_stage1_public_qa"
USER_QA_PAIRS = "st5_user_qa_pairs"

STAGE2_SNLI_TRIPLES = "st5_snli_devtest_triples"
SIMCSE_NLI_TRIPLES = "st5_simcse_nli_triples"
USER_NLI_TRIPLES = "st5_user_nli_triples"

_r.register_public_task(REQA_SQUAD, {"train": _b.build_reqa_squad})
_r.register_public_task(QATAR_LIVING_GOOD, {"train": _b.build_qatar_living_good})
_r.register_public_task(QATAR_LIVING_PERFECT_MATCH, {"train": _b.build_qatar_living_perfect_match})
_r.register_public_task(TRECQA, {"train": _b.build_trecqa})
_r.register_public_task(WIKIQA, {"train": _b.build_wikiqa})
_r.register_mixture(STAGE1_PUBLIC_QA_MIXTURE, list(STAGE1_PUBLIC_TASKS))

_r.register_public_task(STAGE2_SNLI_TRIPLES, {
    "train": lambda data_dir, **kw: _b.build_shipped_triples(data_dir, "dev", **kw),
    "validation": lambda data_dir, **kw: _b.build_shipped_triples(data_dir, "test", **kw),
    # Both: the most NLI data available here (the CPU demo run trains on it; it evaluates on STS-B).
    "all": lambda data_dir, **kw: _b.build_shipped_triples(data_dir, None, **kw),
}, negatives=True)
_r.register_public_task(SIMCSE_NLI_TRIPLES, {"train": _b.build_simcse_nli}, negatives=True)

_r.register_configured_user_task(USER_QA_PAIRS, configurable=_r.user_qa_pairs, env="ST5_USER_QA_PAIRS",
                                 columns_env="ST5_USER_QA_COLUMNS", negatives=False)
_r.register_configured_user_task(USER_NLI_TRIPLES, configurable=_r.user_nli_triples, env="ST5_USER_NLI_TRIPLES",
                                 columns_env="ST5_USER_NLI_COLUMNS", negatives=True)

_tfds.register()

TFDS_SNLI_TRIPLES = _tfds.SNLI_TRIPLES
TFDS_MULTI_NLI_TRIPLES = _tfds.MULTI_NLI_TRIPLES
TFDS_NLI_TRIPLES_MIXTURE = _tfds.NLI_TRIPLES_MIXTURE
TFDS_REQA_SQUAD = _tfds.REQA_SQUAD

ALL_TASKS = (REQA_SQUAD,) + STAGE1_PUBLIC_TASKS + (USER_QA_PAIRS, STAGE2_SNLI_TRIPLES, SIMCSE_NLI_TRIPLES,
                                                   USER_NLI_TRIPLES, TFDS_SNLI_TRIPLES, TFDS_MULTI_NLI_TRIPLES,
                                                   TFDS_REQA_SQUAD)
MIXTURES = (STAGE1_PUBLIC_QA_MIXTURE, TFDS_NLI_TRIPLES_MIXTURE)

__all__ = [
    "REQA_SQUAD", "QATAR_LIVING_GOOD", "QATAR_LIVING_PERFECT_MATCH", "TRECQA", "WIKIQA", "STAGE1_PUBLIC_TASKS",
    "STAGE1_PUBLIC_QA_MIXTURE", "USER_QA_PAIRS", "STAGE2_SNLI_TRIPLES", "SIMCSE_NLI_TRIPLES", "USER_NLI_TRIPLES",
    "TFDS_SNLI_TRIPLES", "TFDS_MULTI_NLI_TRIPLES", "TFDS_NLI_TRIPLES_MIXTURE", "TFDS_REQA_SQUAD", "ALL_TASKS",
    "MIXTURES", "register_mixture", "register_user_task",
    "get_vocabulary",
]
