"""Offline probe for issue #42's Hopper kernel: dq's fast tile written in Gluon with explicit layouts, compiled for
sm_90a without a GPU, on one warpgroup ([4, 1] warps) and on two that split the tile's 64 query columns ([4, 2]).

    PYTHONPATH=. python benchmarks/gluon_tile_split.py [--json PATH] [--time]

Triton lays a 64-row tile over 8 warps by copying it to both warpgroups (dq at 8 warps issues as many FP32
instructions per warp as at 4: benchmarks/KERNEL_LOG.md, v5), so it cannot trade registers for warps; Gluon places each
warpgroup on half the columns. The probe answers what that split does to registers and to the loop's instructions
per warp, and with --time (on a GPU) what it does to the time. It is not a kernel of the library, and its outputs are
not checked against anything (only that they are finite): `fast_tiles` repeats `_dq_tile_t`'s fast branch (the
two products, the bias, P, dS, the one-exponential query factors, the reciprocal of Z', c folded over row pairs, the
row sums a_s and dq's product through shared memory) without the κ sum, the running mid update or pipelined loads,
so its counts compare its own two layouts, not the library's kernel. Run it under the GPU machine's Triton (3.6; see
benchmarks/kernel_offline.py for the scratch environment); Gluon is experimental and its API moves between versions.
"""
import argparse
import json
import os
import sys
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon._runtime import GluonASTSource  # noqa: E402
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma  # noqa: E402

cta_barrier = gl.thread_barrier if hasattr(gl, "thread_barrier") else gl.barrier  # renamed after Triton 3.6

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kernel_offline  # noqa: E402  (ptxas, nvdisasm and the SASS loop counts, shared)
from fpa_lightning.ops.fpa.kernels import LOG2E  # noqa: E402  (the kernels' own constant)


@gluon.jit
def fast_tiles(K, V, Q, DO, TVEC, SVEC, MIDS, A_OUT, C_OUT, DQ_OUT, nJ, sl2, bl2,
               WN: gl.constexpr, num_warps: gl.constexpr):
    BS: gl.constexpr = 64
    D: gl.constexpr = 64
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, WN], instr_shape=[16, 64 // WN, 16])
    blk: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
    sh: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BS, D], gl.bfloat16)
    tl_: gl.constexpr = gl.SliceLayout(0, mma)  # per query t (columns)
    sl_: gl.constexpr = gl.SliceLayout(1, mma)  # per key s (rows)

    # one program: one query block (its q, dO and query vectors) walking nJ key tiles shared by every program
    pid = gl.program_id(0)
    Q += pid * BS * D
    DO += pid * BS * D
    TVEC += pid * 4 * BS
    A_OUT += pid * nJ * BS
    C_OUT += pid * BS
    DQ_OUT += pid * BS * D
    r = gl.arange(0, BS, layout=gl.SliceLayout(1, blk))
    cidx = gl.arange(0, D, layout=gl.SliceLayout(0, blk))
    offs = r[:, None] * D + cidx[None, :]
    q_s = gl.allocate_shared_memory(gl.bfloat16, [BS, D], sh, gl.load(Q + offs))
    do_s = gl.allocate_shared_memory(gl.bfloat16, [BS, D], sh, gl.load(DO + offs))
    k_s = gl.allocate_shared_memory(gl.bfloat16, [BS, D], sh)
    v_s = gl.allocate_shared_memory(gl.bfloat16, [BS, D], sh)
    ds_s = gl.allocate_shared_memory(gl.bfloat16, [BS, BS], sh)

    t = gl.arange(0, BS, layout=tl_)
    s = gl.arange(0, BS, layout=sl_)
    pre = gl.load(TVEC + t)
    lse = gl.load(TVEC + BS + t)
    delta = gl.load(TVEC + 2 * BS + t)
    zpre = gl.load(TVEC + 3 * BS + t)
    c = gl.sum(gl.reshape(gl.zeros([BS, BS], gl.float32, mma), (BS // 16, 2, 8, BS)), axis=1)
    dq = gl.zeros([BS, D], gl.float32, mma)
    zero = gl.zeros([BS, BS], gl.float32, mma)
    for j in range(nJ):
        cta_barrier()  # every warpgroup's products of the last tile have read k_s, v_s and ds_s
        k_s.store(gl.load(K + j * BS * D + offs))
        v_s.store(gl.load(V + j * BS * D + offs))
        psi = gl.load(SVEC + j * 3 * BS + s)
        kvec = gl.load(SVEC + j * 3 * BS + BS + s)
        zsuf = gl.load(SVEC + j * 3 * BS + 2 * BS + s)
        mid = gl.load(MIDS + j)  # mid(J, I) changes along the walk
        fence_async_shared()
        cta_barrier()
        sT = warpgroup_mma(k_s, q_s.permute((1, 0)), zero, use_acc=False)
        dpT = warpgroup_mma(v_s, do_s.permute((1, 0)), zero, use_acc=False)
        # the fast tile's factors (as _fast_tile_factors): one exponential per query, one per key
        d = pre - mid
        E = gl.exp2(-gl.abs(d) * LOG2E)
        before = d < 0.0
        y = gl.where(before, E, 1.0)
        e3 = gl.where(before, 1.0, E)
        es = gl.exp2((mid - kvec) * LOG2E)
        x = zsuf * es + 0.5
        m_t = gl.minimum(pre, mid)
        dlt = m_t[None, :] - psi[:, None]
        sT = sT * sl2 + gl.minimum(dlt, 0.0) * bl2
        pT = gl.exp2(sT - lse[None, :])
        dsT = pT * (dpT - delta[None, :])
        gm = gl.where(dlt < 0.0, dsT, 0.0)
        z = x[:, None] * y[None, :] + (zpre * e3)[None, :]
        rr = gm * gl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=r,r", [z], dtype=gl.float32,
                                            is_pure=True, pack=1)
        c += gl.sum(gl.reshape(rr * e3[None, :], (BS // 16, 2, 8, BS)), axis=1)
        col = gl.sum(rr * y[None, :], axis=1)
        gl.store(A_OUT + j * BS + s, es * col)
        # dq += dS k: dS^T through shared memory as the A operand [t, s], k as B [s, d]
        ds_s.store(gl.permute(dsT, (1, 0)).to(gl.bfloat16))
        fence_async_shared()
        cta_barrier()
        dq = warpgroup_mma(ds_s, k_s, dq)
    csum = gl.sum(gl.reshape(c, (BS // 2, BS)), axis=0)
    gl.store(C_OUT + gl.arange(0, BS, layout=csum.type.layout), csum)
    dq_r = gl.arange(0, BS, layout=gl.SliceLayout(1, mma))
    dq_c = gl.arange(0, D, layout=gl.SliceLayout(0, mma))
    gl.store(DQ_OUT + dq_r[:, None] * D + dq_c[None, :], dq)


LAYOUTS = ((1, None), (2, None), (2, 128))
"""(warpgroups across the columns, register cap): one warpgroup; two; two under the cap that lets two 8-warp blocks
share an SM's 64K registers."""


def time_layouts(programs: int, tiles: int) -> list[dict]:
    """GPU only: each layout's time for `programs` query blocks walking `tiles` key tiles (3072 and 128 are dq's
    programs at 1 x 16384 with 12 heads and their mean walk), on random inputs kept in range (normalisers >= 1)."""
    import torch

    dev, bf = "cuda", torch.bfloat16
    gen = torch.Generator(device=dev).manual_seed(0)
    K, V = (torch.randn(tiles * 64, 64, device=dev, dtype=bf, generator=gen) for _ in range(2))
    Q, DO = (torch.randn(programs * 64, 64, device=dev, dtype=bf, generator=gen) for _ in range(2))
    tvec = torch.randn(programs, 4, 64, device=dev, generator=gen)
    tvec[:, 1] += 8.0  # lse: probabilities below one
    tvec[:, 3] = 1.0 + tvec[:, 3].abs()  # zpre >= 1
    svec = torch.randn(tiles, 3, 64, device=dev, generator=gen)
    svec[:, 2] = 1.0 + svec[:, 2].abs()  # zsuf >= 1
    mids = torch.randn(tiles, device=dev, generator=gen) - 2.0
    a_out = torch.empty(programs, tiles, 64, device=dev)
    c_out = torch.empty(programs, 64, device=dev)
    dq_out = torch.empty(programs, 64, 64, device=dev)
    rows = []
    for wn, cap in LAYOUTS:
        launch = {"WN": wn, "num_warps": 4 * wn, **({"maxnreg": cap} if cap else {})}

        def run():
            fast_tiles[(programs,)](K, V, Q, DO, tvec, svec, mids, a_out, c_out, dq_out, tiles, 0.18, 1.44, **launch)

        run()
        torch.cuda.synchronize()
        finite = bool(torch.isfinite(dq_out).all() and torch.isfinite(a_out).all() and torch.isfinite(c_out).all())
        ms = triton.testing.do_bench(run, warmup=25, rep=100, return_mode="median")
        rows.append({"warps": 4 * wn, "maxnreg": cap, "ms": round(ms, 4), "outputs_finite": finite})
        print(f"warps {4 * wn} [4, {wn}], cap {cap}: {ms:.3f} ms for {programs} x {tiles} tiles, "
              f"outputs finite: {finite}", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", type=Path, help="write the counts here")
    ap.add_argument("--time", action="store_true", help="also time each layout on the GPU (3072 programs x 128 tiles)")
    args = ap.parse_args(argv)
    sig = {"K": "*bf16", "V": "*bf16", "Q": "*bf16", "DO": "*bf16", "TVEC": "*fp32", "SVEC": "*fp32", "MIDS": "*fp32",
           "A_OUT": "*fp32", "C_OUT": "*fp32", "DQ_OUT": "*fp32", "nJ": "i32", "sl2": "fp32", "bl2": "fp32",
           "WN": "constexpr", "num_warps": "constexpr"}
    rows = []
    for wn, cap in LAYOUTS:
        warps = 4 * wn
        src = GluonASTSource(fn=fast_tiles, signature=sig, constexprs={"WN": wn, "num_warps": warps},
                             attrs={(i,): [["tt.divisibility", 16]] for i in range(10)})
        options = {"num_warps": warps, "num_stages": 1, **({"maxnreg": cap} if cap else {})}
        k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
        regs, st, ld = kernel_offline.ptxas_usage(k.asm["ptx"])
        loop = kernel_offline.sass_loops(kernel_offline.sass_text(k.asm["cubin"]))[0]
        rows.append({"warps": warps, "warps_per_cta": [4, wn], "maxnreg": cap, "registers": regs,
                     "spill_store_bytes": st, "spill_load_bytes": ld,
                     "loop": {key: loop[key] for key in ("instructions", "mufu", "bar", "local", "hgmma", "mix")}})
        print(f"warps {warps} [4, {wn}], cap {cap}: {regs} registers, spills {st}/{ld} B; loop {loop['instructions']} "
              f"instructions a warp a tile ({loop['instructions'] * warps} a tile), MUFU {loop['mufu']}, "
              f"BAR {loop['bar']}, local {loop['local']}", flush=True)
    timed = time_layouts(3072, 128) if args.time else None
    if args.json:
        args.json.write_text(json.dumps({"triton": triton.__version__, "target": "sm_90a", "layouts": rows,
                                         "timed": timed}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
