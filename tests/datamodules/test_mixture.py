"""Weighted train mixtures (datamodules.mixture): sources drawn in their proportions (an exact binomial bound), each
source read in its own single-source order, an exact resume mid-stream, per-source counts kept in the resume state,
local files, hub streaming and synthetic sources alike, and clear errors for bad weights and sources."""
import itertools
import json
import math
import random
import re

import pytest
import torch

from _dm_helpers import make_docs, write_jsonl, write_parquet
from datamodules import TextDataModule
from datamodules.corpus import kjv_books
from datamodules.mixture import MixtureError, MixturePart, MixtureSource
from datamodules.retrieval_synth import RetrievalSource
from datamodules.stream import PackedStream, SplitSource, record_blocks
from datamodules.text import DataChangedError, UnusableDataError


def binomial_bounds(n: int, p: float, alpha: float = 1e-6) -> tuple[int, int]:
    """The two-sided acceptance region [lo, hi] of X ~ Binomial(n, p) at level alpha: P(X < lo) <= alpha/2 and
    P(X > hi) <= alpha/2, from the exact probabilities (summed in log space)."""
    log_pmf = [math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * math.log(p)
               + (n - k) * math.log1p(-p) for k in range(n + 1)]
    pmf = [math.exp(v) for v in log_pmf]
    lo, tail = 0, 0.0
    while tail + pmf[lo] <= alpha / 2:
        tail += pmf[lo]
        lo += 1
    hi, tail = n, 0.0
    while tail + pmf[hi] <= alpha / 2:
        tail += pmf[hi]
        hi -= 1
    return lo, hi


@pytest.fixture(scope="module")
def folders(tmp_path_factory, shared_tok):
    """Two small local sources ('a': short documents, so passes wrap quickly; 'b': others) and a prose file (KJV)
    for the synthetic filler, with validation data."""
    root = tmp_path_factory.mktemp("mix")
    docs = make_docs(8, seed=1, max_words=30)  # 4 a file: with two shards, a pass of a shard is 4 documents
    for i in range(2):
        write_jsonl(root / "a" / "train" / f"part{i}.jsonl", [{"text": "alpha " + t} for t in docs[i::2]])
    write_jsonl(root / "b" / "train.jsonl", [{"body": "beta " + t} for t in make_docs(40, seed=2, max_words=60)])
    sentences = re.split(r"(?<=[.!?]) ", " ".join(kjv_books()[0][1].split()[:6000]))  # the start of Genesis
    write_jsonl(root / "prose" / "train.jsonl",  # short documents of 3 sentences
                [{"text": " ".join(sentences[i:i + 3])} for i in range(0, len(sentences), 3)])
    write_jsonl(root / "a" / "val.jsonl", [{"text": t} for t in make_docs(10, seed=3)])
    return root


SYNTH = {"synthetic": "retrieval", "filler": "prose", "min_tokens": 64, "max_tokens": 160, "max_distance": 100,
         "filler_chars": 20_000}


@pytest.fixture(scope="module")
def shared_tok(tok):
    """The session's tokenizer, given to every module of these tests instead of each loading its own (time)."""
    _TOKENIZER.append(tok)
    yield tok
    _TOKENIZER.clear()


_TOKENIZER = []


def module(**kw) -> TextDataModule:
    dm = TextDataModule(**kw)
    dm._tokenizer = _TOKENIZER[0] if _TOKENIZER else None
    return dm


def mixture_dm(root, weights=None, synth=SYNTH, **kw):
    """A module over folder a, mixing a (its own train data), b (other files and text field), the prose and a
    synthetic source (options ``synth``)."""
    mixture = {"a": {}, "b": {"source": str(root / "b"), "train_files": "train.jsonl", "text_field": "body"},
               "prose": {"train_files": str(root / "prose" / "train.jsonl")}, "synth": synth}
    weights = weights or {"a": 0.4, "b": 0.3, "prose": 0.1, "synth": 0.2}
    kw = {"seq_len": 32, "batch_size": 4, "num_workers": 0, "mixture": mixture, "mixture_weights": weights, **kw}
    return module(source=str(root / "a"), **kw)


def take(loader, n):
    return list(itertools.islice(iter(loader), n))


def test_sources_are_drawn_in_their_proportions(folders):
    """20,000 draws of each of two shards: every source's count inside its exact binomial 1e-6 acceptance region."""
    source = mixture_dm(folders, {"a": "rest", "b": 0.3, "prose": 0.05, "synth": 0.15}).split_source("train")
    expected = dict(zip(source.names, (0.5, 0.3, 0.05, 0.15)))
    assert {p.name: p.probability for p in source.parts} == pytest.approx(expected)
    n = 20_000
    per_shard = []
    for shard in (0, 1):
        draws = list(itertools.islice(source.draws(seed=0, shard=shard), n))
        per_shard.append(draws)
        for k, name in enumerate(source.names):
            lo, hi = binomial_bounds(n, expected[name])
            assert lo <= draws.count(k) <= hi, (name, draws.count(k), (lo, hi))
    assert per_shard[0] != per_shard[1]  # each shard draws its own order
    assert list(itertools.islice(source.draws(seed=0, shard=0), n)) == per_shard[0]  # and the same one again


def test_records_follow_the_draws_and_each_source_keeps_its_own_order(folders):
    dm = mixture_dm(folders)
    source = dm.split_source("train")
    records = list(itertools.islice(source.records(2, 1, 0, 0), 300))
    draws = list(itertools.islice(source.draws(seed=0, shard=1), 300))
    assert [r[2] for r in records] == [source.names[k] for k in draws]
    # source a's documents come in the order a single-source stream of folder a reads them (shuffled blocks, passes)
    single = module(source=str(folders / "a"), seq_len=32).split_source("train")
    alone = [rec for p in range(4) for block in record_blocks(single.records(2, 1, 0, p), 64,
                                                               random.Random(f"0/{p}/1"), 0)
             for _, rec in block]
    mixed = [r[:2] for r in records if r[2] == "a"]
    assert len(mixed) > len(alone) == 4 * 4 and mixed[:len(alone)] == alone  # 4 documents a pass: passes wrap
    assert all(r[0].startswith("beta ") for r in records if r[2] == "b")


def test_resume_mid_stream_is_exact(folders):
    """The state after k batches (through JSON) resumed in a fresh module gives exactly the batches the uninterrupted
    stream gives after them; two workers (two shards, each resumed from its own cursor, the workers rotated; one worker
    or none is the same stream)."""
    n, k = 16, 7
    first = mixture_dm(folders, num_workers=2)
    stream = iter(first.train_dataloader())
    head = take(stream, k)
    state = json.loads(json.dumps(first.state_dict()))  # (no trainer: the batches yielded are the batches consumed)
    straight = take(stream, n - k)  # the uninterrupted stream goes on
    second = mixture_dm(folders, num_workers=2)
    second.load_state_dict(state)
    tail = take(second.train_dataloader(), n - k)
    assert len(head) == k and state["ranks"][0]["consumed"] == k
    for x, y in zip(straight, tail, strict=True):
        assert all(torch.equal(x[key], y[key]) for key in ("input_ids", "labels", "segment_ids"))
    counts = second.stats["train"]["sources"]
    assert set(counts) == {"a", "b", "prose", "synth"}
    assert counts["a"]["documents"] > 8  # a pass of source a ended in one shard at least (4 documents a shard)


def test_per_source_counts_are_logged_and_saved(folders, caplog):
    dm = mixture_dm(folders)
    with caplog.at_level("INFO", logger="datamodules.text"):
        take(dm.train_dataloader(), 10)
    assert "train mixture" in caplog.text and "synth 0.2" in caplog.text
    stats = dm.stats["train"]
    per_source = stats["sources"]
    assert sum(c["documents"] for c in per_source.values()) == stats["documents"] > 0
    assert sum(c["tokens"] for c in per_source.values()) == stats["tokens"]
    assert per_source["synth"]["tokens"] > 0 and per_source["b"]["documents"] > 0
    state = json.loads(json.dumps(dm.state_dict()))
    assert state["ranks"][0]["stats"]["train"]["sources"] == per_source  # in every checkpoint
    resumed = mixture_dm(folders)
    resumed.load_state_dict(state)
    assert resumed.stats["train"]["sources"] == per_source
    assert "sources" not in module(source=str(folders / "a")).stats["train"]  # single source: as before


def test_a_changed_mixture_is_not_resumed(folders):
    state = mixture_dm(folders).state_dict()
    other = mixture_dm(folders, {"a": 0.5, "b": 0.2, "prose": 0.1, "synth": 0.2})
    with pytest.raises(DataChangedError, match=r"mixture\.a probability 0\.4 -> 0\.5"):
        other.load_state_dict(state)
    other = mixture_dm(folders, synth={**SYNTH, "distance_law": "log_uniform"})  # other documents: a change of data
    with pytest.raises(DataChangedError, match=r"mixture\.synth generator .*'distance_law': 'uniform'.* -> "
                                               r".*'distance_law': 'log_uniform'"):
        other.load_state_dict(state)
    with pytest.raises(DataChangedError, match="a mixture -> a single source"):
        module(source=str(folders / "a"), seq_len=32, batch_size=4, num_workers=0).load_state_dict(state)


def test_hub_streaming_local_files_and_synthetic_sources_mix(folders, tmp_path, tok):
    """A hub-streamed source (HF datasets' code path, on local parquet), local files and a synthetic source, packed."""
    parquet = [str(write_parquet(tmp_path / f"s{i}.parquet", [f"hub {t}" for t in make_docs(10, seed=10 + i)]))
               for i in range(2)]
    hub = SplitSource(hub_id="parquet", hub_split="train", hub_data_files=tuple(parquet))
    local = SplitSource(files=(str(folders / "a" / "train" / "part0.jsonl"),))
    synth = RetrievalSource("synth", SplitSource(files=(str(folders / "prose" / "train.jsonl"),)), tok, 64,
                            min_tokens=64, filler_chars=20_000)
    source = MixtureSource([MixturePart("hub", 0.5, hub, False), MixturePart("local", 0.3, local, False),
                            MixturePart("synth", 0.2, synth, True)], shuffle_block=8)
    records = list(itertools.islice(source.records(1, 0, 0, 0), 60))
    by_name = {name: [r[0] for r in records if r[2] == name] for name in source.names}
    assert all(by_name.values()) and all(t.startswith("hub ") for t in by_name["hub"])
    assert all(t.startswith("alpha ") for t in by_name["local"])
    batches = list(itertools.islice(iter(PackedStream(source, tok, 32, 2, 0, 0, 1, 0, True, 8)), 4))
    per_source = {}
    for b in batches:
        for name, counts in b["_fpa_meta"]["delta"]["sources"].items():
            per_source[name] = per_source.get(name, 0) + counts["documents"]
    assert batches[0]["input_ids"].shape == (2, 32) and sum(per_source.values()) > 0


# ------------------------------------------------------------------------------------------- bad options

GOOD = {"a": {}, "s": {"synthetic": "retrieval"}}


@pytest.mark.parametrize("mixture, weights, message", [
    (GOOD, {"a": -0.1, "s": 1}, r"mixture_weights\.a must be >= 0, got -0\.1"),
    (GOOD, {"a": float("nan"), "s": 1}, r"mixture_weights\.a must be a finite number"),
    (GOOD, {"a": "inf", "s": 1}, r"mixture_weights\.a must be a finite number"),
    (GOOD, {"a": 0, "s": 0.0}, r"mixture_weights: every weight is zero"),
    (GOOD, {"a": "lots", "s": 1}, r"mixture_weights\.a must be a number >= 0 or 'rest', got 'lots'"),
    (GOOD, {"a": True, "s": 1}, r"mixture_weights\.a must be a number"),
    (GOOD, {"a": 1}, r"mixture_weights has no weight for 's': give mixture_weights\.s"),
    (GOOD, {"a": 1, "s": 1, "c": 1}, r"mixture_weights names no source of mixture: 'c'"),
    (GOOD, {"a": "rest", "s": "rest"}, r"only one source may take the rest"),
    (GOOD, {"a": "rest", "s": 1.5}, r"must sum to at most 1, got 1\.5"),
    (GOOD, None, r"mixture is set but mixture_weights is not"),
    (None, {"a": 1}, r"mixture_weights is set but mixture is not"),
    ({}, {"a": 1}, r"data option mixture must be a mapping"),
    ({"a": {"files": "x"}, "s": GOOD["s"]}, {"a": 1, "s": 1}, r"mixture\.a: unknown key\(s\) files"),
    ({"a": {}, "s": {"synthetic": "qa"}}, {"a": 1, "s": 1}, r"mixture\.s\.synthetic: unknown generator 'qa'"),
    ({"a": {}, "s": {"synthetic": "retrieval", "filler": "z"}}, {"a": 1, "s": 1},
     r"mixture\.s\.filler names no data source of the mixture: 'z'"),
    ({"a": {}, "s": {"synthetic": "retrieval", "max_distance": 10}}, {"a": 1, "s": 1},
     r"mixture\.s\.max_distance must be >= 64"),
    ({"a": {}, "s": {"synthetic": "retrieval", "max_facts": 20}}, {"a": 1, "s": 1},
     r"mixture\.s: max_facts must be 1 to 8"),
    ({"a": {}, "s": {"synthetic": "retrieval", "distance_law": "normal"}}, {"a": 1, "s": 1},
     r"mixture\.s\.distance_law must be one of uniform, log_uniform, got 'normal'"),
])
def test_bad_mixture_options_are_clear_errors(mixture, weights, message):
    with pytest.raises(MixtureError, match=message):
        TextDataModule(mixture=mixture, mixture_weights=weights)


def test_a_missing_or_unusable_source_names_the_mixture_source(folders, tmp_path):
    dm = mixture_dm(folders)
    dm.mixture[1] = type(dm.mixture[1])("b", 0.3, 0.3, data=(("source", str(tmp_path / "nowhere")),))
    with pytest.raises(FileNotFoundError, match=r"mixture source 'b' \(data option mixture\.b\).*does not exist"):
        dm.setup("fit")
    write_jsonl(tmp_path / "bad" / "train.jsonl", [{"other": "x"}] * 3)
    bad = mixture_dm(folders)
    bad.mixture[1] = type(bad.mixture[1])("b", 0.3, 0.3, data=(("source", str(tmp_path / "bad")),))
    with pytest.raises(UnusableDataError, match=r"train data of mixture source 'b'.*no 'text' field"):
        bad.check_stage("fit")
    with pytest.raises(ValueError, match=r"mixture source 'b' .*no usable document"):
        take(bad.train_dataloader(), 30)
