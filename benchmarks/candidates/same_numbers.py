"""Whether a kernel candidate computes the same numbers as the base: FPA's output and its six gradients, bit for bit.

    python benchmarks/candidates/same_numbers.py BASE_DIR CANDIDATE_DIR [--device cuda] [--variants dense,skip,...]

Each directory is a tree holding `fpa_lightning` (the repository root, or a patched copy from `ab.sh tree`). Each
tree runs in its own process (a process imports one `fpa_lightning`) on the same seeded inputs; the table gives, per
variant and tensor, "same" or the largest absolute difference. A candidate that only reorders or hoists exact
operations (benchmarks/candidates/README.md says which do) must print "same" everywhere; one that changes rounding
will not, and is judged by the GPU tests' error bounds instead. Exit code 0 whatever the table says; 2 on a failed run.

On the GPU the inputs are bf16 at one benchmark-like shape; on the CPU (TRITON_INTERPRET=1, the interpreter's block
size 16) fp32 at a small odd shape.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import subprocess
import sys
import tempfile

TENSORS = ("out", "dq", "dk", "dv", "dphi", "dpsi", "dbeta")
VARIANTS = {  # fpa_attention keyword arguments of each variant (documents are added by `run_tree`)
    "dense": {}, "skip": {"skip_threshold": -3.0}, "query": {"level": "query"}, "dipsum": {"reduction": "dipsum"},
    "docs": {}, "deep": {},
}
DRIFT = {"deep": -4.0}
"""The walks' drift a token where it is not benchmarks/attention.py's -0.02: "deep" is the dense variant on a steep
walk, so that far tiles' probabilities all underflow to 0 (the tiles an exact zero check may pass over)."""


def shape(device: str) -> tuple[int, int, int, int]:
    """(B, T, H, D) of the comparison: benchmark-like on the GPU, small and odd through the interpreter."""
    return (2, 2048, 12, 64) if device == "cuda" else (1, 77, 2, 16)


def seeded_inputs(name: str, device: str):
    """A variant's seeded inputs: q, k, v, dO, phi, psi, beta and its fpa_attention keyword arguments."""
    import torch

    B, T, H, D = shape(device)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    gen = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn(B, T, H, D, generator=gen) for _ in range(4))
    walk = (DRIFT.get(name, -0.02) + 0.3 * torch.randn(B, T, H, generator=gen)).cumsum(1)  # attention.py's walks
    phi = walk + 0.5 * torch.randn(B, T, H, generator=gen)
    psi = walk + 0.5 * torch.randn(B, T, H, generator=gen)
    beta = 0.5 + torch.rand(H, generator=gen)
    q, k, v, do = (x.to(device, dtype) for x in (q, k, v, do))
    phi, psi, beta = (x.to(device) for x in (phi, psi, beta))
    kwargs = dict(VARIANTS[name])
    if name == "docs":  # documents of T // 3 positions (the last one shorter)
        kwargs["segment_ids"] = (torch.arange(T, device=device) // (T // 3 + 1)).expand(B, T).contiguous()
    return q, k, v, do, phi, psi, beta, kwargs


def run_tree(variants: list[str], device: str, out: str) -> None:
    """In the child process: every variant's output and gradients on seeded inputs, saved to ``out``."""
    import torch

    from fpa_lightning.ops.fpa.fused import fpa_attention

    results = {}
    for name in variants:
        q, k, v, do, phi, psi, beta, kwargs = seeded_inputs(name, device)
        inputs = [x.requires_grad_() for x in (q, k, v, phi, psi, beta)]
        o = fpa_attention(*inputs, **kwargs)
        o.backward(do)
        results[name] = [o.detach().cpu()] + [x.grad.cpu() for x in inputs]
    torch.save(results, out)


def bits(x):
    """The tensor's bit patterns as integers (NaNs and signed zeros compare exactly)."""
    import torch

    return x.contiguous().view({2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()])


def compare(base: dict, candidate: dict) -> list[list[str]]:
    """Rows [variant, then per tensor "same" or the largest absolute difference] of two runs' results."""
    import torch

    rows = []
    for name, tensors in base.items():
        cells = []
        for a, b in zip(tensors, candidate[name]):
            if a.dtype == b.dtype and a.shape == b.shape and torch.equal(bits(a), bits(b)):
                cells.append("same")
            else:
                both_nan = torch.isnan(a) & torch.isnan(b)
                diff = torch.where(both_nan, 0.0, (a.double() - b.double()).abs()).nan_to_num(float("inf"))
                cells.append(f"{diff.max().item():.3g}")
        rows.append([name, *cells])
    return rows


def child(tree: pathlib.Path, variants: list[str], device: str, out: str) -> bool:
    """Run ``run_tree`` in a process that imports ``tree``'s fpa_lightning; False if it failed (its error shown)."""
    path = os.pathsep.join([str(tree), str(pathlib.Path(__file__).resolve().parent), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, PYTHONPATH=path, **({"TRITON_INTERPRET": "1"} if device == "cpu" else {}))
    code = f"import same_numbers; same_numbers.run_tree({variants!r}, {device!r}, {out!r})"
    # in the tree: `python -c` puts the working directory first on the import path
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=tree, capture_output=True, text=True)
    if done.returncode:
        print(f"{tree}: failed\n{done.stderr[-3000:]}", file=sys.stderr)
    return done.returncode == 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("base", type=pathlib.Path)
    parser.add_argument("candidate", type=pathlib.Path)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--variants", default=",".join(VARIANTS))
    args = parser.parse_args(argv)
    variants = args.variants.split(",")
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        outs = [f"{tmp}/base.pt", f"{tmp}/candidate.pt"]
        if not all(child(tree.resolve(), variants, args.device, out) for tree, out in zip((args.base, args.candidate), outs)):
            return 2
        rows = compare(*(torch.load(out) for out in outs))
    print(f"| variant | {' | '.join(TENSORS)} |")
    print("|---|" + "---|" * len(TENSORS))
    for row in rows:
        print(f"| {' | '.join(row)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
