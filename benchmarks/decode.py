"""Decoding speed with the KV cache: ms per step at batch 1 and 8 for prompt lengths 1k-16k, FPA (with and without
eviction at -10), FoX and softmax on the 110M shapes, all in one run, with ratios to softmax from the same run.

    PYTHONPATH=. python benchmarks/decode.py [--modes eager graph] [--compile-lengths 1024 8192 16384]
                                            [--fpa-ckpt PATH] [--json out.json]

What is timed: ``DecodeSession.step`` (fpa_lightning.generation), one new token per row, after the prompt is
prefilled by the parallel forward (fused kernels) and a few warm-up steps; CUDA events around ``--steps`` steps.
Modes: eager (kernel by kernel), graph (the step captured once in a CUDA graph and replayed), compile (the step
``torch.compile``d, then captured; batch 1 at ``--compile-lengths``: every cache shape compiles anew, ~1 min each).
Weights are bf16 (gate maps float32, ``cast_weights``); the models are freshly initialised, so FPA and FoX start as
ALiBi: with eviction at -10 head h keeps about 10/m_h keys (16 to 2560). ``--fpa-ckpt`` uses a trained FPA
checkpoint's weights instead (its kept fraction is then the real one).
On a CPU (no CUDA) it runs tiny shapes in eager mode only: a check that the script works, not a measurement.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math

import torch

from fpa_lightning import Decoder, ModelConfig
from fpa_lightning.evaluation.checkpoint import load_decoder
from fpa_lightning.generation import DecodeSession, PruneRule, cast_weights

SHAPES_110M = dict(vocab_size=32000, n_layer=12, d_model=768, n_head=12, d_mlp=2048, max_seq_len=2048)
SHAPES_TINY = dict(vocab_size=512, n_layer=2, d_model=64, n_head=2, d_mlp=128, max_seq_len=64)
VARIANTS = {  # name: (backend, eviction threshold)
    "softmax": ("sdpa", None),
    "fox": ("fox", None),
    "fpa": ("fpa", None),
    "fpa-prune-10": ("fpa", -10.0),
}


def build(backend: str, shapes: dict, device: torch.device, dtype: torch.dtype, ckpt: str | None) -> Decoder:
    if ckpt is not None and backend == "fpa":
        decoder = load_decoder(ckpt, device).decoder
    else:
        torch.manual_seed(0)
        decoder = Decoder(ModelConfig(**shapes, attention={"backend": backend})).to(device).eval()
    return cast_weights(decoder, dtype) if dtype != torch.float32 else decoder


def time_steps(session: DecodeSession, token: torch.Tensor, steps: int, warmup: int) -> float:
    """Median-free mean ms per step over `steps` steps, after `warmup` (the first of which captures a graph)."""
    for _ in range(warmup):
        token = session.step(token).argmax(dim=-1)
    if session.device.type != "cuda":
        import time

        start = time.perf_counter()
        for _ in range(steps):
            token = session.step(token).argmax(dim=-1)
        return 1000 * (time.perf_counter() - start) / steps
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(steps):
        token = session.step(token).argmax(dim=-1)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / steps


def measure(decoder: Decoder, threshold: float | None, batch: int, length: int, mode: str, steps: int,
            warmup: int) -> dict:
    device = next(decoder.parameters()).device
    rule = None if threshold is None else PruneRule(threshold=threshold)
    # no capacity check inside the timed steps: the check (one sync, maybe a resize and a new capture) is
    # amortised over check_every steps in real use
    session = DecodeSession(decoder, rule=rule, cuda_graph=mode != "eager", compile=mode == "compile",
                            check_every=steps + warmup + 1)
    generator = torch.Generator().manual_seed(length)
    prompts = list(torch.randint(3, decoder.cfg.vocab_size, (batch, length), generator=generator))
    with torch.no_grad():
        logits = session.prefill(prompts, max_new_tokens=steps + warmup + 1)
        ms = time_steps(session, logits.argmax(dim=-1), steps, warmup)
    stats = session.stats()
    del session
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {"ms_per_step": ms, "ms_per_token": ms / batch, "kept_fraction": stats["kept_fraction"],
            "cache_mib": stats["cache_bytes"] / 2**20, "state_share": stats["state_fraction_of_kv"],
            "capacity": stats["capacity"]}


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    p.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    p.add_argument("--variants", nargs="+", choices=sorted(VARIANTS), default=list(VARIANTS))
    p.add_argument("--modes", nargs="*", choices=("eager", "graph"), default=["eager", "graph"])
    p.add_argument("--compile-lengths", type=int, nargs="*", default=[],
                   help="also the compiled step at batch 1 for these lengths (each shape compiles, ~1 min)")
    p.add_argument("--steps", type=int, default=64, help="timed steps per measurement")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--fpa-ckpt", help="a trained FPA checkpoint (110M shapes) for the fpa variants")
    p.add_argument("--json", help="also write every measurement here")
    args = p.parse_args(argv)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    shapes, dtype = (SHAPES_110M, torch.bfloat16) if cuda else (SHAPES_TINY, torch.float32)
    if not cuda:  # a check of the script on a CPU: tiny shapes, eager only
        args.lengths, args.batches, args.modes, args.steps, args.compile_lengths = [32, 64], [1, 2], ["eager"], 4, []
        print("no CUDA: tiny shapes, eager mode only (a check that the benchmark runs, not a measurement)")
    machine = torch.cuda.get_device_name() if cuda else "cpu"
    print(f"decode benchmark {datetime.datetime.now():%Y-%m-%d %H:%M} on {machine}, torch {torch.__version__}, "
          f"shapes {shapes}")
    plan = [(b, t, mode) for mode in args.modes for b in args.batches for t in args.lengths]
    plan += [(1, length, "compile") for length in args.compile_lengths]
    rows = []
    for name in args.variants:
        backend, threshold = VARIANTS[name]
        decoder = build(backend, shapes, device, dtype, args.fpa_ckpt)
        for batch, length, mode in plan:
            try:
                result = measure(decoder, threshold, batch, length, mode, args.steps, args.warmup)
            except Exception as err:  # one failed measurement (e.g. out of memory) is reported, the rest still run
                result = {"error": f"{type(err).__name__}: {err}"[:300]}
            rows.append({"variant": name, "batch": batch, "length": length, "mode": mode, **result})
            print(json.dumps(rows[-1]), flush=True)
        del decoder
    report(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return rows


def report(rows: list[dict]) -> None:
    """One table per mode: ms per step, the ratio to softmax at the same (batch, length), the kept fraction and
    the cache; then each variant's flatness (its slowest over its fastest length)."""
    ok = [r for r in rows if "error" not in r]
    softmax = {(r["batch"], r["length"], r["mode"]): r["ms_per_step"] for r in ok if r["variant"] == "softmax"}
    print(f"\n{'mode':8s} {'variant':13s} {'B':>2s} {'T':>6s} {'ms/step':>8s} {'ms/token':>8s} {'x softmax':>9s} "
          f"{'kept':>6s} {'cache MiB':>9s} {'state/KV':>8s}")
    for r in sorted(ok, key=lambda r: (r["mode"], r["variant"], r["batch"], r["length"])):
        ratio = r["ms_per_step"] / softmax[(r["batch"], r["length"], r["mode"])] if (
            r["batch"], r["length"], r["mode"]) in softmax else math.nan
        print(f"{r['mode']:8s} {r['variant']:13s} {r['batch']:2d} {r['length']:6d} {r['ms_per_step']:8.3f} "
              f"{r['ms_per_token']:8.3f} {ratio:9.3f} {r['kept_fraction']:6.3f} {r['cache_mib']:9.1f} "
              f"{100 * r['state_share']:7.2f}%")
    groups = {}
    for r in ok:
        groups.setdefault((r["mode"], r["variant"], r["batch"]), []).append(r["ms_per_step"])
    print("\nflatness (slowest / fastest length):")
    for (mode, variant, batch), times in sorted(groups.items()):
        if len(times) > 1:
            print(f"  {mode:8s} {variant:13s} B={batch}: {max(times) / min(times):.3f}")
    for r in rows:
        if "error" in r:
            print(f"FAILED {r['variant']} B={r['batch']} T={r['length']} {r['mode']}: {r['error']}")


if __name__ == "__main__":
    main()
