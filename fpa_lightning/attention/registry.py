"""The one registry of attention backends: the names a config may use, the class each name builds, and the
positional encoding each uses unless the config says otherwise. ``AttentionConfig`` (``attention.config``) validates
against it."""
from __future__ import annotations

from dataclasses import dataclass

from fpa_lightning.attention.base import AttentionBackend
from fpa_lightning.attention.backends import AlibiBackend, DcpBackend, FoxBackend, FpaBackend, SelectiveBackend


@dataclass(frozen=True)
class BackendEntry:
    cls: type[AttentionBackend]
    default_positional: str
    """Positional encoding unless the config overrides it (docs/method.md: FPA and FoX use none, the peers RoPE)."""
    description: str


BACKENDS: dict[str, BackendEntry] = {
    "sdpa": BackendEntry(AttentionBackend, "rope", "softmax attention (SDPA) with RoPE"),
    "nope": BackendEntry(AttentionBackend, "none", "softmax attention without positional encoding"),
    "alibi": BackendEntry(AlibiBackend, "alibi", "softmax attention with ALiBi"),
    "fox": BackendEntry(FoxBackend, "none", "FoX: forgetting attention"),
    "fpa": BackendEntry(FpaBackend, "none", "FPA: path-minimum forgetting attention"),
    "selective": BackendEntry(SelectiveBackend, "rope", "Selective Attention (layer-shared)"),
    "dcp": BackendEntry(DcpBackend, "rope", "Dynamic Context Pruning (layer-shared)"),
}


def backend_entry(name: str) -> BackendEntry:
    """The registry entry of a backend name; raises on an unknown one, listing the known names."""
    if name not in BACKENDS:
        raise ValueError(f"attention.backend must be one of {tuple(BACKENDS)}, got {name!r}")
    return BACKENDS[name]

