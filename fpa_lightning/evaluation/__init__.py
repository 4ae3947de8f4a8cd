"""Evaluation of trained checkpoints (``eval.py``): long-document loss by position, pass-key retrieval,
test loss with non-inferiority, and simulated KV-cache pruning, each with interval estimates and paired
comparisons of two checkpoints."""
