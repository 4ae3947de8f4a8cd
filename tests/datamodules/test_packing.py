"""Packing keeps every token exactly once, in order, with correct document boundaries."""

import numpy as np
import pytest

from datamodules import BOS_ID, EOS_ID
from datamodules.packing import Packer, with_bos_eos


def random_docs(n, seed=0, max_len=50):
    rng = np.random.default_rng(seed)
    return [with_bos_eos(rng.integers(3, 32000, size=rng.integers(0, max_len))) for _ in range(n)]


@pytest.mark.parametrize("seq_len", [1, 7, 16, 64])
def test_rows_cover_stream_once_in_order(seq_len):
    docs = random_docs(200)
    stream = np.concatenate(docs)
    doc_of = np.concatenate([np.full(len(d), i) for i, d in enumerate(docs)])
    packer, rows = Packer(seq_len), []
    for i, d in enumerate(docs):
        packer.add(i, d)
        while packer.ready():
            start = len(rows) * seq_len
            assert packer.cursor() == (doc_of[start], start - np.flatnonzero(doc_of == doc_of[start])[0])
            rows.append(packer.pop_row())
    n = len(rows) * seq_len
    inputs = np.concatenate([r[0][:-1] for r in rows])
    labels = np.concatenate([r[0][1:] for r in rows])
    assert np.array_equal(inputs, stream[:n])  # every input token once, in order
    assert np.array_equal(labels, stream[1 : n + 1])  # labels = next token
    assert packer.size == len(stream) - n  # the rest waits in the buffer
    for r, (_, seg) in enumerate(rows):
        owner = doc_of[r * seq_len : (r + 1) * seq_len]
        assert np.array_equal(seg, owner - owner[0])  # segment ids: 0,1,2... per document in the row
        tokens = stream[r * seq_len : (r + 1) * seq_len]
        # a new segment starts exactly at BOS tokens; an EOS belongs to the document it ends
        assert np.array_equal(np.diff(seg) == 1, tokens[1:] == BOS_ID)
        eos = np.flatnonzero(tokens[:-1] == EOS_ID)
        assert np.array_equal(seg[eos], seg[eos + 1] - 1)


def test_resume_from_cursor_gives_same_rows():
    docs = random_docs(60, seed=3)
    full, p = [], Packer(10)
    for i, d in enumerate(docs):
        p.add(i, d)
        while p.ready():
            full.append(p.pop_row())
            if len(full) == 17:
                cursor = p.cursor()
    resumed, q = [], Packer(10)
    doc, offset = cursor
    for i in range(doc, len(docs)):
        q.add(i, docs[i], offset if i == doc else 0)
        while q.ready():
            resumed.append(q.pop_row())
    assert len(resumed) == len(full) - 17
    for a, b in zip(full[17:], resumed):
        assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
