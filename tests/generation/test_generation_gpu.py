"""GPU: decoding in bf16 (fused prefill, CUDA-graph steps) against the float64 parallel forward, within the
same-precision bound (at most 2x the error of the bf16 chunked parallel forward); graph replay equals eager."""
import copy

import pytest
import torch
from _gen_helpers import random_gates

from fpa_lightning import Decoder, ModelConfig
from fpa_lightning.analysis.pruning import pruned_cache
from fpa_lightning.generation import DecodeSession, PruneRule, cast_weights

pytestmark = pytest.mark.gpu
PROMPT, T = 40, 96


def model(backend: str) -> Decoder:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=256, n_layer=2, d_model=128, n_head=2, d_mlp=256, max_seq_len=128,
                      attention={"backend": backend})  # head dim 64: the fused FPA kernel applies
    return random_gates(Decoder(cfg).cuda().eval(), std=0.2)


def variant(decoder: Decoder, impl: str, dtype: torch.dtype | None) -> Decoder:
    out = copy.deepcopy(decoder)
    out.cfg.attention.impl = impl  # the backends share this config object
    if dtype == torch.float64:
        return out.double()
    return cast_weights(out, dtype) if dtype is not None else out


def decoded(decoder: Decoder, ids: torch.Tensor, cuda_graph: bool, rule=None) -> torch.Tensor:
    """Logits of positions PROMPT − 1 .. T − 1: the prefill's, then one step per token."""
    session = DecodeSession(decoder, rule=rule, cuda_graph=cuda_graph)
    with torch.no_grad():
        out = [session.prefill(list(ids[:, :PROMPT]), max_new_tokens=T - PROMPT).float()]
        out += [session.step(ids[:, t]).float().clone() for t in range(PROMPT, T)]
    return torch.stack(out, dim=1)


@pytest.mark.parametrize("backend", ["fpa", "fox", "sdpa", "selective", "dcp"])
def test_gpu_bf16_decode_within_the_same_precision_bound(backend):
    decoder = model(backend)
    ids = torch.randint(0, 256, (2, T), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    with torch.no_grad():
        reference = variant(decoder, "naive", torch.float64)(ids)[:, PROMPT - 1 :]
        same_precision = variant(decoder, "chunked", torch.bfloat16)(ids)[:, PROMPT - 1 :].double()
        fused = variant(decoder, "auto", torch.bfloat16)
        assert all(impl.endswith(":fused") for impl in fused.attention_impls("cuda"))
        fused_parallel = fused(ids)[:, PROMPT - 1 :].double()
    graph, eager = decoded(fused, ids, True), decoded(fused, ids, False)
    torch.testing.assert_close(graph, eager, atol=1e-3, rtol=0)  # same kernels; a stale buffer would show
    e_same = (same_precision - reference).abs().max().item()
    floor = 8 * torch.finfo(torch.float32).eps * (1 + reference.abs().max().item())
    for name, got in (("decode", graph.double()), ("fused prefill", fused_parallel)):
        err = (got - reference).abs().max().item()
        assert err <= 2 * e_same + floor, f"{backend} {name}: error {err:.3e} > 2 x same-precision {e_same:.3e}"


def test_gpu_eviction_matches_the_simulation_in_float32():
    decoder = model("fpa")
    ids = torch.randint(0, 256, (2, T), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    rule = PruneRule(threshold=-2.0)
    chunked = variant(decoder, "chunked", None)
    with torch.no_grad(), pruned_cache(chunked, rule) as stats:
        simulated = chunked(ids)[:, PROMPT - 1 :]
    assert stats.mean_fraction() < 1
    graph, eager = decoded(decoder, ids, True, rule), decoded(decoder, ids, False, rule)
    torch.testing.assert_close(graph, eager, atol=1e-5, rtol=0)
    torch.testing.assert_close(graph, simulated, atol=2e-4, rtol=0)
