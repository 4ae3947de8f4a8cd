"""The KV cache: per layer K, V and each backend's per-key state in a slot layout whose memory is really reused.

Every (row, head) has S slots ("capacity"). A slot is free (``key_pos`` = −1) or holds one key: its K and V
(B, H, S, D), its position (B, H, S) and the backend's per-key state (B, H or 1, S, ...), e.g. FPA's level ψ_s
and running minimum m_s (``AttentionBackend.decode_bias``). Per row the cache keeps what continues across steps
(FPA's walk) and the position of the next token.

* Without eviction a key's slot is its position ("append": no search).
* With eviction a new key takes the first free slot of its (row, head): an evicted key's slot is reused by the
  next key, so the live keys never need more than S slots. ``compact`` gathers the live keys of each (row, head)
  to the front and shrinks S, ``grow`` enlarges it; both keep each head's keys in position order.

All per-step operations have static shapes (S fixed), so a decoding step can be captured in a CUDA graph; only
``grow``/``compact`` (between steps) change S.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from fpa_lightning.attention.base import DecodeState
from fpa_lightning.ops.common import FREE



def _gather_slots(store: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """store (B, Hs, S, ...) gathered at slots (B, H, m) (the first Hs heads' slots) -> (B, Hs, m, ...)."""
    idx = slots[:, : store.shape[1]]
    idx = idx.reshape(*idx.shape, *([1] * (store.dim() - 3))).expand(*idx.shape, *store.shape[3:])
    return store.gather(2, idx)


def _scatter_slots(store: torch.Tensor, slots: torch.Tensor, values: torch.Tensor) -> None:
    """store[b, h, slots[b, h, i]] = values[b, h, i] for the first Hs heads, in place."""
    idx = slots[:, : store.shape[1]]
    idx = idx.reshape(*idx.shape, *([1] * (store.dim() - 3))).expand(*idx.shape, *store.shape[3:])
    store.scatter_(2, idx, values.to(store.dtype))


def _empty_slots(store: torch.Tensor, capacity: int, fill) -> torch.Tensor:
    """A store (B, H or 1, S, ...) of `capacity` slots all holding `fill`, in `store`'s dtype and device."""
    shape = list(store.shape)
    shape[2] = capacity
    return store.new_full(shape, fill)


@dataclass
class LayerCache:
    """One attention layer's cache. k, v: (B, H, S, D); key_pos: (B, H, S) int32, FREE for a free slot;
    state: per-key backend state {name: (B, H or 1, S, ...)}; carry: per-row backend state {name: (B, ...)}."""

    k: torch.Tensor
    v: torch.Tensor
    key_pos: torch.Tensor
    state: DecodeState = field(default_factory=dict)
    carry: DecodeState = field(default_factory=dict)
    slots: torch.Tensor | None = None
    """(B, H, n): the slots of the keys written by the current step (``write``), where ``put`` stores their state."""

    @property
    def capacity(self) -> int:
        return self.key_pos.shape[-1]

    def write(self, k: torch.Tensor, v: torch.Tensor, query_pos: torch.Tensor, slots: torch.Tensor | None) -> None:
        """Store the keys of n new tokens: k, v (B, n, H, D) at query_pos (B, n), into ``slots`` (B, H, n), or into
        the first n free slots of each (row, head) when slots is None. The caller guarantees there are enough."""
        B, n, H, _ = k.shape
        if slots is None:
            slots = self.first_free_slots(n)
        self.slots = slots
        _scatter_slots(self.k, slots, k.transpose(1, 2))
        _scatter_slots(self.v, slots, v.transpose(1, 2))
        _scatter_slots(self.key_pos, slots, query_pos[:, None, :].expand(B, H, n))

    def first_free_slots(self, n: int) -> torch.Tensor:
        """The first n free slots of each (row, head), in slot order: (B, H, n) int64."""
        free = self.key_pos == FREE  # (B, H, S)
        if n == 1:
            # a decoding step: argmax returns the first maximal index, one reduction per layer where the general
            # search below takes a scan and a search (and Inductor cannot build searchsorted for a compiled step)
            return free.to(torch.uint8).argmax(dim=-1, keepdim=True)
        # the i-th free slot is where the running count of free slots first reaches i + 1
        free_count = free.to(torch.int32).cumsum(dim=-1)  # (B, H, S)
        wanted = torch.arange(1, n + 1, device=free.device, dtype=free_count.dtype).expand(*free.shape[:2], n)
        return torch.searchsorted(free_count, wanted.contiguous())

    def put(self, name: str, values: torch.Tensor) -> None:
        """The backend's per-key state of the keys just written: values (B, H or 1, n, ...)."""
        _scatter_slots(self.state[name], self.slots, values)

    def free(self, evicted: torch.Tensor) -> None:
        """Drop the keys where evicted (B, H or 1, S) is True, for good: their slots become free."""
        self.key_pos.masked_fill_(evicted, FREE)

    def live(self) -> torch.Tensor:
        """Keys held per (row, head): (B, H) int64."""
        return (self.key_pos != FREE).sum(dim=-1)

    def resized(self, capacity: int) -> "LayerCache":
        """A copy with `capacity` slots holding the live keys of each (row, head) in position order at the front
        (compaction when capacity shrinks; the old tensors are released with this object). capacity must be at
        least the largest live count."""
        B, H, S = self.key_pos.shape
        if S == 0:  # an empty cache (DecodeSession.begin): nothing to move, a few allocations instead of ~20 ops
            return LayerCache(*(_empty_slots(t, capacity, fill) for t, fill in ((self.k, 0), (self.v, 0),
                                                                                (self.key_pos, FREE))),
                              {name: _empty_slots(s, capacity, 0) for name, s in self.state.items()}, dict(self.carry))
        order_key = torch.where(self.key_pos == FREE, torch.iinfo(self.key_pos.dtype).max, self.key_pos)
        order = order_key.argsort(dim=-1, stable=True)[..., : min(S, capacity)]  # live keys first, by position
        pad = capacity - order.shape[-1]

        def moved(store: torch.Tensor, fill) -> torch.Tensor:
            kept = _gather_slots(store, order)
            if pad <= 0:
                return kept.contiguous()
            shape = list(kept.shape)
            shape[2] = pad
            return torch.cat([kept, kept.new_full(shape, fill)], dim=2)

        return LayerCache(moved(self.k, 0), moved(self.v, 0), moved(self.key_pos, FREE),
                          {name: moved(s, 0) for name, s in self.state.items()}, dict(self.carry))

    def bytes_per_slot(self) -> int:
        """Bytes one more slot per (row, head) costs: K, V, the position and the backend's per-key state (from the
        shapes, so an empty cache answers too)."""
        return sum(math.prod(t.shape[:2] + t.shape[3:]) * t.element_size()  # every dim but the slots'
                   for t in (self.k, self.v, self.key_pos, *self.state.values()))

    def nbytes(self) -> dict[str, int]:
        """Allocated bytes: K and V, the backend's per-key and per-row state, and the slot positions."""
        state = sum(t.numel() * t.element_size() for t in (*self.state.values(), *self.carry.values()))
        return {"kv": 2 * self.k.numel() * self.k.element_size(), "state": state,
                "positions": self.key_pos.numel() * self.key_pos.element_size()}


@dataclass
class KVCache:
    """Every layer's ``LayerCache`` and, per row, the position of its next token (B,) (int64, on the device)."""

    layers: list[LayerCache]
    next_pos: torch.Tensor
    append: bool
    """True while slots are positions (no eviction rule): a new key's slot is its position."""

    @property
    def capacity(self) -> int:
        return self.layers[0].capacity

    def bytes_per_slot(self) -> int:
        """Bytes one more slot per (row, head) costs, summed over layers (``LayerCache.bytes_per_slot``)."""
        return sum(layer.bytes_per_slot() for layer in self.layers)

    def max_live(self) -> int:
        """The largest number of keys any (layer, row, head) holds (synchronises with the device)."""
        return int(torch.stack([layer.live().max() for layer in self.layers]).max())

    def resize(self, capacity: int) -> None:
        """Grow or compact every layer to `capacity` slots (``LayerCache.resized``). In append mode the layout
        stays slot = position: without eviction a row's live keys are exactly its positions 0..next − 1."""
        self.layers = [layer.resized(capacity) for layer in self.layers]

    def kept_fraction(self) -> float:
        """Cached keys over keys seen, averaged over layers, heads and rows (1.0 without eviction)."""
        seen = self.next_pos.to(torch.float64)[:, None]  # (B, 1): positions 0..next−1 were seen
        return float(torch.stack([(layer.live() / seen).mean() for layer in self.layers]).mean())

    def nbytes(self) -> dict[str, int]:
        """Allocated bytes summed over layers ("kv", "state", "positions", "total") and the bytes of the live keys
        alone ("live": what a cache holding exactly the kept keys would need)."""
        totals = {"kv": 0, "state": 0, "positions": 0, "live": 0}
        live_keys = torch.stack([layer.live().sum() for layer in self.layers]).tolist()  # one synchronisation
        for layer, live in zip(self.layers, live_keys):
            sizes = layer.nbytes()
            for name, value in sizes.items():
                totals[name] += value
            slots = layer.key_pos.numel()
            totals["live"] += live * sum(sizes.values()) // max(slots, 1)
        totals["total"] = totals["kv"] + totals["state"] + totals["positions"]
        return totals

