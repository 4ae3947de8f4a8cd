"""Offline compile statistics of the fused FPA kernels: registers, spills and SASS loop counts, no GPU needed.

    python benchmarks/kernel_offline.py [--variants dense,skip,query,dipsum,segments] [--D 64] [--dtype bf16]
        [--sass DIR] [--mix]

Each kernel is compiled for sm_90a (H100/H200) with the launch configuration and constexprs that `fused.py`
would use for 1×16384, H = 12, and reported as: registers per thread, spill stores/loads (bytes, from `ptxas -v`),
and for every loop of the SASS (the range of a backward branch): instructions per warp per iteration, MUFU
(special functions), BAR (barriers), local-memory ops (spill traffic) and HGMMA (tensor-core) instructions;
`--mix` adds each loop's instruction mix by unit (FP32, MUFU, tensor cores, shuffles, shared and global
memory, barriers, conversions, other).
The GPU machine runs Triton 3.6, so run this with Triton 3.6 to compare with its SASS: e.g. a scratch venv,
`python3 -m venv /tmp/t36 && /tmp/t36/bin/pip install triton==3.6.0`, with the project's torch importable
(a .pth file that points at the main venv's site-packages). Numbers from different Triton versions are not
comparable (benchmarks/KERNEL_LOG.md). Nothing here is timed: a GPU A/B decides.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile
from pathlib import Path

if __name__ == "__main__":  # compiled, never interpreted; imported by a test, it leaves the environment alone
    os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from fpa_lightning.ops.fpa import fused, kernels  # noqa: E402
from fpa_lightning.ops.kernel_inputs import TRITON_OPTIONS  # noqa: E402

QKV_POINTERS = {"Q", "K", "V", "O", "DO", "DQ", "DK", "DV"}
INT_POINTERS = {"SEGP", "JLO", "IHI", "JKEEP"}
FLOAT_SCALARS = {"qk_scale", "threshold"}
INT_SCALARS = {"T", "H", "Tp", "nB"}


def stride_value(name: str, T: int, H: int, D: int) -> int | None:
    """A (B, T, H, D) tensor's stride named by the kernels' convention (s_<tensor>b, t or h) at batch 1, else None."""
    if re.fullmatch(r"s_\w+b", name):
        return T * H * D
    if re.fullmatch(r"s_\w+t", name):
        return H * D
    if re.fullmatch(r"s_\w+h", name):
        return D
    return None


def int_value(name: str, T: int, H: int, D: int, BS: int) -> int:
    """The runtime value of an integer argument at (1, T, H, D): Triton specialises integers divisible by 16
    (and pointers, all 16-byte aligned here), which changes the code, so the offline compile must do the same."""
    stride = stride_value(name, T, H, D)
    return stride if stride is not None else {"T": T, "H": H, "Tp": T, "nB": T // BS}[name]


def signature(fn, constexprs: dict, T: int, H: int, D: int, BS: int, qkv: str = "bf16") -> tuple[dict, dict]:
    """Triton types from the naming convention of kernels.py, and the divisibility attributes that a launch at
    (1, T, H, D) would give: upper-case names are pointers (q, k, v, o and their gradients of type `qkv`, segment
    tables int32, the rest fp32); lower-case names (and T, H, Tp, nB) are int32 scalars, except the scale and
    threshold."""
    sig, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in constexprs:
            sig[name] = "constexpr"
        elif name in FLOAT_SCALARS:
            sig[name] = "fp32"
        elif name in INT_SCALARS or name.startswith("s_"):
            sig[name] = "i32"
            if int_value(name, T, H, D, BS) % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            sig[name] = f"*{qkv}" if name in QKV_POINTERS else ("*i32" if name in INT_POINTERS else "*fp32")
            attrs[(i,)] = [["tt.divisibility", 16]]
    return sig, attrs


def compile_kernel(fn, constexprs: dict, launch: dict, D: int, T: int = 16384, H: int = 12, qkv: str = "bf16"):
    sig, attrs = signature(fn, constexprs, T, H, D, constexprs["BS"], qkv)
    src = ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs)
    opts = {"num_warps": launch.get("num_warps", 4), "num_stages": launch.get("num_stages", 2), **TRITON_OPTIONS}
    if "maxnreg" in launch:
        opts["maxnreg"] = launch["maxnreg"]
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts)


def ptxas_usage(ptx: str) -> tuple[int, int, int]:
    """(registers, spill store bytes, spill load bytes) from `ptxas -v` on the kernel's PTX (which carries any
    register cap as a .maxnreg directive)."""
    from triton.backends.nvidia.compiler import get_ptxas

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.ptx"
        path.write_text(ptx)
        cmd = [get_ptxas(90).path, "-v", "--gpu-name=sm_90a", str(path), "-o", str(path.with_suffix(".o"))]
        log = subprocess.run(cmd, capture_output=True, text=True, check=True).stderr
    regs = int(re.search(r"Used (\d+) registers", log).group(1))
    st, ld = map(int, re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log).groups())
    return regs, st, ld


def sass_text(cubin: bytes) -> str:
    from triton.backends.nvidia.compiler import get_ptxas

    nvdisasm = str(Path(get_ptxas(90).path).with_name("nvdisasm"))
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([nvdisasm, "-c", f.name], capture_output=True, text=True, check=True).stdout


def sass_loops(sass: str) -> list[dict]:
    """Every backward branch's range [target, branch] as a loop with its instruction mix, largest first."""
    instrs, labels, pending = [], {}, []  # (address, text); label -> index of the next instruction
    for line in sass.splitlines():
        label = re.match(r"\s*(\.L_x_\d+):", line)
        if label:
            pending.append(label.group(1))
            continue
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
        if m:
            for name in pending:
                labels[name] = len(instrs)
            pending = []
            instrs.append((int(m.group(1), 16), m.group(2)))
    loops = []
    for i, (_, text) in enumerate(instrs):
        m = re.search(r"\bBRA\b.*?(\.L_x_\d+)", text)
        start = labels.get(m.group(1)) if m else None
        if start is None or start >= i:
            continue
        body = [t for _, t in instrs[start: i + 1]]
        loops.append({
            "instructions": len(body),
            "mufu": sum("MUFU" in t for t in body),
            "bar": sum(re.search(r"\bBAR\b", t) is not None for t in body),
            "local": sum(re.search(r"\b(LDL|STL)\b", t) is not None for t in body),
            "hgmma": sum("HGMMA" in t for t in body),
            "mix": instruction_mix(body),
        })
    return sorted(loops, key=lambda r: -r["instructions"])


# What an instruction's opcode (before the first dot) spends: the FP32 pipe, the special-function unit, tensor
# cores, cross-lane shuffles, shared memory, global memory, barriers, conversions; anything else is "other"
# (integer and address arithmetic, moves, branches, uniform-datapath work).
MIX_CLASSES = {
    "fp32": {"FADD", "FMUL", "FFMA", "FMNMX", "FSEL", "FSETP", "FCHK"},
    "mufu": {"MUFU"},
    "hgmma": {"HGMMA", "WARPGROUP"},
    "shfl": {"SHFL"},
    "shared": {"LDS", "STS", "LDSM", "STSM"},
    "global": {"LDG", "STG", "LDGSTS", "LDGDEPBAR", "DEPBAR", "RED", "ATOM", "ATOMG", "REDG", "UBLKCP", "UTMALDG"},
    "bar": {"BAR", "SYNCS"},
    "convert": {"F2FP", "F2F", "F2I", "I2F"},
}


def instruction_mix(body: list[str]) -> dict[str, int]:
    """Counts of ``MIX_CLASSES`` over a loop's instructions (a guard predicate such as ``@!P0`` is skipped)."""
    mix = dict.fromkeys([*MIX_CLASSES, "other"], 0)
    for text in body:
        opcode = re.sub(r"^@!?U?P\w+\s+", "", text).split()[0].split(".")[0]
        mix[next((name for name, ops in MIX_CLASSES.items() if opcode in ops), "other")] += 1
    return mix


DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
"""--dtype: q, k, v's type, which sets the products' precision (fused._constexprs' PREC) and the pointers' type."""


def variant_kernels(variant: str, D: int, dtype: str = "bf16"):
    """[(name, kernel, constexprs, launch)] of one fused.py variant at 1×16384 (BS = 64 on the GPU)."""
    opts = {"dense": {}, "skip": {"skip": True}, "query": {"level": "query"}, "dipsum": {"reduction": "dipsum"},
            "segments": {"segments": True}}[variant]
    return fused.kernel_plan(D=D, dtype=DTYPES[dtype], **opts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", default="dense,skip")
    ap.add_argument("--D", type=int, default=64)
    ap.add_argument("--dtype", default="bf16", choices=DTYPES, help="q, k, v's type (fp32: the tf32x3 products)")
    ap.add_argument("--kernels", default="", help="comma-separated kernel names to keep (default: all)")
    ap.add_argument("--sass", default=None, help="write each kernel's SASS into this folder")
    ap.add_argument("--mix", action="store_true", help="then a second table: the instruction mix of each kernel's "
                    "loops (per warp per iteration)")
    args = ap.parse_args()
    mixes = []
    print(f"triton {triton.__version__}, sm_90a, D = {args.D}, {args.dtype}; loops: instructions / MUFU / BAR / LDL+STL / HGMMA "
          "per warp per iteration")
    print("| variant | kernel | launch | regs | spill st/ld B | loops (largest first) |")
    print("|---|---|---|---|---|---|")
    for variant in args.variants.split(","):
        for name, fn, constexprs, launch in variant_kernels(variant, args.D, args.dtype):
            if args.kernels and name not in args.kernels.split(","):
                continue
            compiled = compile_kernel(fn, constexprs, launch, args.D, qkv=args.dtype)
            regs, st, ld = ptxas_usage(compiled.asm["ptx"])
            sass = sass_text(compiled.asm["cubin"])
            if args.sass:
                Path(args.sass).mkdir(parents=True, exist_ok=True)
                Path(args.sass, f"{variant}_{name}.sass").write_text(sass)
            largest = sass_loops(sass)[:3]
            loops = "; ".join(f"{r['instructions']}/{r['mufu']}/{r['bar']}/{r['local']}/{r['hgmma']}" for r in largest)
            cfg = ",".join(f"{k.replace('num_', '')}={v}" for k, v in launch.items())
            print(f"| {variant} | {name} | {cfg} | {regs} | {st}/{ld} | {loops} |", flush=True)
            mixes += [(variant, name, loop) for loop in largest if loop["instructions"] >= MIX_MIN]
    if args.mix:
        print_mix(mixes)


MIX_MIN = 100
"""Loops shorter than this (set-up and epilogue walks) get no row of the mix table."""


def print_mix(mixes: list[tuple[str, str, dict]]) -> None:
    """The instruction mix of each kernel's loops of the first table (largest first), a row per loop."""
    names = [*MIX_CLASSES, "other"]
    print(f"\ninstruction mix of the loops above of at least {MIX_MIN} instructions, per warp per iteration")
    print("| variant | kernel | instructions | " + " | ".join(names) + " |")
    print("|---|---|---|" + "---|" * len(names))
    for variant, name, loop in mixes:
        print(f"| {variant} | {name} | {loop['instructions']} | " + " | ".join(str(loop["mix"][n]) for n in names) + " |")


if __name__ == "__main__":
    main()
