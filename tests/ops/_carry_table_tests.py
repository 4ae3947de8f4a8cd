"""The tests that the Selective and DCP kernels share: the same tiles, carry tables, head groups and document walks,
checked on tiny shapes (CPU through the interpreter, and the GPU alike). A test module runs them on its kernel with
``from _carry_table_tests import *`` and a fixture ``op``, the ``FusedOp`` (_ops_helpers.py) of its kernel; they are
collected there, under that module's ids.
"""
from __future__ import annotations

import pytest
import torch

from _ops_helpers import DEV, check_against_reference, check_written_and_deterministic, documents, max_err, run
from _ops_helpers import poison_outputs, set_head_groups


@pytest.mark.parametrize("T", [37, 70])
def test_documents_match_reference(op, T):
    # several documents per row (mean length 9), starting mid-tile and at tile starts alike
    B, H = 2, 2 if T == 37 else 3
    inputs, do = op.make_inputs(B, T, H, 16, seed=100 + T)
    seg = documents(B, T, seed=T)
    seg[1, 32:] += 1  # a document that starts exactly at a tile boundary (tiles of 16)
    assert (seg[:, 1:] != seg[:, :-1]).sum(1).min() >= 3
    check_against_reference(op, inputs, do, torch.float32, DEV, segment_ids=seg)


def test_documents_with_any_ids_match_reference(op, monkeypatch):
    # ids that repeat after other documents (not contiguous runs): the definition still applies, the bias of a
    # same-document pair sums every query between them whatever their documents; the tile walks stay exact for any
    # ids. Scratch buffers start as NaN: the query-major walk reaches pairs beyond the key-major walk's, whose carry
    # entries are unwritten
    poison_outputs(monkeypatch)
    B, T, H = 2, 61, 2
    inputs, do = op.make_inputs(B, T, H, 16, seed=7)
    # by tiles of 16. Row 0: ids {5, 6} | 0 | {5, 3} | 1: document 5 resumes two tiles later, and key tile 1
    # shares no document with any later query tile, although those tiles still reach it in the dq walk. Row 1:
    # 0 | 1 | 1 | 0: query tiles 1 and 2 share no document with key tile 0, yet their bias gradient there is not 0
    # (tile 3's queries see tile 0's keys)
    rows = [[(5, 10), (6, 6), (0, 16), (5, 7), (3, 9), (1, 13)], [(0, 16), (1, 32), (0, 13)]]
    seg = torch.stack([torch.cat([torch.full((n,), i) for i, n in row]) for row in rows]).to(DEV)
    check_against_reference(op, inputs, do, torch.float32, DEV, segment_ids=seg)


@pytest.mark.parametrize("n_groups", [1, 2, 4])
def test_head_groups_match_reference(op, monkeypatch, n_groups):
    # the backward kernels loop over H / n_groups heads per program; the layer-shared gradients (head 0's slot, or
    # qi, ki and the offset) are summed over the groups
    set_head_groups(monkeypatch, op, n_groups)
    inputs, do = op.make_inputs(1, 45, 4, 16, seed=11)
    check_against_reference(op, inputs, do, torch.float32, DEV, segment_ids=documents(1, 45, seed=3, mean_length=12))


@pytest.mark.parametrize("fwd,bwd", [((32, 16), (16, 32, 32)), ((16, 32), (32, 16, 64))],
                         ids=["fwd32x16-bwd16x32x32", "fwd16x32-bwd32x16x64"])
@pytest.mark.parametrize("docs", [False, True], ids=["dense", "docs"])
def test_mixed_tile_sizes_match_reference(op, monkeypatch, fwd, bwd, docs):
    # query tiles and key tiles of different sizes (as on the GPU: the key-major backward walks 32-query tiles under
    # 64-key tiles, the query-major one reads its tables at every other row); scratch buffers start as NaN
    monkeypatch.setattr(op.module, "_tiles", lambda: {"fwd": fwd, "bwd": bwd})
    poison_outputs(monkeypatch)
    B, T, H = 2, 70, 2
    inputs, do = op.make_inputs(B, T, H, 16, seed=31)
    seg = documents(B, T, seed=31, mean_length=11) if docs else None
    check_against_reference(op, inputs, do, torch.float32, DEV, segment_ids=seg)


def test_bad_tile_sizes_raise(op, monkeypatch):
    args = [t.float().to(DEV) for t in op.make_inputs(1, 8, 2, 16)[0]]
    monkeypatch.setattr(op.module, "_tiles", lambda: {"fwd": (16, 16), "bwd": (32, 16, 16)})
    with pytest.raises(ValueError, match="multiple of BT"):
        op.fused(*args)
    monkeypatch.setattr(op.module, "_tiles", lambda: {"fwd": (24, 16), "bwd": (16, 16, 16)})
    with pytest.raises(ValueError, match="powers of two"):
        op.fused(*args)


def test_scan_prefix_matches_dot_prefix(op, monkeypatch):
    # the in-tile prefix/suffix over queries as a scan instead of a triangular matmul (an A/B option): the same
    # result up to rounding. Selective's scan path meets the 2x rule as well (test_selective_fused.py); DCP's is only
    # compared with the dot path: in fp32 its offset gradient (a sum over all pairs with ~140x cancellation here)
    # misses the rule (12x PyTorch's error; the dot path: 5x, inside the rule's ulp floor)
    inputs, do = op.make_inputs(2, 37, 2, 16, seed=12)
    seg = documents(2, 37, seed=12)
    want = run(op.fused, inputs, do, torch.float32, DEV, segment_ids=seg)
    monkeypatch.setattr(op.module, "_prefix_by_dot", lambda *dtype: False)
    got = run(op.fused, inputs, do, torch.float32, DEV, segment_ids=seg)
    for name, w, g in zip(op.names, want, got):
        assert max_err(w, g) <= 1e-5 * (1 + w.abs().max().item()), name


@pytest.mark.parametrize("exact_on_rounded", [False, True])
def test_fp16_matches_reference(op, exact_on_rounded):
    # Not bf16: Triton 3.9's interpreter computes a bf16 tl.dot wrongly, so bf16 is checked on the GPU only
    inputs, do = op.make_inputs(1, 37, 2, 16, seed=9)
    check_against_reference(op, inputs, do, torch.float16, DEV, exact_on_rounded=exact_on_rounded,
                            segment_ids=documents(1, 37, seed=9))


def test_custom_scale(op):
    inputs, do = op.make_inputs(2, 29, 2, 16, seed=13)
    check_against_reference(op, inputs, do, torch.float32, DEV, scale=0.7)


def test_every_element_written_and_rerun_deterministic(op, monkeypatch):
    # two head groups, so that the groups' partial sums are written and summed as well
    set_head_groups(monkeypatch, op, 2)
    inputs, do = op.make_inputs(2, 35, 2, 16, seed=15)
    seg = documents(2, 35, seed=15, mean_length=7)
    check_written_and_deterministic(monkeypatch, op, inputs, do, torch.float32, DEV, segment_ids=seg)


@pytest.mark.parametrize("docs", [False, True], ids=["dense", "docs"])
def test_compiled_call_is_one_graph_with_the_eager_numbers(op, docs):
    """The op under torch.compile (fullgraph: a graph break fails; AOTAutograd traces forward and backward through
    the custom ops' fake implementations) gives the eager call's output and every gradient bit for bit: the same
    kernels run."""
    torch._dynamo.reset()
    inputs, do = op.make_inputs(1, 29, 2, 16, seed=17)  # two tiles of 16, the second partial
    seg = documents(1, 29, seed=17) if docs else None
    eager = run(op.fused, inputs, do, torch.float32, DEV, fp32_args=op.fp32_args, segment_ids=seg)
    compiled = run(torch.compile(op.fused, backend="aot_eager", fullgraph=True), inputs, do, torch.float32, DEV,
                   fp32_args=op.fp32_args, segment_ids=seg)
    for name, want, got in zip(op.names, eager, compiled):
        assert torch.equal(got, want), name


@pytest.mark.parametrize("docs", [False, True], ids=["dense", "docs"])
def test_custom_ops_fake_and_autograd_registrations(op, docs):
    """torch.library.opcheck of the forward op (inputs, scale, segment_ids) and of the backward op (dO, the inputs,
    the forward op's outputs, scale): schemas, fake implementations against the real outputs' shapes, strides and
    dtypes, and the autograd registration (AOTAutograd's tracing is the compiled-call test's)."""
    checks = ("test_schema", "test_autograd_registration", "test_faketensor")
    forward_op, backward_op = op.custom_ops
    inputs, do = op.make_inputs(1, 21, 2, 16, seed=12)
    args = [t.to(DEV, torch.float32).requires_grad_() for t in inputs]
    seg = documents(1, 21, seed=12) if docs else None
    torch.library.opcheck(forward_op, (*args, 0.25, seg), test_utils=checks)
    with torch.no_grad():
        outputs = forward_op(*args, 0.25, seg)
    # the backward has no backward of its own: its inputs want no gradient
    torch.library.opcheck(backward_op, (do.to(DEV, torch.float32), *(a.detach() for a in args), *outputs, 0.25),
                          test_utils=checks)


__all__ = [name for name in dir() if name.startswith("test_")]
