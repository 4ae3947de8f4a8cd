"""What the language-model study's training stream holds: documents per pass, repeats, and the probe rows' boundaries.

Replays the study's train stream (configs/base/study.yaml's data settings: the SlimPajama-layout corpus, 32 rows of
2048 tokens, 6 workers, seed 0) on a CPU exactly as the training consumes it: batch i comes from logical worker
i mod 6 (datamodules/stream.py), so each worker's own stream is read for its share of the optimizer steps. A document
read in a second pass over a worker's shard is a repeat. Also counts, in the head-statistics callback's probe rows
(the first 16 packed validation rows), the document starts (a segment change), the BOS and the EOS tokens.

    python benchmarks/study_stream.py --corpus data/corpus --tokenizer tokenizer.json --json stream.json
"""
from __future__ import annotations

import argparse
import datetime
import json
import time
from collections import Counter

import torch

from datamodules import SlimPajamaDataModule
from datamodules.stream import META_KEY, PackedStream

BOS, EOS = 1, 2  # the Mistral tokenizer's <s> and </s> (datamodules/packing.py adds them around every document)


def worker_stream(module: SlimPajamaDataModule, worker: int) -> PackedStream:
    """Logical worker `worker`'s train stream, as a DataLoader worker of the study's run builds it."""
    return PackedStream(module.split_source("train"), module.tokenizer, module.seq_len, module.batch_size,
                        module.seed, 0, 1, module.num_workers, True, module.shuffle_block, None, rotation=worker)


def replay_worker(module: SlimPajamaDataModule, worker: int, batches: int) -> dict:
    """Documents and tokens per pass that worker `worker` reads until it has produced `batches` batches."""
    per_pass_docs, per_pass_tokens, produced, last_pass = Counter(), Counter(), 0, 0
    for item in worker_stream(module, worker):
        meta = item[META_KEY]
        if meta["cursor"] is not None:
            last_pass = meta["cursor"][0]
        # a pass-end message (no cursor) closes pass `last_pass`; its counters belong to it
        per_pass_docs[last_pass] += meta["delta"]["documents"]
        per_pass_tokens[last_pass] += meta["delta"]["tokens"]
        if meta["cursor"] is None:
            last_pass += 1
        if "input_ids" in item:
            produced += 1
            if produced == batches:
                break
    return {"worker": worker, "batches": produced, "passes_reached": last_pass + 1,
            "documents_per_pass": dict(sorted(per_pass_docs.items())),
            "tokens_per_pass": dict(sorted(per_pass_tokens.items()))}


def probe_boundaries(module: SlimPajamaDataModule, rows: int) -> dict:
    batch = module.probe_batch(rows, module.seq_len)
    ids, segments = batch["input_ids"], batch["segment_ids"]  # (rows, T)
    starts = int((segments[:, 1:] != segments[:, :-1]).sum())
    return {"rows": rows, "seq_len": module.seq_len, "document_starts": starts,
            "bos_tokens": int((ids == BOS).sum()), "eos_tokens": int((ids == EOS).sum())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", default="data/corpus")
    parser.add_argument("--tokenizer", default=None, help="a tokenizer.json (default: the offline Mistral tokenizer)")
    parser.add_argument("--steps", type=int, default=390, help="optimizer steps of one micro-batch (the study's)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--workers", type=int, default=6)
    parser.add_argument("--probe-rows", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--json", help="write the record here")
    args = parser.parse_args()
    module = SlimPajamaDataModule(source=f"{args.corpus}/slimpajama", tokenizer=args.tokenizer, seq_len=args.seq_len,
                                  batch_size=args.batch_size, num_workers=args.workers)
    start = time.perf_counter()
    workers = []
    for w in range(args.workers):
        share = len(range(w, args.steps, args.workers))  # batch i comes from worker i mod W
        workers.append(replay_worker(module, w, share))
        done = time.perf_counter() - start
        print(f"worker {w + 1}/{args.workers}: {workers[-1]} ({done:.0f} s, "
              f"ETA {done / (w + 1) * (args.workers - w - 1):.0f} s)", flush=True)
    repeats = sum(n for r in workers for p, n in r["documents_per_pass"].items() if p > 0)
    first = sum(r["documents_per_pass"].get(0, 0) for r in workers)
    probes = [probe_boundaries(module, n) for n in args.probe_rows]
    print(f"documents read in a first pass: {first:,}; read again in a later pass (repeats): {repeats:,}")
    for p in probes:
        print(f"probe rows {p['rows']}: {p['document_starts']} document starts, {p['bos_tokens']} BOS, "
              f"{p['eos_tokens']} EOS")
    if args.json:
        record = {"what": "the study's train stream replayed on a CPU: documents per pass and repeats; the probe "
                          "rows' document boundaries", "command": vars(args), "date": str(datetime.date.today()),
                  "versions": {"torch": torch.__version__}, "steps": args.steps,
                  "documents_first_pass": first, "documents_repeated": repeats, "workers": workers,
                  "probe_rows": probes}
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
