"""Is one training step bit-for-bit repeatable? Finds the parameters whose gradients differ between two identical
fwd+bwd passes of a model, on a GPU.

Each backend's 110M study model (configs/base/110m.yaml's model section, the backend's positional encoding) is built
once from a fixed seed; the same random batch goes through forward and backward twice under bf16 autocast, and every
parameter's gradient is compared bit for bit. A backend whose gradients all match is deterministic for that step
(docs/lm_study.md, "Determinism"); otherwise the differing parameters say which op is not (the attention
projections of every layer: the attention backward; the embedding alone: the embedding backward).
``--deterministic-algorithms`` repeats the check under ``torch.use_deterministic_algorithms(True)`` (what
``--trainer.deterministic=true`` turns on), which selects deterministic paths where PyTorch has them (SDPA's flash
backward among them) and raises for ops that have none.

    python benchmarks/determinism.py --backends fpa fox sdpa --json determinism.json
    python benchmarks/determinism.py --backends sdpa --deterministic-algorithms
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform

import torch

from fpa_lightning import AttentionConfig, ModelConfig
from fpa_lightning.model import Decoder

POSITIONAL = {"fpa": "none", "fox": "none", "sdpa": "rope"}  # the study's configs (configs/study/*.yaml)


def gradients(model: Decoder, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """One bf16-autocast forward and backward of the mean next-token loss; every parameter's gradient (a copy)."""
    model.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model.token_losses(ids[:, :-1], ids[:, 1:]).mean()
    loss.backward()
    return {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}


def compare(first: dict[str, torch.Tensor], second: dict[str, torch.Tensor]) -> dict:
    """The parameters whose gradients differ anywhere, with the largest difference relative to the gradient's size."""
    differing = {}
    for name, g in first.items():
        if not torch.equal(g, second[name]):
            scale = float(g.abs().max()) or 1.0
            differing[name] = {"elements": int((g != second[name]).sum()),
                               "max_rel_diff": float((g - second[name]).abs().max()) / scale}
    return {"parameters": len(first), "differing": len(differing), "details": differing}


def check(backend: str, args) -> dict:
    torch.manual_seed(args.seed)
    config = ModelConfig(attention=AttentionConfig(backend=backend, positional=POSITIONAL[backend]))
    model = Decoder(config).cuda()
    ids = torch.randint(0, config.vocab_size, (args.batch_size, args.seq_len + 1), device="cuda",
                        generator=torch.Generator("cuda").manual_seed(args.seed + 1))
    runs = [gradients(model, ids) for _ in range(args.repeats)]
    pairs = [compare(runs[0], other) for other in runs[1:]]
    return {"backend": backend, "impls": sorted(set(model.attention_impls("cuda"))),
            "deterministic_algorithms": args.deterministic_algorithms, "repeats": args.repeats,
            "bitwise_equal": all(p["differing"] == 0 for p in pairs),
            "differing_parameters": sorted({n for p in pairs for n in p["details"]}),
            "max_rel_diff": max((d["max_rel_diff"] for p in pairs for d in p["details"].values()), default=0.0)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", nargs="+", default=["fpa", "fox", "sdpa"], choices=sorted(POSITIONAL))
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=3, help="passes compared with the first")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--deterministic-algorithms", action="store_true",
                        help="torch.use_deterministic_algorithms(True) (and CUBLAS_WORKSPACE_CONFIG) first")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("determinism.py checks GPU kernels: no CUDA device is available")
    if args.deterministic_algorithms:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS's own condition for repeatable sums
        torch.use_deterministic_algorithms(True)
    results = []
    for backend in args.backends:
        results.append(check(backend, args))
        r = results[-1]
        print(f"{backend:5s} impls={','.join(r['impls'])} deterministic_algorithms={args.deterministic_algorithms}: "
              f"{'bit-for-bit equal' if r['bitwise_equal'] else 'DIFFERENT'} over {args.repeats} passes; "
              f"{len(r['differing_parameters'])} parameters differ (max relative {r['max_rel_diff']:.2e})"
              + (f": {', '.join(r['differing_parameters'][:6])}" if r["differing_parameters"] else ""), flush=True)
    if args.json:
        record = {"what": "bitwise repeatability of one fwd+bwd step, 110M study models", "command": vars(args),
                  "machine": torch.cuda.get_device_name(), "date": str(datetime.date.today()),
                  "versions": {"torch": torch.__version__, "python": platform.python_version(),
                               "triton": __import__("triton").__version__},
                  "results": results}
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
