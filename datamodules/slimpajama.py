"""SlimPajama (the paper's training data): hub ``cerebras/SlimPajama-627B`` or local copies of its layout.

Layout (hub and local): ``train/chunk1..10/*.jsonl.zst``, ``validation/chunk*/...``, ``test/chunk*/...``,
one JSON object per line with fields ``text`` and ``meta``. Smaller samples with the same layout
(e.g. ``DKYoon/SlimPajama-6B``) work as ``source`` too.
"""

from __future__ import annotations

from .text import TextDataModule


class SlimPajamaDataModule(TextDataModule):
    """Packed SlimPajama batches. Same arguments as ``TextDataModule``; only the defaults differ.

    Args:
        source: hub id (default ``cerebras/SlimPajama-627B``; needs a network) or a local folder with
            ``train/``, ``validation/``, ``test/`` sub-folders of ``chunk*/*.jsonl.zst`` files.
        **kwargs: see ``TextDataModule``.
    """

    default_hub_id = "cerebras/SlimPajama-627B"
    local_patterns = {
        "train": ["train/**/*.jsonl*", "train/**/*"],
        "validation": ["validation/**/*.jsonl*", "validation/**/*"],
        "test": ["test/**/*.jsonl*", "test/**/*"],
    }

    def __init__(self, source: str = "cerebras/SlimPajama-627B", **kwargs):
        super().__init__(source=source, **kwargs)
