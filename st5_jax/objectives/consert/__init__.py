"""ConSERT (Yan et al., 2021) on the Sentence-T5 stack.

  augment.py    the views (token shuffle, token / feature / span cutoff, dropout, FGV) as
                pure functions of (embeddings, mask, key) on the token-embedding output
  model.py      the trainable module of the joint objective: the tower plus its NLI classifier
  objective.py  the objectives ConsertUnsup and ConsertJoint (gin `TrainConfig.objective = @ConsertUnsup()`)
  tasks.py      seqio tasks: the unlabelled STS12-16 / STS-B / SICK-R sentences (the paper's
                transductive protocol) and labelled NLI pairs

The NT-Xent loss is `st5_jax.losses.nt_xent_loss`; the NLI head is the objective's
`nli_classifier`, dropped at inference and export.
"""
