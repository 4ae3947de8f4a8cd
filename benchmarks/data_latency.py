"""Wall-clock latencies of the data layer that the tests used to assert, measured here instead.

A wall-clock bound in a CI test fails a correct program on a loaded 2-core machine, so the tests check behaviour
(cached means "nothing rewritten", fail-fast means "no network probe") and this script reports the times, each
beside the bound the test used to assert (a budget to compare with, not a pass/fail of the code):

    python benchmarks/data_latency.py                 # the data-layer latencies, about a minute on 2 CPU cores
    python benchmarks/data_latency.py --quickstart    # also README's quickstart run (budget 300 s on 2 CPU cores)
    python benchmarks/data_latency.py --json out.json # the rows as JSON too

Every step runs in a fresh cache folder (FPA_CACHE_DIR), so the first-time costs are measured. ``--strict`` exits
with 1 when a step is over its budget.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import pathlib
import random
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _docs(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    words = "the of and to in that he shall unto for his a lord they be is him not them it with all thou".split()
    return [f"doc{i} " + " ".join(rng.choice(words) for _ in range(rng.randint(5, 400))) for i in range(n)]


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure(work: pathlib.Path, quickstart: bool) -> list[dict]:
    """Rows {step, seconds, budget_s (the bound the test asserted; None: none), over}."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from datamodules import (HubUnavailableError, PG19DataModule, SlimPajamaDataModule, TextDataModule,
                             mistral_tokenizer, offline_corpus_dir, sources)
    from datamodules.sources import hub_records

    rows = []

    def row(step: str, seconds: float, budget: float | None) -> None:
        over = budget is not None and seconds > budget
        rows.append({"step": step, "seconds": round(seconds, 3), "budget_s": budget, "over": over})
        bound = "no budget" if budget is None else f"budget {budget:g} s"
        print(f"{step:58s} {seconds:8.3f} s   ({bound}){'  OVER' if over else ''}", flush=True)

    row("offline corpus: first build", _timed(offline_corpus_dir), 30)
    row("offline corpus: cached", _timed(offline_corpus_dir), 0.1)
    row("tokenizer: first conversion", _timed(mistral_tokenizer), None)
    row("tokenizer: cached", _timed(mistral_tokenizer), 2.0)

    loaders = []

    def quickstart_batches():
        dm = TextDataModule(seq_len=256, batch_size=8, num_workers=2)
        dm.prepare_data()
        dm.setup("fit")
        loaders.append(iter(dm.train_dataloader()))
        for _ in range(3):
            next(loaders[-1])

    row("quickstart data: setup + first 3 batches (2 workers)", _timed(quickstart_batches), 15)
    loaders.clear()  # the workers stop here, outside every timed step
    gc.collect()

    def hub_fails(cls):
        def go():
            try:
                cls(num_workers=0).setup("fit")
            except HubUnavailableError:
                return
            raise RuntimeError(f"{cls.__name__} loaded from the hub")
        return go

    # as the test did: the reachability probe answers "no network" at once, so this times the failure path (and
    # never starts a download on a machine that has a network)
    probe, sources._hub_reachable = sources._hub_reachable, lambda *args, **kwargs: False
    offline = {k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
    try:
        for cls in (SlimPajamaDataModule, PG19DataModule):
            row(f"{cls.__name__}: hub id fails without a network", _timed(hub_fails(cls)), 1.0)
    finally:
        sources._hub_reachable = probe
        for key, value in offline.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value

    def tokenizer_hub_fails():
        os.environ["HF_HUB_OFFLINE"] = "1"
        try:
            mistral_tokenizer("mistralai/Mistral-7B-v0.1")
        except HubUnavailableError:
            return
        finally:
            if offline["HF_HUB_OFFLINE"] is None:
                os.environ.pop("HF_HUB_OFFLINE", None)
        raise RuntimeError("the tokenizer loaded from the hub")

    row("tokenizer: hub id fails with HF_HUB_OFFLINE=1", _timed(tokenizer_hub_fails), 1.0)

    files = []
    for i in range(4):
        path = work / f"s{i}.parquet"
        pq.write_table(pa.table({"text": _docs(10, seed=i)}), path)
        files.append(str(path))
    row("hub streaming path over 4 local parquet shards", _timed(
        lambda: [list(hub_records("parquet", "train", "text", 2, s, 0, 0, data_files=files)) for s in (0, 1)]), 4.0)

    text = ("And it came to pass, " * 200 + "\n") * 1000  # ~4.2 MB, one record
    (work / "big").mkdir()
    with open(work / "big" / "validation.jsonl", "w") as f:
        f.write(json.dumps({"text": text}) + "\n")
    dm = TextDataModule(source=str(work / "big"), seq_len=4096, batch_size=8, num_workers=0)
    row("long_documents: one 4.2 MB document", _timed(lambda: list(dm.long_documents("validation", max_tokens=10**7))),
        10)

    if quickstart:
        run_dir = work / "quickstart"
        run_dir.mkdir()
        row("README quickstart: train.py fit --config configs/quickstart.yaml", _timed(lambda: subprocess.run(
            [sys.executable, str(REPO / "train.py"), "fit", "--config", str(REPO / "configs" / "quickstart.yaml")],
            cwd=run_dir, check=True)), 300)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quickstart", action="store_true", help="also time README's quickstart training run")
    parser.add_argument("--json", help="write the rows here as JSON")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a step is over its budget")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        work = pathlib.Path(tmp)
        os.environ["FPA_CACHE_DIR"] = str(work / "cache")
        print(f"{os.cpu_count()} CPU cores, load average {os.getloadavg()[0]:.2f}, fresh cache {work / 'cache'}")
        rows = measure(work, args.quickstart)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(rows, indent=1))
    return 1 if args.strict and any(r["over"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
