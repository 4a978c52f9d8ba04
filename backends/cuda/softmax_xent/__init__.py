"""softmax_xent on raw CUDA (softmax_xent.cu): online-softmax rows, deterministic reductions."""
