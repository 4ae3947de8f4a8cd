"""What the fused kernels' tests share (test_fpa_fused.py, test_selective_fused.py, test_dcp_fused.py): running an op
forward and backward, the 2x rule against its definition, document ids, and the tests every op runs alike (here; the
Selective and DCP kernels' own shared tests are in _carry_table_tests.py).

A shared test is collected where a test module imports it, under that module's ids; the importing module defines
the fixture ``op``, the ``FusedOp`` it checks. Tolerance rule (``check_against_reference``): the kernel's
error against a float64 reference is at most 2x the error of the same-precision PyTorch definition (the naive op run
on the same low-precision inputs), plus a few fp32 ulps of the tensor's scale, for the output and every gradient.
"""
from __future__ import annotations

import dataclasses
import types
from typing import Callable

import pytest
import torch

from fpa_lightning.ops import kernel_inputs

HAS_CUDA = torch.cuda.is_available()
DEV = "cuda" if HAS_CUDA else "cpu"


@dataclasses.dataclass(frozen=True)
class FusedOp:
    """A fused kernel under test: ``fused(*inputs, scale=, segment_ids=)`` and its definition ``naive``, its fused.py
    (``module``: the test hooks _tiles and _head_groups that tests patch), its inputs
    (``make_inputs(B, T, H, D, *, seed)`` -> float64 inputs on the CPU and dO), the names of the output and of every
    input's gradient, which inputs stay fp32 in a low-precision run (float64 in a float64 one), and the custom ops
    that run it under torch.compile (forward, backward), where the shared tests check them."""

    fused: Callable
    naive: Callable
    module: types.ModuleType
    make_inputs: Callable
    names: tuple[str, ...]
    fp32_args: tuple[int, ...] = ()
    custom_ops: tuple = ()


def documents(B, T, *, seed=0, mean_length=9, device=DEV):
    """(B, T) int64 ids of packed documents: contiguous runs of random length (1 up to ~2x mean_length),
    non-decreasing along a row, so documents start and end inside tiles and cross tile boundaries."""
    gen = torch.Generator().manual_seed(seed)
    starts = torch.rand(B, T, generator=gen) < 1.0 / mean_length
    starts[:, 0] = False
    return starts.long().cumsum(1).to(device)


def max_err(a, b):
    return (a - b).abs().max().item()


def run(fn, inputs, do, dtype, device, *, fp32_args=(), **kw):
    """fn(*inputs, **kw) forward and backward (dO): the output and every input's gradient, as float64 CPU tensors.
    The inputs are cast to `dtype`, except those at `fp32_args`: fp32 (float64 in a float64 run), as the backends
    pass them."""
    kept = torch.float64 if dtype == torch.float64 else torch.float32
    args = [t.detach().to(device=device, dtype=kept if i in fp32_args else dtype).clone().requires_grad_()
            for i, t in enumerate(inputs)]
    out = fn(*args, **kw)
    out.backward(do.to(device=device, dtype=out.dtype))
    return [out.detach().double().cpu()] + [a.grad.double().cpu() for a in args]


def rounded(inputs, do, dtype, *, fp32_args=()):
    """The inputs as the low-precision methods see them (those at `fp32_args` in fp32, as in `run`), back in
    float64: their exact result is the reference that leaves input rounding out."""
    return [t.to(torch.float32 if i in fp32_args else dtype).double() for i, t in enumerate(inputs)], \
        do.to(dtype).double()


def check_against_reference(op, inputs, do, dtype, device, *, factor=2.0, exact_on_rounded=False, names=None,
                            kernel_kw=None, **kw):
    """Kernel error <= factor x the same-precision torch error (plus a few fp32 ulps), both against float64 on the
    original inputs, or with `exact_on_rounded` on the rounded ones, for the tensors in `names` (default: all).
    `kw` (segment_ids, scale, a variant's options) goes to both ops, `kernel_kw` to the kernel only. Returns the
    kernel's and the reference's results (`run`)."""
    ref_inputs = rounded(inputs, do, dtype, fp32_args=op.fp32_args) if exact_on_rounded else (inputs, do)
    ref = run(op.naive, *ref_inputs, torch.float64, device, fp32_args=op.fp32_args, **kw)
    same = run(op.naive, inputs, do, dtype, device, fp32_args=op.fp32_args, **kw)
    got = run(op.fused, inputs, do, dtype, device, fp32_args=op.fp32_args, **kw, **(kernel_kw or {}))
    for name, r, s, g in zip(op.names, ref, same, got):
        if names is not None and name not in names:
            continue
        assert torch.isfinite(g).all(), f"{name}: non-finite values"
        e_k, e_t = max_err(g, r), max_err(s, r)
        # floor: a few ulps of the tensor's scale in the working precision (fp32 accumulators)
        floor = 8 * torch.finfo(torch.float32).eps * (1.0 + r.abs().max().item())
        assert e_k <= factor * e_t + floor, f"{name}: kernel err {e_k:.3e} > {factor}x torch err {e_t:.3e}"
    return got, ref


def set_head_groups(monkeypatch, op, n):
    """The backward's head-group count: each program loops over H / n heads."""
    monkeypatch.setattr(op.module, "_head_groups", lambda B, H, nJ, device: n)


def poison_outputs(monkeypatch):
    """Every fused op's output and scratch buffers start as NaN (−1 for integers): ``kernel_inputs``'s test hook."""
    monkeypatch.setattr(kernel_inputs, "TEST_HOOK_POISON_OUTPUTS", True)


def check_written_and_deterministic(monkeypatch, op, inputs, do, dtype, device, **kw):
    """Every output and scratch buffer starts as NaN: an element a kernel forgets to write, or a read of a scratch
    entry never written, shows up as NaN; a second run gives the same bits."""
    poison_outputs(monkeypatch)
    a = run(op.fused, inputs, do, dtype, device, fp32_args=op.fp32_args, **kw)
    b = run(op.fused, inputs, do, dtype, device, fp32_args=op.fp32_args, **kw)
    for name, x, y in zip(op.names, a, b):
        assert torch.isfinite(x).all(), name
        assert torch.equal(x, y), name


def check_common_value_errors(op):
    """The ValueErrors every fused op raises on bad q, k, v, scale and segment_ids (a (1, 8, 2, 16) problem)."""
    q, k, v, *rest = (t.float().to(DEV) for t in op.make_inputs(1, 8, 2, 16)[0])
    with pytest.raises(ValueError, match="head dim"):
        op.fused(q[..., :12], k[..., :12], v[..., :12], *rest)
    with pytest.raises(ValueError, match="dtype"):
        op.fused(q.double(), k.double(), v.double(), *rest)
    with pytest.raises(ValueError, match="share one dtype"):
        op.fused(q, k.half(), v, *rest)
    with pytest.raises(ValueError, match="one shape"):
        op.fused(q, k[:, :4], v, *rest)
    with pytest.raises(ValueError, match=r"\(B, T, H, D\)"):
        op.fused(q[0], k[0], v[0], *rest)
    with pytest.raises(ValueError, match="scale"):
        op.fused(q, k, v, *rest, scale=float("nan"))
    with pytest.raises(ValueError, match="segment_ids"):
        op.fused(q, k, v, *rest, segment_ids=torch.zeros(1, 7, dtype=torch.long, device=DEV))
    with pytest.raises(ValueError, match="integer"):
        op.fused(q, k, v, *rest, segment_ids=torch.zeros(1, 8, device=DEV))


# ------------------------------------------------------------------------------------------------
# Tests every fused op runs (CPU through the interpreter, and the GPU alike)
# ------------------------------------------------------------------------------------------------
def test_non_cuda_tensors_rejected_outside_interpreter(op, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    inputs, _ = op.make_inputs(1, 8, 2, 16)
    with pytest.raises(ValueError, match="CUDA"):
        op.fused(*(t.float() for t in inputs))
