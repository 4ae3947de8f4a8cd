"""Compile every kernel of the Selective and DCP ops for sm_90a offline and write, per build, the TTGIR (locations
stripped), PTX and SASS, plus an index. Run with PYTHONPATH pointing at the tree to compile.

    python offline_builds.py OUTDIR
"""
from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import sys
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from fpa_lightning.ops.selective import kernels as sel  # noqa: E402
from fpa_lightning.ops.dcp import kernels as dcp  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
import kernel_offline as ko  # noqa: E402 (its stride rule and SASS listing)

T, H, G = 16384, 12, 3  # 1 x 16384, 12 heads, 3 head groups (the H200's choice at this size)
HPG = H // G
DT = {"bf16": "*bf16", "fp16": "*fp16", "fp32": "*fp32"}
QKV = {"Q", "K", "V", "O", "DO", "DQ", "DK", "DV"}
INTER = {"QI", "KI"}
I32P = {"SEGP", "JLO", "IHI"}
I8P = {"KEEP"}
FLOATS = {"scale", "rs"}


def value(name, D, R, nT, nJ):
    if name in ("s_ib", "s_jb"):
        return T * R
    if name in ("s_it", "s_jt"):
        return R
    stride = ko.stride_value(name, T, H, D)
    return stride if stride is not None else {"T": T, "H": H, "Tp": T, "nT": nT, "nJ": nJ, "HPG": HPG}[name]


def signature(fn, constexprs, qkv, inter, D, R, nT, nJ):
    sig, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in constexprs:
            sig[name] = "constexpr"
        elif name in FLOATS:
            sig[name] = "fp32"
        elif name[0].islower() or name in ("T", "H", "Tp", "nT", "nJ", "HPG"):
            sig[name] = "i32"
            if value(name, D, R, nT, nJ) % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            sig[name] = (DT[qkv] if name in QKV else DT[inter] if name in INTER else "*i32" if name in I32P
                         else "*i8" if name in I8P else "*fp32")
            attrs[(i,)] = [["tt.divisibility", 16]]
    return sig, attrs


def strip_locs(ir):
    out = []
    for line in ir.splitlines():
        if line.startswith("#loc"):
            continue
        out.append(re.sub(r"\s*loc\((#loc\d*|\"[^\"]*\"[^)]*|[^)]*)\)", "", line))
    return "\n".join(out) + "\n"


def sel_builds(tiles, qkvs, Ds, dots, segs, fw, prefix, kernels=("carry_fwd", "fwd", "carry_bwd", "bwd_kv", "bwd_q")):
    (BM, BN), (BT, BNb, BMb) = tiles
    out = []
    for qkv, seg, dot, D in itertools.product(qkvs, segs, dots, Ds):
        prec = "ieee" if qkv == "fp32" else "tf32"
        bw = 8 if D >= 128 else 4
        cx = {"D": D, "PREC": prec, "SEG": seg}
        tag = f"{prefix}/{qkv}/seg{int(seg)}/dot{int(dot)}/D{D}"
        w4 = {"num_warps": 4, "num_stages": 2}
        if "carry_fwd" in kernels and dot:  # the carry kernel has no DOT
            out.append((f"sel/carry_fwd/{tag}", sel._sel_carry_kernel, dict(cx, BT=BM, BN=BN, QM=BM),
                        qkv, qkv, D, 0, T // BM, T // BN, w4))
        if "fwd" in kernels:
            out.append((f"sel/fwd/{tag}", sel._sel_fwd_kernel, dict(cx, BM=BM, BN=BN, RATIO=1, DOT=dot),
                        qkv, qkv, D, 0, T // BM, T // BN, {"num_warps": fw, "num_stages": 2}))
        if "carry_bwd" in kernels and dot:
            out.append((f"sel/carry_bwd/{tag}", sel._sel_carry_kernel, dict(cx, BT=BT, BN=BNb, QM=BMb),
                        qkv, qkv, D, 0, T // BT, T // BNb, w4))
        if "bwd_kv" in kernels:
            out.append((f"sel/bwd_kv/{tag}", sel._sel_bwd_kv_kernel, dict(cx, BT=BT, BN=BNb, DOT=dot),
                        qkv, qkv, D, 0, T // BT, T // BNb, {"num_warps": bw, "num_stages": 2}))
        if "bwd_q" in kernels:
            out.append((f"sel/bwd_q/{tag}", sel._sel_bwd_q_kernel, dict(cx, BM=BMb, BN=BNb, RATIO=BMb // BT, DOT=dot),
                        qkv, qkv, D, 0, T // BT, T // BNb, {"num_warps": bw, "num_stages": 2}))
    return out


DCP_DTYPES = (("bf16", "bf16"), ("bf16", "fp32"), ("fp16", "fp16"), ("fp16", "fp32"), ("fp32", "fp32"))
DCP_DR = tuple(sorted({(d, 32) for d in (16, 32, 64, 128)} | {(64, r) for r in (16, 32, 64, 128)}))


def dcp_builds(tiles, dtypes, DRs, dots, segs, bprec_ab, prefix, kernels=("carry_fwd", "fwd", "carry_bwd", "bwd_kv",
                                                                           "bwd_q")):
    (BM, BN), (BT, BNb, BMb) = tiles
    out = []
    for (qkv, inter), seg, dot, (D, R) in itertools.product(dtypes, segs, dots, DRs):
        prec = "ieee" if qkv == "fp32" else "tf32"
        bprec = "ieee" if qkv == "fp32" else ("tf32" if bprec_ab else "tf32x3")
        bw = 8 if D >= 128 else 4
        cx = {"D": D, "R": R, "PREC": prec, "BPREC": bprec, "DOT": dot, "SEG": seg}
        tag = f"{prefix}/{qkv}/{inter}/{bprec}/seg{int(seg)}/dot{int(dot)}/D{D}/R{R}"
        ctag = f"{prefix}/{qkv}/{inter}/R{R}"
        w4 = {"num_warps": 4, "num_stages": 2}
        carry = (D == 64 or R != 32) and not seg and dot  # the carry kernel: no D, SEG, DOT, BPREC
        if "carry_fwd" in kernels and carry:
            out.append((f"dcp/carry_fwd/{ctag}", dcp._dcp_carry_kernel, {"BT": BM, "BN": BN, "QM": BM, "R": R,
                        "PREC": prec}, qkv, inter, D, R, T // BM, T // BN, w4))
        if "fwd" in kernels:
            out.append((f"dcp/fwd/{tag}", dcp._dcp_fwd_kernel, dict(cx, BM=BM, BN=BN, STORE32=qkv != "fp32"),
                        qkv, inter, D, R, T // BM, T // BN, w4))
        if "carry_bwd" in kernels and carry:
            out.append((f"dcp/carry_bwd/{ctag}", dcp._dcp_carry_kernel, {"BT": BT, "BN": BNb, "QM": BMb, "R": R,
                        "PREC": prec}, qkv, inter, D, R, T // BT, T // BNb, w4))
        if "bwd_kv" in kernels:
            out.append((f"dcp/bwd_kv/{tag}", dcp._dcp_bwd_kv_kernel, dict(cx, BT=BT, BN=BNb),
                        qkv, inter, D, R, T // BT, T // BNb, {"num_warps": bw, "num_stages": 2}))
        if "bwd_q" in kernels:
            out.append((f"dcp/bwd_q/{tag}", dcp._dcp_bwd_q_kernel, dict(cx, BM=BMb, BN=BNb, RATIO=BMb // BT),
                        qkv, inter, D, R, T // BT, T // BNb, {"num_warps": bw, "num_stages": 2}))
    return out


GPU_TILES = ((64, 64), (32, 64, 64))  # fused.tile_sizes on the GPU: fwd (BM, BN), bwd (BT, BN, BM)
TF = (True, False)


def builds():
    """(name, fn, constexprs, qkv dtype, interaction dtype, D, R, nT, nJ, launch): every kernel at the GPU's default
    tiles and launch (all dtypes, documents on/off, prefix dot/scan, every head dim D and width r); then the A/B
    variants of the check scripts at D = 64 (r = 32): backward tiles BT = 64, Selective's 128-row forward on 8 warps,
    DCP's bias sums in plain tf32."""
    out = sel_builds(GPU_TILES, ("bf16", "fp16", "fp32"), (16, 32, 64, 128), TF, TF, 4, "gpu")
    out += dcp_builds(GPU_TILES, DCP_DTYPES, DCP_DR, TF, TF, False, "gpu")
    out += sel_builds(((64, 64), (64, 64, 64)), ("bf16", "fp16", "fp32"), (64,), TF, TF, 4, "ab_bt64",
                      ("carry_bwd", "bwd_kv", "bwd_q"))
    out += sel_builds(((128, 64), (32, 64, 64)), ("bf16", "fp16", "fp32"), (64,), TF, TF, 8, "ab_fwd128",
                      ("carry_fwd", "fwd"))
    out += dcp_builds(((64, 64), (64, 64, 64)), DCP_DTYPES, ((64, 32),), TF, TF, False, "ab_bt64",
                      ("carry_bwd", "bwd_kv", "bwd_q"))
    out += dcp_builds(GPU_TILES, DCP_DTYPES[:4], ((64, 32),), TF, TF, True, "ab_tf32", ("fwd", "bwd_kv", "bwd_q"))
    return out


def compile_one(b):
    name, fn, cx, qkv, inter, D, R, nT, nJ, launch = b
    sig, attrs = signature(fn, cx, qkv, inter, D, R, nT, nJ)
    src = ASTSource(fn=fn, signature=sig, constexprs=cx, attrs=attrs)
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(launch))
    return {"ttgir": strip_locs(k.asm["ttgir"]), "ptx": k.asm["ptx"], "sass": ko.sass_text(k.asm["cubin"])}


def main():
    outdir = Path(sys.argv[1])
    only = sys.argv[2] if len(sys.argv) > 2 else ""
    shard = os.environ.get("SHARD")  # "i/n"
    todo = [b for b in builds() if only in b[0]]
    if shard:
        i, n = map(int, shard.split("/"))
        todo = todo[i::n]
    index = {}
    for b in todo:
        res = compile_one(b)
        d = outdir / b[0]
        d.mkdir(parents=True, exist_ok=True)
        for kind, text in res.items():
            (d / kind).write_text(text)
        index[b[0]] = {kind: hashlib.sha256(text.encode()).hexdigest()[:16] for kind, text in res.items()}
        print(b[0], index[b[0]], flush=True)
    (outdir / f"index{('_' + shard.replace('/', 'of')) if shard else ''}.json").write_text(json.dumps(index, indent=1))


if __name__ == "__main__":
    main()
