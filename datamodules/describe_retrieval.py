"""What the synthetic retrieval documents (``datamodules.retrieval_synth``) look like, offline: document lengths, facts
and the distance distribution, measured quantiles beside the law's (docs/training.md, "Data mixtures").

    python -m datamodules.describe_retrieval                           # the study's corpus, seq_len 2048, 200 documents
    python -m datamodules.describe_retrieval --distance-law log_uniform --filler offline   # the bundled KJV corpus

(A module of its own: ``python -m datamodules.retrieval_synth`` would run a second copy of a module the package has
already imported.)
"""

from __future__ import annotations

import argparse
import os
import statistics
from collections.abc import Sequence

from . import sources
from .corpus import offline_corpus_dir
from .retrieval_synth import (DISTANCE_LAWS, OPTIONS, RetrievalSource, distance_cdf, distance_quantile,
                              distance_range)
from .stream import SplitSource
from .tokenizer import mistral_tokenizer

QUANTILES = (0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95)


def describe(source: RetrievalSource, documents: int, seed: int = 0) -> dict:
    """The first ``documents`` documents of shard 0 of ``source`` (pass 0, data seed ``seed``), summarised: their
    lengths (tokens, BOS and EOS included), facts, and distances (tokens from a fact's first token to its recall's
    end) beside the law's quantiles, the fraction above half of ``max_distance``, and how far each distance is from its
    target."""
    made = [source.document(seed, 0, 0, i) for i in range(documents)]
    asked = [f for doc in made for f in doc.facts if f.recall is not None]
    distances = sorted(f.distance for f in asked)
    low, high = distance_range(source.max_tokens, source.max_distance)
    half = source.max_distance // 2
    cuts = statistics.quantiles(distances, n=100, method="inclusive") if len(distances) > 1 else distances * 99
    return {
        "documents": documents, "law": source.distance_law, "range": [low, high],
        "facts_per_document": sum(len(doc.facts) for doc in made) / documents, "recalls": len(asked),
        "document_tokens": _spread([doc.tokens + 2 for doc in made]),
        "distance": {q: cuts[round(100 * q) - 1] for q in QUANTILES},
        "law_distance": {q: distance_quantile(source.distance_law, low, high, q) for q in QUANTILES},
        "above_half": {"tokens": half, "measured": sum(d > half for d in distances) / len(distances),
                       "law": 1 - distance_cdf(source.distance_law, low, high, half)},
        "off_target": _spread([abs(f.distance - f.target_distance) for f in asked]),
    }


def _spread(values: list[int]) -> dict:
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def _print_description(d: dict) -> None:
    low, high = d["range"]
    print(f"{d['documents']} documents, {d['facts_per_document']:.2f} facts each, {d['recalls']} recalls; "
          f"document tokens (BOS, EOS included): {_line(d['document_tokens'])}")
    print(f"distance, tokens from a fact's first token to its recall's end ({d['law']} targets in [{low}, {high}]):")
    print("  quantile  " + "".join(f"{q:>7g}" for q in QUANTILES))
    print("  measured  " + "".join(f"{d['distance'][q]:>7.0f}" for q in QUANTILES))
    print("  law       " + "".join(f"{d['law_distance'][q]:>7.0f}" for q in QUANTILES))
    above = d["above_half"]
    print(f"  above {above['tokens']}: {above['measured']:.3f} of the distances (law {above['law']:.3f}); "
          f"|distance - target|: {_line(d['off_target'])}")


def _line(q: dict) -> str:
    return ", ".join(f"{k} {v:g}" for k, v in q.items())


def _filler_files(spec: str) -> list[str]:
    """The filler's files: ``offline`` (the bundled KJV corpus's train split), a folder in the SlimPajama layout (its
    train/ files, as ``datamodules.SlimPajamaDataModule`` finds them) or a glob."""
    if spec == "offline":
        return [str(offline_corpus_dir() / "train.jsonl")]
    if os.path.isdir(spec):
        return sources.expand_files("train/**/*.jsonl*", spec)
    return sources.expand_files(spec)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m datamodules.describe_retrieval",
        description="Print what the synthetic retrieval documents look like: lengths, facts and the distance "
                    "distribution (measured quantiles beside the law's), offline.")
    parser.add_argument("--filler", default="data/corpus/slimpajama",
                        help="the filler's prose: a SlimPajama-layout folder (its train/ files; default: the study's "
                             "corpus, python -m datamodules.build_corpus --out data/corpus), a glob of .jsonl files, "
                             "or 'offline' (the bundled KJV corpus)")
    parser.add_argument("--seq-len", type=int, default=2048, help="the training length (default 2048, the study's)")
    parser.add_argument("--documents", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0, help="the data seed")
    parser.add_argument("--distance-law", choices=DISTANCE_LAWS, default=OPTIONS["distance_law"])
    parser.add_argument("--max-distance", type=int, help="default: --seq-len")
    parser.add_argument("--max-facts", type=int, default=OPTIONS["max_facts"])
    parser.add_argument("--tokenizer", help="a tokenizer.json (default: the offline Mistral tokenizer)")
    args = parser.parse_args(argv)
    source = RetrievalSource("retrieval", SplitSource(files=tuple(_filler_files(args.filler))),
                             mistral_tokenizer(args.tokenizer), args.seq_len, max_distance=args.max_distance,
                             max_facts=args.max_facts, distance_law=args.distance_law)
    _print_description(describe(source, args.documents, args.seed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
