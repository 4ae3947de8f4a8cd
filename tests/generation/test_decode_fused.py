"""DecodeSession's attention over the cache: the fused op (ops/decode, "fused") against the reference einsums
("naive"). CPU: the fused op through Triton's interpreter on float32 decoders with head dim 16, decoded logits
(prefill, an extend piece, steps) within the same-precision bound of the float64 naive session: the fused session's
error is at most 2x the float32 naive session's plus 8 fp32 ulps. GPU (marked `gpu`): the same in bf16 with
CUDA-graph (and compiled) steps. And how "auto", "naive" and "fused" resolve, with clear errors."""
import copy

import pytest
import torch
from _gen_helpers import VOCAB, random_gates

from fpa_lightning import Decoder, ModelConfig
from fpa_lightning.generation import DecodeSession, PruneRule, cast_weights
from fpa_lightning.generation.session import default_piece_tokens, rows_per_pass

CASES = [  # (attention, rule): no bias, per-head bias, layer-shared bias, and eviction (masks from the rule)
    ({"backend": "sdpa"}, None),
    ({"backend": "fpa"}, None),
    ({"backend": "fox"}, None),
    ({"backend": "selective"}, None),
    ({"backend": "dcp"}, None),
    ({"backend": "fpa"}, PruneRule(threshold=-1.0)),
    ({"backend": "sdpa"}, PruneRule(window=3)),
]
T = 20
DEV = "cuda" if torch.cuda.is_available() else "cpu"


def decoder_d16(seed: int = 0, **attention) -> Decoder:
    """A float64 Decoder (2 layers, 2 heads of 16: a head dim the fused op takes) with random gate maps."""
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=VOCAB, n_layer=2, d_model=32, n_head=2, d_mlp=32, max_seq_len=32,
                      attention={"impl": "chunked", "block_size": 4, **attention})
    return random_gates(Decoder(cfg).double().eval(), std=2.0).to(DEV)


def decoded(decoder: Decoder, ids: torch.Tensor, impl: str, rule=None, **session) -> torch.Tensor:
    """Logits (B, steps, V) in float64: prefill of prompts of 12 and 5 tokens, a piece of 3 (extend), then one token
    per step up to T. The cache keeps at most 64 slots (check_every=8), so in the interpreter (chunks of 16 slots in
    blocks of 8) row 0's keys fill two chunks and three blocks."""
    s = DecodeSession(decoder, rule=rule, attention_impl=impl, check_every=8, **session)
    assert s.attention_impl_used == impl
    with torch.no_grad():
        out = [s.prefill([ids[0, :12], ids[1, :5]], max_new_tokens=T - 5)[:, None].double()]
        out.append(s.extend(ids[:, 12:15]).double())
        out += [s.step(ids[:, t]).double().clone()[:, None] for t in range(15, T)]
    assert s.cache.capacity <= 64  # eviction compacts it
    return torch.cat(out, dim=1)


def assert_within_bound(got, same, reference, what):
    e_got, e_same = (got - reference).abs().max().item(), (same - reference).abs().max().item()
    floor = 8 * torch.finfo(torch.float32).eps * (1 + reference.abs().max().item())
    assert torch.isfinite(got).all()
    assert e_got <= 2 * e_same + floor, f"{what}: error {e_got:.3e} > 2 x same-precision {e_same:.3e} + {floor:.1e}"


@pytest.mark.parametrize("attention, rule", CASES, ids=lambda c: str(c))
def test_fused_session_within_the_same_precision_bound(attention, rule):
    decoder = decoder_d16(**attention)
    ids = torch.randint(0, VOCAB, (2, T), generator=torch.Generator().manual_seed(0))
    reference = decoded(decoder, ids, "naive", rule)
    fp32 = copy.deepcopy(decoder).float()
    same, got = decoded(fp32, ids, "naive", rule), decoded(fp32, ids, "fused", rule)
    assert not torch.equal(got, same)  # the fused op did run
    assert_within_bound(got, same, reference, str(attention))


@pytest.mark.parametrize("threshold", [-1.0, -0.3, float("-inf")])
def test_fpa_piece_kernel_scores_a_document_as_the_einsums_do(threshold):
    """cached_token_losses (cache_prune's real eviction) through FPA's piece kernel: two rows in pieces of 7 tokens
    with eviction, losses within the same-precision bound of the float64 einsums and the same kept fraction of every
    query (every bias is made in float32 from the same fields, so the same keys are evicted)."""
    from fpa_lightning.generation.session import cached_token_losses
    decoder = decoder_d16(seed=1, backend="fpa")
    ids = torch.randint(0, VOCAB, (2, 30), generator=torch.Generator().manual_seed(1)).to(DEV)  # rows evict apart
    rule = None if threshold == float("-inf") else PruneRule(threshold=threshold)
    reference, _ = cached_token_losses(decoder, ids, rule, piece=7, attention_impl="naive")
    fp32 = copy.deepcopy(decoder).float()
    same, same_session = cached_token_losses(fp32, ids, rule, piece=7, attention_impl="naive")
    got, session = cached_token_losses(fp32, ids, rule, piece=7, attention_impl="fused")
    assert session.piece_attention_impl_used == "fpa_piece"
    assert_within_bound(got.double(), same.double(), reference, f"threshold {threshold}")
    kept, same_kept = session.stats()["kept_per_query"], same_session.stats()["kept_per_query"]
    assert kept["kept_fraction_per_layer"] == same_kept["kept_fraction_per_layer"]
    assert (kept["kept_fraction"] < 1.0) == (rule is not None)


def test_attention_impl_resolution(monkeypatch):
    fp32 = decoder_d16(backend="fpa").float()
    assert DecodeSession(fp32).attention_impl_used == ("fused" if torch.cuda.is_available() else "naive")
    assert DecodeSession(fp32, attention_impl="naive").attention_impl_used == "naive"
    # pieces of several tokens: FPA's piece kernel where the step's op runs and under "fused"; the einsums under
    # "auto" and the decode op under "fused" for the layers without it (a window rule, a softmax layer)
    assert DecodeSession(fp32).piece_attention_impl_used == ("fpa_piece" if torch.cuda.is_available() else "naive")
    assert DecodeSession(fp32, attention_impl="naive").piece_attention_impl_used == "naive"
    assert DecodeSession(fp32, attention_impl="fused").piece_attention_impl_used == "fpa_piece"
    threshold, window = PruneRule(threshold=-1.0), PruneRule(window=3)
    assert DecodeSession(fp32, attention_impl="fused", rule=threshold).piece_attention_impl_used == "fpa_piece"
    assert DecodeSession(fp32, attention_impl="fused", rule=window).piece_attention_impl_used == "fused"
    mixed = decoder_d16(backend="fpa", bias_layers=[0]).float()
    assert DecodeSession(mixed, attention_impl="fused").piece_impls == ["fpa_piece", "fused"]
    assert DecodeSession(mixed, attention_impl="fused").piece_attention_impl_used == "fpa_piece+fused"
    for attention in ({"fpa_level": "query"}, {"fpa_reduction": "dipsum"}, {"positional": "alibi"}):
        other = decoder_d16(backend="fpa", **attention).float()
        assert DecodeSession(other, attention_impl="fused").piece_attention_impl_used == "fused"
    assert DecodeSession(decoder_d16(backend="fox").float(), attention_impl="fused").piece_impls == ["fused"] * 2
    # scoring pieces (cached_token_losses): long ones only where every layer runs the piece kernel
    assert DecodeSession(fp32, attention_impl="fused").default_piece == 8192
    assert DecodeSession(mixed, attention_impl="fused").default_piece == 512
    assert DecodeSession(fp32, attention_impl="naive").default_piece == 512
    for decoder, impl, rule in ((fp32, "fused", threshold), (fp32, "fused", window), (mixed, "fused", None),
                                (fp32, "naive", None)):  # the same piece without a session
        session = DecodeSession(decoder, attention_impl=impl, rule=rule)
        assert default_piece_tokens(decoder, rule, impl) == session.default_piece
    # documents of 2049 ids (2048 queries) per scoring call: as many as fill a piece, at least one
    assert [rows_per_pass(8192, n) for n in (2049, 2050, 8193, 16385)] == [4, 3, 1, 1]
    with pytest.raises(ValueError, match="attention_impl must be one of"):
        DecodeSession(fp32, attention_impl="flash")
    heads_of_8 = Decoder(ModelConfig(vocab_size=VOCAB, n_layer=1, d_model=16, n_head=2, d_mlp=32, max_seq_len=32))
    with pytest.raises(ValueError, match="head dim"):
        DecodeSession(heads_of_8.to(DEV).eval(), attention_impl="fused")
    with pytest.raises(ValueError, match="bf16, fp16 or fp32"):
        DecodeSession(decoder_d16(backend="fpa"), attention_impl="fused")  # float64
    assert DecodeSession(decoder_d16(backend="fpa"), attention_impl="auto").attention_impl_used == "naive"
    if not torch.cuda.is_available():
        monkeypatch.setenv("TRITON_INTERPRET", "0")
        with pytest.raises(ValueError, match="attention_impl='fused' cannot run here: it needs a CUDA device"):
            DecodeSession(fp32, attention_impl="fused")


def gpu_model(backend: str, impl: str = "auto") -> Decoder:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=VOCAB, n_layer=2, d_model=128, n_head=2, d_mlp=256, max_seq_len=128,
                      attention={"backend": backend, "impl": impl})  # head dim 64
    return random_gates(Decoder(cfg).cuda().eval(), std=0.2)


def float64_reference(decoder: Decoder, backend: str) -> Decoder:
    """`decoder`'s weights in float64 on the naive parallel path: the fused parallel kernels that "auto" takes on a
    GPU for the prefill refuse float64."""
    reference = gpu_model(backend, "naive")
    reference.load_state_dict(decoder.state_dict())
    return reference.double()


@pytest.mark.gpu
@pytest.mark.parametrize("backend, rule, dtype, compile", [
    ("sdpa", None, torch.bfloat16, False), ("fpa", None, torch.bfloat16, False),
    ("selective", None, torch.bfloat16, False), ("dcp", None, torch.bfloat16, False),
    ("fpa", None, torch.bfloat16, True),
    # eviction in float32: in bf16 a key whose bias lies within rounding of the threshold may be evicted by one
    # session and kept by the other, whichever attention op runs
    ("fpa", PruneRule(threshold=-2.0), torch.float32, False)],
    ids=["sdpa", "fpa", "selective", "dcp", "fpa-compiled", "fpa-evict-fp32"])
def test_gpu_graph_decoding_with_the_fused_op(backend, rule, dtype, compile):
    decoder = gpu_model(backend)
    ids = torch.randint(0, VOCAB, (2, T), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    reference = decoded(float64_reference(decoder, backend), ids, "naive", rule, cuda_graph=False)
    low = cast_weights(copy.deepcopy(decoder), dtype)
    same = decoded(low, ids, "naive", rule, cuda_graph=True)
    got = decoded(low, ids, "fused", rule, cuda_graph=True, compile=compile)
    eager = decoded(low, ids, "fused", rule, cuda_graph=False)
    torch.testing.assert_close(got, eager, atol=1e-2 if compile else 1e-3, rtol=0)  # a stale buffer would show
    assert_within_bound(got, same, reference, backend)


@pytest.mark.parametrize("impl", ["naive", "fused"])
@pytest.mark.parametrize("rule", [None, PruneRule(threshold=-1.0)], ids=["unpruned", "evicting"])
def test_a_decoding_step_traces_as_one_graph(impl, rule):
    """What compile=True compiles: Dynamo traces the whole single-token step as one graph, with the fused op (a
    custom op, not a graph break per layer) and with an eviction rule (its slot search has no op Inductor lacks)."""
    s = DecodeSession(decoder_d16(backend="fpa").float(), rule=rule, attention_impl=impl, check_every=8)
    ids = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        s.prefill([ids[0], ids[1, :5]], max_new_tokens=4)
        s.reserve(1)
        torch._dynamo.reset()
        explained = torch._dynamo.explain(s._step)(ids[:, 0].to(DEV))
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons


def test_compiled_steps_within_the_same_precision_bound():
    """compile=True end to end: Inductor builds the step with the fused op (a custom op) and an eviction rule, and
    its logits stay within the project's bound of the float64 naive session: at most 2x the eager float32 fused
    session's error plus 8 fp32 ulps."""
    decoder, rule = decoder_d16(backend="fpa"), PruneRule(threshold=-1.0)
    ids = torch.randint(0, VOCAB, (2, T), generator=torch.Generator().manual_seed(0))
    reference = decoded(decoder, ids, "naive", rule)
    fp32 = copy.deepcopy(decoder).float()
    torch._dynamo.reset()
    same, got = decoded(fp32, ids, "fused", rule), decoded(fp32, ids, "fused", rule, compile=True)
    assert_within_bound(got, same, reference, "compiled")


def test_a_compiled_step_does_not_recompile_for_a_strided_token_slice():
    """A CUDA-graph session warms the compiled step on the caller's ids and captures it on a contiguous copy;
    were a strided slice such as ids[:, t] compiled as given, the capture would recompile (a stride guard), which
    CUDA forbids during capture. Steps take their ids contiguous, so the second call finds the first's graph."""
    s = DecodeSession(decoder_d16(backend="fpa").float(), attention_impl="naive", check_every=8, compile=True)
    ids = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(1))
    torch._dynamo.reset()
    with torch.no_grad():
        s.prefill([ids[0, :6], ids[1, :5]], max_new_tokens=4)
        s.step(ids[:, 6])  # a column of a (2, 12) tensor: stride 12
        with torch._dynamo.config.patch(error_on_recompile=True):
            s.step(ids[:, 7].clone())


def test_compile_takes_a_mode_and_refuses_the_ones_that_capture_graphs_themselves():
    """compile="max-autotune-no-cudagraphs" (Inductor's GEMM templates, for the decode benchmark's A/B) decodes what
    the eager step does; modes that capture CUDA graphs of their own would nest in the session's capture: refused."""
    decoder = decoder_d16(backend="fpa").float()
    ids = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(1))
    torch._dynamo.reset()
    logits = []
    for compile in (False, "max-autotune-no-cudagraphs"):
        s = DecodeSession(decoder, attention_impl="naive", check_every=8, compile=compile)
        with torch.no_grad():
            s.prefill([ids[0, :6], ids[1, :5]], max_new_tokens=3)
            logits.append(torch.stack([s.step(ids[:, t]).clone() for t in (6, 7)]))
    torch.testing.assert_close(logits[1], logits[0], atol=1e-5, rtol=0)
    for mode in ("reduce-overhead", "max-autotune", "fast", "", None, 0):  # never a silent eager step
        with pytest.raises(ValueError, match="compile must be a bool or one of"):
            DecodeSession(decoder, compile=mode)


@pytest.mark.skipif(torch.cuda.is_available(), reason="counts the Triton interpreter's launches (CPU)")
@pytest.mark.parametrize("backend, rule", [("sdpa", None), ("fpa", None), ("fpa", PruneRule(threshold=-1.0))],
                         ids=["softmax-rope", "fpa", "fpa-evicting"])
def test_a_fused_step_launches_ten_kernels_per_layer(backend, rule):
    """The fused step's point (docs/generation.md, "The decoding step"): a layer's step is 4 matmuls and 6 Triton
    launches (2 norms, store_token, step_attention's two, silu_mul), RoPE, the cache's writes, FPA's gate map,
    bias and eviction included; the step's fixed part 4 (embedding, first norm, lm_head, the position's advance;
    the copy of a strided token column happens before, outside a captured step).
    Counted on the CPU: aten ops that would launch a kernel (views and allocations left out; a custom op's entry is
    not one, its Triton launches are) and the interpreter's launches, decoders of 2 and 3 layers."""
    import triton.runtime.interpreter as interpreter
    from torch.utils._python_dispatch import TorchDispatchMode

    no_kernel = {"view", "unsqueeze", "transpose", "select", "permute", "t", "alias", "expand", "slice", "detach",
                 "_unsafe_view", "reshape", "flatten", "unflatten", "empty", "empty_strided", "new_empty"}
    kernels = []

    class CountAten(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.namespace == "aten" and func.overloadpacket.__name__ not in no_kernel:
                kernels.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    launch = interpreter.GridExecutor.__call__

    def counted_launch(self, *args, **kwargs):
        kernels.append(self.fn.__name__)
        return launch(self, *args, **kwargs)

    per_step = []
    for n_layer in (2, 3):
        torch.manual_seed(0)
        cfg = ModelConfig(vocab_size=VOCAB, n_layer=n_layer, d_model=32, n_head=2, d_mlp=32, max_seq_len=32,
                          attention={"backend": backend})
        s = DecodeSession(random_gates(Decoder(cfg).eval(), std=0.5), rule=rule, attention_impl="fused",
                          check_every=8)
        assert s.step_impls == ["fused_step"] * n_layer
        ids = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(2))
        tokens = ids[:, 1].contiguous()
        with torch.no_grad():
            s.prefill([ids[0], ids[1, :5]], max_new_tokens=4)
            s.step(ids[:, 0])
            kernels.clear()
            with CountAten(), pytest.MonkeyPatch.context() as patch:
                patch.setattr(interpreter.GridExecutor, "__call__", counted_launch)
                s.step(tokens)
        per_step.append(len(kernels))
    assert per_step[1] - per_step[0] == 10, kernels
    assert per_step[0] == 2 * 10 + 4, kernels
