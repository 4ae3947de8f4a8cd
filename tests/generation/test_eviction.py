"""Real eviction: the decoded logits equal the parallel forward with the rule's (query, key) pairs masked
(``analysis.pruning.pruned_cache``), evicted keys are gone from storage, and −inf evicts nothing."""
import pytest
import torch

from fpa_lightning.analysis.pruning import pruned_cache
from fpa_lightning.generation import DecodeSession, PruneRule, generate

from _gen_helpers import VOCAB

ATOL = 1e-10
T = 20

CASES = [  # (attention, rule): thresholds chosen so that the tiny models evict some keys but not all
    ({"backend": "fpa"}, PruneRule(threshold=-1.0)),
    ({"backend": "fpa", "fpa_level": "query"}, PruneRule(threshold=-1.0)),  # not monotone: eviction, not masking
    ({"backend": "fpa", "fpa_reduction": "dipsum"}, PruneRule(threshold=-2.0)),
    ({"backend": "fox"}, PruneRule(threshold=-1.0)),
    ({"backend": "alibi"}, PruneRule(threshold=-1.0)),
    ({"backend": "dcp"}, PruneRule(threshold=-0.3)),
    ({"backend": "selective"}, PruneRule(threshold=-0.02)),
    ({"backend": "fpa", "positional": "alibi", "bias_layers": [0]}, PruneRule(threshold=-1.0)),
    ({"backend": "sdpa"}, PruneRule(window=3)),  # softmax: the sliding window
]


@pytest.fixture(scope="module")
def ids():
    return torch.randint(0, VOCAB, (2, T), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("attention, rule", CASES, ids=lambda c: str(c))
def test_decoded_logits_equal_the_masked_parallel_forward(make_decoder, ids, attention, rule):
    decoder = make_decoder(**attention)
    with pruned_cache(decoder, rule) as simulated:
        reference = decoder(ids)  # (B, T, V), every layer with the rule's pairs masked
    # prompt of 6 by the simulation's own prefill, then one token per step through the real cache
    session = DecodeSession(decoder, rule=rule)
    stepped = [session.prefill(list(ids[:, :6]), max_new_tokens=T - 6)]
    stepped += [session.step(ids[:, t]) for t in range(6, T)]
    torch.testing.assert_close(torch.stack(stepped, dim=1), reference[:, 5:], atol=ATOL, rtol=0)
    # from the first token on through the cache in pieces: the kept fraction of every query is the simulation's
    pieces = DecodeSession(decoder, rule=rule, track_kept=True)
    logits = [pieces.prefill(list(ids[:, :1]))[:, None], pieces.extend(ids[:, 1:9]), pieces.extend(ids[:, 9:])]
    torch.testing.assert_close(torch.cat(logits, dim=1), reference, atol=ATOL, rtol=0)
    kept = pieces.stats()["kept_per_query"]
    assert kept["kept_fraction"] == pytest.approx(simulated.mean_fraction(), abs=1e-6)  # the simulation sums in fp32
    assert kept["kept_fraction"] < 1.0
    # from an empty cache (begin, as cached_token_losses scores): the same logits and kept fractions
    empty = DecodeSession(decoder, rule=rule, track_kept=True)
    empty.begin(2)
    logits = [empty.extend(ids[:, :7]), empty.extend(ids[:, 7:])]
    torch.testing.assert_close(torch.cat(logits, dim=1), reference, atol=ATOL, rtol=0)
    from_empty = empty.stats()["kept_per_query"]["kept_fraction_per_layer"]
    assert from_empty == pytest.approx(kept["kept_fraction_per_layer"], abs=1e-12)


def test_an_empty_cache_takes_the_dtypes_of_the_real_tokens(make_decoder, ids):
    """begin() under autocast: K, V and the per-key state in the dtypes a prefill of real tokens gives them under the
    same autocast (K and V in bf16), the walk carry at zero; a row count below one is refused."""
    decoder = make_decoder(backend="fpa").float()
    begun, prefilled = (DecodeSession(decoder, rule=PruneRule(threshold=-1.0)) for _ in range(2))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        begun.begin(2)
        prefilled.prefill(list(ids[:, :3]))
        empty, real = begun.cache.layers[0], prefilled.cache.layers[0]
        assert empty.k.dtype == empty.v.dtype == real.k.dtype == torch.bfloat16 and empty.capacity == 0
        assert {n: t.dtype for n, t in empty.state.items()} == {n: t.dtype for n, t in real.state.items()}
        assert {n: t.dtype for n, t in empty.carry.items()} == {n: t.dtype for n, t in real.carry.items()}
        assert torch.equal(empty.carry["walk"], torch.zeros_like(real.carry["walk"]))
        logits = begun.extend(ids[:, :5])
    assert logits.shape[:2] == (2, 5) and begun.cache.layers[0].k.dtype == torch.bfloat16
    with pytest.raises(ValueError, match="at least one row"):
        begun.begin(0)


@pytest.mark.parametrize("attention", [attention for attention, _ in CASES], ids=str)
def test_the_decode_bias_falls_where_the_backend_says_so(make_decoder, ids, attention, monkeypatch):
    """``decode_bias_falls`` lets a piece skip the running OR of its evictions, so every backend that claims it must
    have each cached key's bias non-increasing from one query of a piece to the next; FPA at the query level, which
    does not claim it, is seen to rise (the OR is needed there)."""
    decoder = make_decoder(**attention)
    falls, rises, pairs = set(), 0, 0
    for block in decoder.blocks:
        backend = block.attn.backend

        def recording(x, q, k, query_pos, cache, original=backend.decode_bias):
            bias = original(x, q, k, query_pos, cache)
            if bias is not None:
                records.append((bias, cache.key_pos[:, : bias.shape[1]].clone(), query_pos))
            return bias

        monkeypatch.setattr(backend, "decode_bias", recording)
        falls.add(backend.decode_bias_falls)
    records = []
    session = DecodeSession(decoder)
    session.prefill(list(ids[:, :1]))
    session.extend(ids[:, 1:9])
    session.extend(ids[:, 9:])
    for bias, key_pos, query_pos in records:  # bias (B, H or 1, n, S)
        seen = (key_pos[:, :, None, :] >= 0) & (key_pos[:, :, None, :] <= query_pos[:, None, :, None])
        both = seen[:, :, :-1] & seen[:, :, 1:]  # the key is cached for query t and for t + 1
        step = (bias[:, :, 1:] - bias[:, :, :-1])[both]
        pairs += step.numel()
        rises += int((step > 1e-12).sum())
    assert len(falls) == 1 and (pairs > 0 or (not records and falls == {True}))  # softmax: no bias at all
    assert (rises == 0) == falls.pop(), f"{rises} rises of {pairs}"


def test_a_slot_costs_the_same_in_an_empty_and_a_full_cache(make_decoder):
    """What the device-memory check of a resize multiplies (``KVCache.bytes_per_slot``): a filled cache's bytes over
    its capacity, and the same for the empty cache of ``begin`` (capacity 0: the check once divided by it)."""
    decoder = make_decoder(backend="fpa")
    full = DecodeSession(decoder)
    full.prefill([torch.arange(3, 40)])
    empty = DecodeSession(decoder)
    empty.begin(1)
    assert empty.cache.capacity == 0
    assert full.cache.bytes_per_slot() == full.stats()["cache_bytes"] // full.cache.capacity
    assert empty.cache.bytes_per_slot() == full.cache.bytes_per_slot() > 0


@pytest.mark.parametrize("backend", ["fpa", "fox"])
def test_evicted_keys_are_gone_from_storage(make_decoder, ids, backend):
    """Monotone bias: layer 0 (whose input pruning cannot change) holds exactly the newest key and the keys whose
    bias for the last query is still >= the threshold; the cache was compacted below the prompt length."""
    decoder = make_decoder(backend=backend)
    threshold = -1.0
    session = DecodeSession(decoder, rule=PruneRule(threshold=threshold))
    session.prefill(list(ids), max_new_tokens=0)
    bias = decoder.probe(ids)[0].bias()[:, :, -1]  # (B, H, T): the last query's bias in layer 0
    expected = (bias >= threshold) | (torch.arange(T) == T - 1)
    layer = session.cache.layers[0]
    held = torch.zeros_like(expected)
    for b in range(2):
        for h in range(2):
            positions = layer.key_pos[b, h][layer.key_pos[b, h] >= 0]
            held[b, h, positions] = True
            assert positions.tolist() == sorted(positions.tolist())  # compaction keeps position order
    assert torch.equal(held, expected) and 0 < expected.float().mean() < 1
    stats = session.stats()
    assert stats["kept_fraction"] < 1 and stats["live_bytes"] < stats["cache_bytes"]


def test_compaction_frees_memory(make_decoder):
    """A window of 8 over a 300-token prompt: the cache is compacted to one block of slots and stays there."""
    decoder = make_decoder(backend="fpa")
    long_ids = torch.randint(0, VOCAB, (1, 300), generator=torch.Generator().manual_seed(1))
    full = DecodeSession(decoder)
    full.prefill(list(long_ids))
    pruned = DecodeSession(decoder, rule=PruneRule(window=8), check_every=8)
    pruned.prefill(list(long_ids), max_new_tokens=10)
    assert pruned.stats()["capacity"] < full.stats()["capacity"]
    assert pruned.stats()["cache_bytes"] < full.stats()["cache_bytes"] / 2
    for _ in range(80):  # evicted slots are reused: the capacity does not grow while the live count stays at 8
        pruned.step(torch.tensor([3]))
    assert pruned.cache.max_live() == 8 and pruned.stats()["capacity"] == 64


@pytest.mark.parametrize("backend", ["fpa", "fox"])
def test_minus_inf_evicts_nothing(make_decoder, ids, backend):
    decoder = make_decoder(backend=backend)
    plain, ruled = DecodeSession(decoder), DecodeSession(decoder, rule=PruneRule(threshold=float("-inf")))
    a, b = plain.prefill(list(ids[:, :5]), 10), ruled.prefill(list(ids[:, :5]), 10)
    for t in range(5, 15):
        torch.testing.assert_close(b, a, atol=1e-12, rtol=0)
        a, b = plain.step(ids[:, t]), ruled.step(ids[:, t])
    assert ruled.stats()["kept_fraction"] == 1.0
    # generate() treats -inf as no rule at all: bit-identical
    unpruned = generate(decoder, ids[:, :5], 8, return_stats=True)
    minus_inf = generate(decoder, ids[:, :5], 8, prune_threshold=float("-inf"), return_stats=True)
    assert torch.equal(unpruned[0], minus_inf[0]) and minus_inf[1]["kept_fraction"] == 1.0


def test_generate_with_a_threshold_reports_kept_fraction_and_bytes(make_decoder, ids):
    decoder = make_decoder(backend="fpa")
    _, stats = generate(decoder, ids[:, :12], 8, prune_threshold=-1.0, return_stats=True)
    _, full = generate(decoder, ids[:, :12], 8, return_stats=True)
    assert 0 < stats["kept_fraction"] < 1 and full["kept_fraction"] == 1.0
    assert stats["live_bytes"] < full["live_bytes"]
    assert 0 < stats["state_fraction_of_kv"] < 1 and stats["new_tokens"] == 16


def test_first_free_slots_one_token_and_several():
    """A decoding step's one-reduction search (n = 1) and the general scan-and-search both give, per (row, head),
    the first n free slots in slot order, checked against a plain loop."""
    from fpa_lightning.generation.cache import FREE, LayerCache

    gen = torch.Generator().manual_seed(0)
    B, H, S = 3, 4, 37
    key_pos = torch.randint(0, 100, (B, H, S), generator=gen, dtype=torch.int32)
    key_pos[torch.rand(B, H, S, generator=gen) < 0.4] = FREE
    key_pos[0, 0, :] = FREE  # every slot free
    key_pos[1, 2, :-3] = 7  # only the last three free
    key_pos[1, 2, -3:] = FREE
    cache = LayerCache(torch.zeros(B, H, S, 2), torch.zeros(B, H, S, 2), key_pos)
    for n in (1, 2, 3):
        expected = torch.tensor([[(key_pos[b, h] == FREE).nonzero().flatten()[:n].tolist() for h in range(H)]
                                 for b in range(B)])
        assert torch.equal(cache.first_free_slots(n), expected)
