"""ops/common.running_sum, the gate fields' running sum, and its custom op (what torch.compile sees): values and
gradients against a float64 per-document reference, and the compiled graphs holding the op instead of a scan."""
from __future__ import annotations

import pytest
import torch
from functorch.compile import make_boxed_func
from torch._dynamo.backends.common import aot_autograd
from torch._functorch import config as functorch_config

from fpa_lightning.attention.backends import FpaBackend
from fpa_lightning.config import AttentionConfig
from fpa_lightning.ops.common import running_sum, running_sum_op

B, T, H = 3, 37, 5
DOCUMENT_IDS = torch.tensor([[0] * 10 + [1] * 20 + [2] * 7, [4] * 37, [7] * 36 + [8]])  # (B, T)


def reference(values: torch.Tensor, segment_ids: torch.Tensor | None) -> torch.Tensor:
    """The running sum of each document on its own, one row and document at a time."""
    ids = torch.zeros(values.shape[:2], dtype=torch.long) if segment_ids is None else segment_ids
    rows = []
    for b in range(values.shape[0]):
        starts = [0] + [t for t in range(1, values.shape[1]) if ids[b, t] != ids[b, t - 1]] + [values.shape[1]]
        rows.append(torch.cat([values[b, lo:hi].cumsum(0) for lo, hi in zip(starts, starts[1:])]))
    return torch.stack(rows)


def errors(fn, values, segment_ids, grad_out):
    """fn's output and gradient, each as its largest error against the float64 reference."""
    exact = values.detach().double().requires_grad_()
    want = reference(exact, segment_ids)
    (want_grad,) = torch.autograd.grad(want, exact, grad_out.double())
    x = values.detach().requires_grad_()
    got = fn(x, segment_ids)
    (got_grad,) = torch.autograd.grad(got, x, grad_out)
    assert got.dtype == values.dtype and got.shape == values.shape
    return (got.double() - want).abs().max().item(), (got_grad.double() - want_grad).abs().max().item()


@pytest.mark.parametrize("documents", [False, True], ids=["dense", "documents"])
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_values_and_gradient_within_twice_float32_cumsum_error(documents, compiled):
    g = torch.Generator().manual_seed(0)
    values = torch.randn(B, T, H, generator=g) * 3 - 1  # (B, T, H) float32, a drifting walk as a gate's
    grad_out = torch.randn(B, T, H, generator=g)
    ids = DOCUMENT_IDS if documents else None
    fn = torch.compile(running_sum, backend="aot_eager", fullgraph=True) if compiled else running_sum
    out_err, grad_err = errors(fn, values, ids, grad_out)
    base_out, base_grad = errors(reference, values, ids, grad_out)  # plain float32 cumsum per document
    assert out_err <= 2 * base_out and grad_err <= 2 * base_grad
    assert base_out > 0 and base_grad > 0  # the bound is not 0 ≤ 0 by accident


@pytest.mark.parametrize("documents", [False, True], ids=["dense", "documents"])
def test_custom_op_is_exact_in_float64_and_passes_opcheck(documents):
    values = torch.randn(B, T, H, dtype=torch.float64, requires_grad=True)
    ids = DOCUMENT_IDS if documents else None
    torch.testing.assert_close(running_sum_op(values, ids), reference(values, ids), rtol=0, atol=1e-12)
    torch.library.opcheck(running_sum_op, (values, ids))
    assert running_sum_op(values, ids).stride() == (T * H, 1, T)  # (B, H, T) strides, as its fake says


def captured_graphs(fn, *args):
    """The forward and backward graphs AOTAutograd hands a compiler when fn(*args).sum() is compiled and
    differentiated."""
    graphs = []

    def keep(gm, _):
        graphs.append(gm)
        return make_boxed_func(gm)

    compiled = torch.compile(lambda *a: fn(*a).sum(), backend=aot_autograd(fw_compiler=keep, bw_compiler=keep),
                             fullgraph=True)
    compiled(*args).backward()
    return graphs


def called(graph) -> set[str]:
    return {str(node.target) for node in graph.graph.nodes if node.op == "call_function"}


@pytest.mark.parametrize("documents", [False, True], ids=["dense", "documents"])
def test_compiled_fpa_fields_call_the_op_not_a_scan(documents):
    """Inductor's split scan failed to compile the walk's cumsum on CUDA (BENCHMARKS.md, "Whole-model training on one
    H100"): under torch.compile the forward and backward graphs of FPA's fields must hold the opaque op, no scan."""
    backend = FpaBackend(AttentionConfig(backend="fpa"), d_model=8, n_head=2, head_dim=4)
    x = torch.randn(B, T, 8, requires_grad=True)
    ids = DOCUMENT_IDS if documents else None
    graphs = captured_graphs(lambda v: backend.fields(v, segment_ids=ids)[0], x)
    assert len(graphs) == 2  # forward, backward
    for graph in graphs:
        targets = called(graph)
        assert "fpa_lightning.running_sum.default" in targets
        assert not {t for t in targets if "cumsum" in t}, targets


@pytest.mark.gpu
def test_inductor_compiles_fpa_fields_of_the_long_context_model_on_cuda(monkeypatch):
    """The 110M model's φ at 1 × 16384 (12 heads) through `bias_ingredients`, as `model.compile` runs it (Inductor,
    bf16 autocast around it, the backward outside autocast as `compile_blocks` sets it): the shape at which Inductor's
    split scan failed to generate the walk's cumsum; values and gradients as eager."""
    monkeypatch.setattr(functorch_config, "backward_pass_autocast", "off")
    torch.manual_seed(0)
    backend = FpaBackend(AttentionConfig(backend="fpa"), d_model=768, n_head=12, head_dim=64).cuda()
    with torch.no_grad():  # a trained-like gate, not the all-zero start
        backend.gate.weight.normal_(std=0.02)
    x = torch.randn(1, 16384, 768, device="cuda")
    qk = torch.empty(1, 16384, 12, 64, device="cuda", dtype=torch.bfloat16)  # only their device and shape are read
    grad_out = torch.randn(1, 16384, 12, device="cuda")

    def phi_and_grad(fn):
        v = x.clone().requires_grad_()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            phi = fn(v)
        (grad,) = torch.autograd.grad(phi, v, grad_out)
        return phi, grad

    def phi(v):
        return backend.bias_ingredients(v, qk, qk)["phi"]

    eager = phi_and_grad(phi)
    compiled = phi_and_grad(torch.compile(phi, fullgraph=True))
    assert eager[0].dtype == torch.float32
    for got, want in zip(compiled, eager):
        torch.testing.assert_close(got, want)
