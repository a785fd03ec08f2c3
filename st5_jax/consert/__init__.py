"""ConSERT (Yan et al., 2021) on the Sentence-T5 stack.

  augment.py    the views (token shuffle, token / feature / span cutoff, dropout, FGV) as
                pure functions of (embeddings, mask, key) on the token-embedding output
  objective.py  the trainer objectives `consert_unsup` and `consert_joint` (TrainConfig.objective)
  tasks.py      seqio tasks: the unlabelled STS12-16 / STS-B / SICK-R sentences (the paper's
                transductive protocol) and labelled NLI pairs

The NT-Xent loss is `st5_jax.losses.nt_xent_loss`; the NLI head is the model's
`nli_classifier` (ST5Config.nli_classes), dropped at inference and export.
"""
