"""Analysis maths shared by the Lightning callbacks and the evaluation tasks: which keys each head keeps alive
(survival), loss by position in long documents (positions) and KV-cache pruning (pruning)."""
# flops: FLOPs per training token of a Decoder per backend, the peak dense bf16 FLOP/s of common GPUs and the MFU
# they give (the throughput callback, benchmarks/train_throughput.py --mfu).
