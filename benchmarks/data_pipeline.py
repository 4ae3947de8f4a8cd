"""Throughput of the whole data pipeline: read -> tokenise (DataLoader workers) -> pack -> batches.

Measures packed input tokens per second delivered to the training loop (steady state: timed from
the first batch on, so worker start-up and the one-time caches are excluded; reported separately).

    python benchmarks/data_pipeline.py                        # offline KJV corpus, workers 0/1/2
    python benchmarks/data_pipeline.py --source /data/slimpajama --tokens 50_000_000 --workers 2

The offline KJV train split is ~0.97 M tokens; the train stream is endless (every pass re-reads and
re-tokenises), so longer runs measure real tokenisation, not a cache.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import time


def measure(source: str, workers: int, seq_len: int, batch_size: int, tokens: int) -> dict:
    from datamodules import TextDataModule

    t0 = time.perf_counter()
    dm = TextDataModule(source=source, seq_len=seq_len, batch_size=batch_size, num_workers=workers)
    dm.prepare_data()
    dm.setup("fit")
    it = iter(dm.train_dataloader())
    next(it)
    first = time.perf_counter() - t0
    n, t1 = 0, time.perf_counter()
    while n < tokens:
        n += next(it)["input_ids"].numel()
    dt = time.perf_counter() - t1
    del it
    return {"workers": workers, "first_batch_s": round(first, 2), "tokens": n, "seconds": round(dt, 2),
            "tokens_per_s": round(n / dt), "docs_read": dm.stats["train"]["documents"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", default="offline", help="'offline', a local folder, or a hub id")
    ap.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2], help="num_workers values to run")
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=6_000_000, help="tokens to time per setting (after the first batch)")
    args = ap.parse_args()

    import datasets
    import tokenizers
    import torch

    from datamodules import mistral_tokenizer, offline_corpus_dir

    t = time.perf_counter()
    if args.source == "offline":
        offline_corpus_dir()
    mistral_tokenizer()
    print(f"caches ready in {time.perf_counter() - t:.2f} s")
    env = {"date": datetime.date.today().isoformat(), "cpus": os.cpu_count(), "cpu": platform.processor() or platform.machine(),
           "python": platform.python_version(), "torch": torch.__version__, "tokenizers": tokenizers.__version__,
           "datasets": datasets.__version__}
    print(json.dumps(env))
    for w in args.workers:
        r = measure(args.source, w, args.seq_len, args.batch_size, args.tokens)
        print(json.dumps(r))


if __name__ == "__main__":
    main()
