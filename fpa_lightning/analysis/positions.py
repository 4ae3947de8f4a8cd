"""Next-token loss by position in long documents: shared by the long-context callback and the evaluation tasks.

The loss at input position i is the loss of predicting token i + 1 from tokens 0..i. Positions are grouped into
buckets [edges[k], edges[k + 1]); a document contributes to the buckets it reaches.
"""
from __future__ import annotations

from collections.abc import Iterable

import torch


@torch.no_grad()
def next_token_losses(model, ids: torch.Tensor, *, autocast_dtype: torch.dtype | None = None,
                      chunk: int = 1024) -> torch.Tensor:
    """ids (B, L) -> per-token next-token loss (B, L − 1) in nats, float64 on the host.

    ``model`` is a Decoder; its chunked vocabulary projection keeps memory at O(L · C), never (L, V). Autocast is
    off (float32) unless ``autocast_dtype`` names one (e.g. torch.bfloat16); losses are float32 either way.
    """
    device = next(model.parameters()).device
    ids = ids.to(device)
    with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
        losses = model.token_losses(ids[:, :-1], ids[:, 1:], chunk=chunk)
    return losses.double().cpu()


def bucket_sums(losses: torch.Tensor, edges: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """losses (L,) by position -> (loss sums, counts), each (K,) float64, over buckets [edges[k], edges[k+1])."""
    bucket = torch.bucketize(torch.arange(losses.shape[0]), torch.tensor(edges[1:-1]), right=True)  # (L,)
    inside = torch.arange(losses.shape[0]) < edges[-1]
    n_buckets = len(edges) - 1
    sums = torch.zeros(n_buckets, dtype=torch.float64).index_add_(0, bucket[inside], losses[inside].double())
    counts = torch.zeros(n_buckets, dtype=torch.float64).index_add_(0, bucket[inside],
                                                                     torch.ones(int(inside.sum()), dtype=torch.float64))
    return sums, counts


def bucket_means(losses: torch.Tensor, edges: list[int]) -> torch.Tensor:
    """losses (L,) -> (K,) mean loss per bucket, NaN where the document does not reach the bucket."""
    sums, counts = bucket_sums(losses, edges)
    return torch.where(counts > 0, sums / counts.clamp_min(1), torch.full_like(sums, float("nan")))


def uniform_edges(window: int, bucket_size: int) -> list[int]:
    """Edges 0, b, 2b, ... covering [0, window): the last bucket may be shorter."""
    return [*range(0, window, bucket_size), window]


def loss_by_position(model, documents: Iterable[torch.Tensor], edges: list[int], *,
                     autocast_dtype: torch.dtype | None = None, chunk: int = 1024) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss sums, token counts) per bucket, pooled over documents (1-D token ids, at least 2 tokens; each is
    truncated to edges[-1] + 1 tokens). A bucket's mean is sums / counts over the documents that reach it."""
    sums = torch.zeros(len(edges) - 1, dtype=torch.float64)
    counts = torch.zeros_like(sums)
    for doc in documents:
        ids = doc[: edges[-1] + 1][None]  # (1, L + 1)
        if ids.shape[1] < 2:
            continue
        doc_sums, doc_counts = bucket_sums(next_token_losses(model, ids, autocast_dtype=autocast_dtype,
                                                             chunk=chunk)[0], edges)
        sums += doc_sums
        counts += doc_counts
    return sums, counts
