"""Attention ops, one folder per op for training and decoding alike (as fla's ``ops/<op>/``): each holds the op's
readable definition (naive.py, any float dtype, float64 for references) beside its fast forms (docs/method.md,
"Implementations").

    fpa/        FPA: naive, chunked, fused (training); piece/ (queries over the KV cache with eviction); step/
                (FPA's part of the single-token decoding step)
    fox/        FoX: naive, flex (FlexAttention); alibi (FoX's bias with a fixed gate)
    selective/  Selective Attention: naive, sdpa, fused
    dcp/        Dynamic Context Pruning: naive, sdpa, fused
    decode/     attention over a KV cache (naive, fused) and the single-token decoding step (step/)

What the ops share: common.py (dense attention, constants), blockwise.py (block-wise attention), kernel_inputs.py
(the fused ops' input checks, head dims and buffers).
"""
from fpa_lightning.ops.common import dense_attention
from fpa_lightning.ops.fpa import chunked_fpa_attention, fpa_attention, fpa_bias, naive_fpa_attention

__all__ = ["chunked_fpa_attention", "dense_attention", "fpa_attention", "fpa_bias", "naive_fpa_attention"]
