"""Golden backends: hand-written backward formulas in torch (no autograd), the seeds' `golden`."""
