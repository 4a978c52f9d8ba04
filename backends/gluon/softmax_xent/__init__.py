"""softmax_xent in Gluon: a persistent kernel fed by a TMA ring, deterministic reductions."""
