"""PG-19 (the paper's long-context evaluation): hub ``emozilla/pg19`` (parquet) or local copies.

Layout (hub and local): ``data/{train,validation,test}-*.parquet`` with a ``text`` column holding
whole books (tens to hundreds of thousands of tokens each). For evaluation, ``eval_mode="long_docs"``
yields each book whole, unpacked, truncated to ``long_doc_max_tokens`` (default 16,384).
"""

from __future__ import annotations

from .text import TextDataModule


class PG19DataModule(TextDataModule):
    """PG-19 batches. Same arguments as ``TextDataModule``; only the defaults differ.

    Args:
        source: hub id (default ``emozilla/pg19``; needs a network) or a local folder holding
            ``{train,validation,test}-*.parquet`` files (at any depth, e.g. ``data/``).
        eval_mode: ``"long_docs"`` (default here: whole books for long-context evaluation) or ``"packed"``.
        **kwargs: see ``TextDataModule``.
    """

    default_hub_id = "emozilla/pg19"

    def __init__(self, source: str = "emozilla/pg19", eval_mode: str = "long_docs", **kwargs):
        super().__init__(source=source, eval_mode=eval_mode, **kwargs)
