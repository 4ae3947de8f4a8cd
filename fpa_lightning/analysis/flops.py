"""FLOPs per training token of a ``Decoder``, per backend, and the model FLOP utilisation (MFU) they give.

Pure functions of a ``ModelConfig`` and the sequence length T: an analytic count of the work the model *needs*
(model FLOPs, PaLM's MFU), never of what a kernel happens to do (a recomputed forward in a backward, padded tiles,
checkpointing's second forward are not counted). So MFU is the same number for the same model whatever the
implementation, and comparable across backends.

Conventions (every term below is per token, for all layers; C = d_model, H = n_head, D = head_dim, F = d_mlp,
V = vocab_size, L = n_layer, L_b = the layers that carry the backend's bias, r = dcp_dim):

- A matmul (m × k)·(k × n) is 2·m·k·n FLOPs (a multiply and an add per multiply-accumulate).
- Training = forward + backward, and a matmul's backward is two matmuls of its size (the input's and the weight's
  gradients): every matmul term counts 3 × its forward (the "6·N" rule: 2·N forward + 4·N backward).
- Causal attention counts the pairs it needs, key s ≤ query t: T(T+1)/2 pairs per head, the half of the T² square
  plus its diagonal, so (T+1)/2 keys per query on average (``pairs_per_query``).
- Elementwise work is counted only where it is a backend's own, per (query, key) pair: one FLOP per elementwise op
  per pair (a min, an add, a multiply, an exp, a select: each 1), forward and backward counted separately from what
  the op computes (``PAIR_OPS``; the backward is *not* 3 × anything here). Elementwise work per token (norms, RoPE,
  SwiGLU's activation, the gates' nonlinearities and running sums, the loss over V) is O(C + F + V) per token, about
  0.1 % of the total at the 110M preset, and not counted; neither is the softmax's own elementwise work per pair,
  the same for every backend (PaLM's MFU counts matmuls only).
- Nothing is counted twice and every counted FLOP is one a correct implementation must do, so MFU ≤ 100 %.

``PEAK_BF16_TFLOPS`` holds the dense bf16 tensor-core peaks of the usual GPUs (vendor datasheets, below);
``peak_tflops(name)`` matches ``torch.cuda.get_device_name()`` against it and returns None for any other device:
then no MFU is reported (the caller says so once and asks for an explicit peak), never a guessed one.
"""
from __future__ import annotations

import re

from fpa_lightning.config import ModelConfig

# Elementwise FLOPs per (query, key) pair of each backend's own bias: (forward, backward). "per head": the backend
# has one bias per head, so the counts are multiplied by H; "shared": one bias per layer, shared by every head (its
# addition to each head's logits is counted in ``_shared_pair_ops`` as H more ops per pair).
PAIR_OPS: dict[str, tuple[str, int, int]] = {
    # FPA (ops/fpa/naive.py, docs/kernel.md): forward per pair, the range minimum M = min(suf_J(s), mid(J,I),
    # pre_I(t)) (2 mins), M − ψ_s (1), min(0, ·) (1), × β (1), + the logit (1) = 6. Backward per pair (the fused
    # kernel's dq, dk/dv and field kernels): G = β·dS·[dead] (2: a multiply, a select), dψ_s −= G (1),
    # dβ += dS·min(0, M − ψ_s) (2), the soft-minimum normaliser Z' = f·X_s + zpre_t·e3 with one exp per pair
    # (|pre − m2|, exp, the select of f and e3, two multiplies and an add: 7), r = G / Z' (1), and r's three
    # accumulations into a_s, c_t and κ[J, I], each a multiply by its exponential factor and an add (6) = 19.
    # The dip-sum ablation does the same count of ops per pair (a dip, min(0, ·), a running sum, × β, + logit).
    "fpa": ("per head", 6, 19),
    # FoX (ops/fox/naive.py): b[t, s] = c_t − c_s of the running log-gate sums (1), + the logit (1); backward, dS into
    # dc_t and into dc_s (2 accumulations).
    "fox": ("per head", 2, 2),
    # Selective Attention (ops/selective/naive.py), after the selecting head's q0·k0 (a matmul term, below):
    # × scale (1), ReLU (1), the running sum over queries F = Σ_{t'<t} S[t', s] (1); backward, the reverse running
    # sum (1), ReLU's mask (1), × scale (1).
    "selective": ("shared", 3, 3),
    # DCP (ops/dcp/naive.py), after z = qi·ki (a matmul term, below): / √r (1), + offset (1), (z + 1) / 2 (2),
    # clamp to [0, 1] (2), the log floor (1), log (1), the running sum over queries (1) = 9; backward, each op's
    # local derivative times the incoming gradient, one op each (9).
    "dcp": ("shared", 9, 9),
    # softmax (SDPA) and NoPE: no bias of their own. ALiBi: counted as the positional term (_ALIBI_OPS).
    "sdpa": ("per head", 0, 0),
    "nope": ("per head", 0, 0),
    "alibi": ("per head", 0, 0),
}
# ALiBi, as a backend or as the positional encoding of any other: slope × (t − s) as c_t − c_s (1), + the logit (1);
# fixed slopes, no gradient.
_ALIBI_OPS = (2, 0)


def pairs_per_query(seq_len: int) -> float:
    """Causal (query, key) pairs per query, averaged over a row of T tokens: Σ_{t<T} (t + 1) / T = (T + 1) / 2."""
    if seq_len < 1:
        raise ValueError(f"seq_len must be positive, got {seq_len}")
    return (seq_len + 1) / 2


def _gate_outputs(cfg: ModelConfig) -> int:
    """Output width of a bias layer's gate map (an nn.Linear of width C, attention/backends.py)."""
    a, H = cfg.attention, cfg.n_head
    if a.backend == "fpa":  # δ, then g (unless the stack form), then h (general form, key or query level)
        return H * (1 if a.fpa_form == "stack" else (2 if a.fpa_level == "none" else 3))
    return {"fox": H, "dcp": 2 * a.dcp_dim}.get(a.backend, 0)  # FoX's forget gate; DCP's interaction qi, ki


def _pair_matmul_width(cfg: ModelConfig) -> int:
    """The inner dimension of a bias layer's extra pairwise product, per pair: Selective's q0·k0 of one head (D),
    DCP's qi·ki (r); 0 for the others."""
    return {"selective": cfg.head_dim, "dcp": cfg.attention.dcp_dim}.get(cfg.attention.backend, 0)


def training_flop_terms(cfg: ModelConfig, seq_len: int) -> dict[str, float]:
    """FLOPs per training token (forward + backward) by term, for rows of ``seq_len`` tokens; see the module
    docstring for the conventions. The terms, with P = (T + 1) / 2:

    - ``blocks``: 3 · L · (2·C·3C [qkv] + 2·C·C [out] + 2·C·2F [SwiGLU gate and up] + 2·F·C [down])
    - ``lm_head``: 3 · 2·C·V (the tied embedding's output projection; the input lookup is free)
    - ``attention``: 3 · L · H · P · (2·D [q·k] + 2·D [p·v]) = 3 · L · 4·C·P
    - ``gate_maps``: 3 · L_b · 2·C·G, G the gate map's outputs (FPA 3H, or 2H at level none, H in the stack form;
      FoX H; DCP 2r; 0 otherwise)
    - ``pair_products``: 3 · L_b · P · 2·w, Selective's extra q0·k0 of one head (w = D), DCP's qi·ki (w = r)
    - ``bias_ops``: L_b · P · (forward + backward ops of ``PAIR_OPS``) · H for a per-head bias; for a layer-shared
      one (Selective, DCP) L_b · P · (ops + 2·H), the 2·H its addition to each head's logits and the sum of the
      heads' gradients; plus L · P · H · 2 with ALiBi (``_ALIBI_OPS``)
    """
    C, H, D, F, V, L = cfg.d_model, cfg.n_head, cfg.head_dim, cfg.d_mlp, cfg.vocab_size, cfg.n_layer
    P = pairs_per_query(seq_len)
    a = cfg.attention
    L_b = sum(a.layer_has_bias(i) for i in range(L)) if a.backend not in ("sdpa", "nope") else 0
    kind, forward_ops, backward_ops = PAIR_OPS[a.backend]
    if kind == "per head":
        bias_ops = L_b * P * H * (forward_ops + backward_ops)
    else:  # one bias per layer, added to each of the H heads' logits (H ops) and its gradient summed over them (H)
        bias_ops = L_b * P * (forward_ops + backward_ops + 2 * H)
    if a.positional == "alibi":
        bias_ops += L * P * H * sum(_ALIBI_OPS)
    return {
        "blocks": 3 * L * (2 * C * 3 * C + 2 * C * C + 2 * C * 2 * F + 2 * F * C),
        "lm_head": 3 * 2 * C * V,
        "attention": 3 * L * H * P * (2 * D + 2 * D),
        "gate_maps": 3 * L_b * 2 * C * _gate_outputs(cfg),
        "pair_products": 3 * L_b * P * 2 * _pair_matmul_width(cfg),
        "bias_ops": bias_ops,
    }


def training_flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    """FLOPs per training token (forward + backward) of rows of ``seq_len`` tokens: the sum of
    ``training_flop_terms``."""
    return float(sum(training_flop_terms(cfg, seq_len).values()))


# Peak dense (not 2:4-sparse) bf16 tensor-core FLOP/s, in TFLOP/s, with fp32 accumulation (what PyTorch's bf16
# matmuls use). Sources, the vendor's own documents; where a datasheet gives only the sparse figure ("with
# sparsity"), dense is half of it:
# - H100 SXM5: NVIDIA H100 Tensor Core GPU datasheet, BF16 Tensor Core 1,979 TFLOPS with sparsity -> 989.5.
# - H100 PCIe: same datasheet, 1,513 with sparsity -> 756.5.
# - H200 (SXM): NVIDIA H200 Tensor Core GPU datasheet, BF16 Tensor Core 1,979 TFLOPS with sparsity -> 989.5.
# - A100 (SXM4 and PCIe, 40 and 80 GB): NVIDIA A100 Tensor Core GPU datasheet, BF16 Tensor Core 312 (624 sparse).
# - L40S: NVIDIA L40S datasheet, BF16 Tensor Core 362.05 (733 with sparsity).
# - GeForce RTX 4090: NVIDIA Ada GPU Architecture whitepaper, appendix table, peak BF16 Tensor TFLOPS with FP32
#   accumulate 165.2 (330.3 sparse).
# - GeForce RTX 3090: NVIDIA Ampere GA102 GPU Architecture whitepaper, peak BF16 Tensor TFLOPS with FP32 accumulate
#   71 (142 sparse).
# Variants with other clocks or SM counts (H100/H200 NVL, RTX 4090 D, RTX 3090 Ti, L40 without S) match nothing:
# their MFU needs an explicit peak.
PEAK_BF16_TFLOPS: dict[str, float] = {
    "H100 SXM": 989.5,
    "H100 PCIe": 756.5,
    "H200": 989.5,
    "A100": 312.0,
    "L40S": 362.05,
    "RTX 4090": 165.2,
    "RTX 3090": 71.0,
}
# How torch.cuda.get_device_name() spells each (lower case), e.g. "NVIDIA H100 80GB HBM3" (SXM), "NVIDIA H100 PCIe",
# "NVIDIA H200", "NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe", "NVIDIA L40S", "NVIDIA GeForce RTX 4090".
_DEVICE_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"\bh100\b(?!.*\bnvl\b)(?=.*\bpcie\b)", "H100 PCIe"),
    (r"\bh100\b(?!.*\b(pcie|nvl)\b)", "H100 SXM"),
    (r"\bh200\b(?!.*\bnvl\b)", "H200"),
    (r"\ba100\b", "A100"),
    (r"\bl40s\b", "L40S"),
    (r"\brtx 4090\b(?! ?d\b)", "RTX 4090"),
    (r"\brtx 3090\b(?! ?ti\b)", "RTX 3090"),
)


def device_entry(device_name: str) -> str | None:
    """The ``PEAK_BF16_TFLOPS`` key of a device name (``torch.cuda.get_device_name()``), or None if none matches."""
    name = device_name.lower().replace("-", " ").replace("_", " ")
    for pattern, entry in _DEVICE_PATTERNS:
        if re.search(pattern, name):
            return entry
    return None


def peak_tflops(device_name: str) -> float | None:
    """Peak dense bf16 TFLOP/s of a device name, or None for a device the table does not hold (no MFU then)."""
    entry = device_entry(device_name)
    return None if entry is None else PEAK_BF16_TFLOPS[entry]


def mfu(tokens_per_s: float, flops_per_token: float, peak_tflops_per_device: float, n_devices: int = 1) -> float:
    """Model FLOP utilisation: achieved model FLOP/s over the peak of the ``n_devices`` devices that processed the
    tokens (tokens_per_s: all devices' tokens)."""
    if peak_tflops_per_device <= 0 or n_devices < 1:
        raise ValueError(f"need a positive peak and device count, got {peak_tflops_per_device}, {n_devices}")
    return tokens_per_s * flops_per_token / (peak_tflops_per_device * 1e12 * n_devices)
