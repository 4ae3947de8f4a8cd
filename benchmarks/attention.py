"""Attention kernel benchmark (GPU): forward and forward+backward median times.

    PYTHONPATH=. python benchmarks/attention.py [--shapes 8x2048,4x4096,2x8192,1x16384] [--H 12] [--D 64]

Methods: sdpa-flash, sdpa-cudnn (torch.nn.attention.sdpa_kernel), fox (FlexAttention), fpa (fused,
no skipping), fpa-skip10 (skip_threshold=-10), the other FPA variants, fused: fpa-query (query level),
fpa-dipsum (dip-sum reduction), fpa-docs (document masking: packed documents of geometric length, mean 1024
tokens; SDPA-flash, its reference, attends across them), selective and dcp (layer-shared bias through SDPA),
selective-fused (Selective Attention's Triton kernel, no (T, T) bias), dcp-fused (DCP's Triton kernel, no (T, T)
bias; dcp and dcp-fused take fp32 qi, ki of width r = 32, as DcpBackend makes them).
Inputs are fresh random non-zero tensors, bf16; FPA uses realistic walks: increments δ with a
negative mean (−0.02 per token) and noise (0.3), φ = W + g, ψ = W + h, β = 1, so most old keys are
dead, as in a trained model. Every time is also printed as a ratio to sdpa-flash from the same run, and every
method's peak memory in one forward+backward beyond what was allocated before it (outputs, gradients, scratch).
The launch environment variables of docs/kernel.md (FPA_<KERNEL>_...) apply, for A/B runs only.
"""
from __future__ import annotations

import argparse
import datetime
import math

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel


def bench(fn, *, warmup=25, rep=100):
    return triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median")


def peak_extra_mib(fn) -> float:
    """MiB allocated at the peak of fn() beyond what was allocated before it (its outputs, gradients and scratch)."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**20


def walks(B, T, H, device, *, drift=-0.02, noise=0.3, offset=0.5):
    W = (drift + noise * torch.randn(B, T, H, device=device)).cumsum(1)
    phi = W + offset * torch.randn(B, T, H, device=device)
    psi = W + offset * torch.randn(B, T, H, device=device)
    return phi.float(), psi.float()


def packed_documents(B, T, device, *, mean_length=1024, seed=0):
    """(B, T) ids of packed documents: a new one starts at each token with probability 1/mean_length."""
    gen = torch.Generator().manual_seed(seed)
    return (torch.rand(B, T, generator=gen) < 1.0 / mean_length).long().cumsum(1).to(device)


def make_methods(B, T, H, D, device):
    dt = torch.bfloat16

    def qkv():
        return [torch.randn(B, T, H, D, device=device, dtype=dt).requires_grad_() for _ in range(3)]

    methods = {}

    def sdpa(backend):
        q, k, v = qkv()

        def f():
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(
                    q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
                ).transpose(1, 2)

        return f, (q, k, v)

    methods["sdpa-flash"] = lambda: sdpa(SDPBackend.FLASH_ATTENTION)
    methods["sdpa-cudnn"] = lambda: sdpa(SDPBackend.CUDNN_ATTENTION)

    def fox():
        from fpa_lightning.ops.fox.flex import fox_flex_attention

        q, k, v = qkv()
        c = F.logsigmoid(3.0 + torch.randn(B, T, H, device=device)).cumsum(1).requires_grad_()
        return (lambda: fox_flex_attention(q, k, v, c)), (q, k, v, c)

    methods["fox-flex"] = fox

    def fpa(thr=None, **variant):
        from fpa_lightning.ops.fpa.fused import fpa_attention

        q, k, v = qkv()
        phi, psi = walks(B, T, H, device)
        phi.requires_grad_()
        psi.requires_grad_()
        beta = torch.ones(H, device=device, requires_grad=True)
        return (lambda: fpa_attention(q, k, v, phi, psi, beta, skip_threshold=thr, **variant)), (q, k, v, phi, psi, beta)

    methods["fpa"] = lambda: fpa()
    methods["fpa-skip10"] = lambda: fpa(-10.0)
    methods["fpa-query"] = lambda: fpa(level="query")
    methods["fpa-dipsum"] = lambda: fpa(reduction="dipsum")
    methods["fpa-docs"] = lambda: fpa(segment_ids=packed_documents(B, T, device))

    def selective():
        from fpa_lightning.ops.selective import selective_attention_gpu

        q, k, v = qkv()
        return (lambda: selective_attention_gpu(q, k, v)), (q, k, v)

    def selective_fused():
        from fpa_lightning.ops.selective import selective_attention_fused

        q, k, v = qkv()
        return (lambda: selective_attention_fused(q, k, v)), (q, k, v)

    def dcp(r=32, fused=False):
        from fpa_lightning.ops.dcp import dcp_attention_fused, dcp_attention_gpu

        op = dcp_attention_fused if fused else dcp_attention_gpu
        q, k, v = qkv()
        qi, ki = (torch.randn(B, T, r, device=device).requires_grad_() for _ in range(2))
        offset = torch.tensor(0.9, device=device, requires_grad=True)
        return (lambda: op(q, k, v, qi, ki, offset)), (q, k, v, qi, ki, offset)

    methods["selective"] = selective
    methods["selective-fused"] = selective_fused
    methods["dcp"] = dcp
    methods["dcp-fused"] = lambda: dcp(fused=True)
    return methods


def profile_kernels(args):
    """Per-kernel CUDA time of one fwd+bwd (ms a step, over 5 steps, from torch.profiler), the kernels' sum, and the
    step's time without the profiler (CUDA events over 5 steps): a sum well below that time is host time between
    launches, which only fewer launches or less Python per call can remove."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    steps = 5
    for shp in args.shapes.split(","):
        B, T = map(int, shp.split("x"))
        for name in args.methods.split(",") if args.methods else ("fpa", "fpa-skip10"):
            f, leaves = make_methods(B, T, args.H, args.D, "cuda")[name]()
            do = torch.randn(B, T, args.H, args.D, device="cuda", dtype=torch.bfloat16)
            for _ in range(2):
                f().backward(do)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            for _ in range(steps):
                f().backward(do)
            end.record()
            torch.cuda.synchronize()
            step_ms = start.elapsed_time(end) / steps
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(steps):
                    f().backward(do)
                torch.cuda.synchronize()
            kernels = sorted(((e.key, e.self_device_time_total / (steps * 1e3)) for e in prof.key_averages()
                              if e.device_type == DeviceType.CUDA), key=lambda r: -r[1])
            print(f"  {B}x{T} {name}: kernels {sum(ms for _, ms in kernels):.3f} ms of a {step_ms:.3f} ms step, "
                  f"{len(kernels)} distinct; " + ", ".join(f"{k[:40]} {ms:.3f}" for k, ms in kernels[:8]), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="8x2048,4x4096,2x8192,1x16384")
    ap.add_argument("--H", type=int, default=12)
    ap.add_argument("--D", type=int, default=64)
    ap.add_argument("--methods", default="")
    ap.add_argument("--profile", action="store_true",
                    help="per-kernel CUDA times of one fwd+bwd per shape and method, their sum and the step's time")
    args = ap.parse_args()
    device = "cuda"
    if args.profile:
        return profile_kernels(args)
    print(f"GPU {torch.cuda.get_device_name()} | torch {torch.__version__} | triton {triton.__version__} | "
          f"{datetime.datetime.now().isoformat(timespec='seconds')}")
    rows = []
    for shp in args.shapes.split(","):
        B, T = map(int, shp.split("x"))
        H, D = args.H, args.D
        methods = make_methods(B, T, H, D, device)
        if args.methods:
            methods = {k: v for k, v in methods.items() if k in args.methods.split(",") or k == "sdpa-flash"}
        res = {}
        for name, mk in methods.items():
            try:
                f, leaves = mk()
                do = torch.randn(B, T, H, D, device=device, dtype=torch.bfloat16)

                def fwd():
                    with torch.no_grad():
                        f()

                def fwdbwd():
                    for t in leaves:
                        t.grad = None
                    f().backward(do)

                fwdbwd()  # compile / autotune outside the timing
                torch.cuda.synchronize()
                res[name] = (bench(fwd), bench(fwdbwd), peak_extra_mib(fwdbwd))
            except Exception as e:
                print(f"  {B}x{T} {name}: FAILED {type(e).__name__}: {str(e)[:200]}")
            torch.cuda.empty_cache()
        base = res.get("sdpa-flash", (math.nan, math.nan, math.nan))
        for name, (tf, tb, mib) in res.items():
            print(f"  {B}x{T} {name:12s} fwd {tf:8.3f} ms ({tf / base[0]:5.2f}x)   "
                  f"fwd+bwd {tb:8.3f} ms ({tb / base[1]:5.2f}x)   peak {mib:8.1f} MiB", flush=True)
            rows.append((f"{B}x{T}", name, tf, tf / base[0], tb, tb / base[1], mib))
    print("\n| shape B×T | method | fwd ms | fwd / flash | fwd+bwd ms | fwd+bwd / flash | fwd+bwd peak MiB |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]:.3f} | {r[3]:.2f} | {r[4]:.3f} | {r[5]:.2f} | {r[6]:.1f} |")


if __name__ == "__main__":
    main()
