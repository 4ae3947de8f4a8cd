import os, sys, hashlib, itertools, json
os.environ.pop("TRITON_INTERPRET", None)
os.environ["TRITON_DISABLE_LINE_INFO"] = "1"
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from fpa_lightning.ops.decode_step import kernels as SK
from fpa_lightning.ops.decode import kernels as DK
target = GPUTarget("cuda", 90, 32)
def sig_of(fn, ptr, consts):
    return {n: ("constexpr" if n in consts else ptr.get(n, "fp32" if n in ("scale", "threshold") else "i32")) for n in fn.arg_names}
out = {}
for dt in ("bf16", "fp32"):
    for fpa, evict, block, warps in itertools.product([0, 1], [0, 1], [64, 128], [4, 8]):
        if evict and not fpa: continue
        consts = dict(D=64, BLOCK_S=block, FPA=fpa, EVICT=evict)
        ptr = {"Q": f"*{dt}", "K": f"*{dt}", "V": f"*{dt}", "KP": "*i32", "POS": "*i64", "PMIN": "*fp32", "LEVEL": "*fp32",
               "PHI": "*fp32", "BETA_RAW": "*fp32", "M": "*fp32", "L": "*fp32", "ACC": "*fp32"}
        fn = SK._step_attn_partial_kernel
        k = triton.compile(ASTSource(fn, sig_of(fn, ptr, consts), consts), target=target, options={"num_warps": warps, "num_stages": 2})
        out[f"step/{dt}/{fpa}{evict}/{block}/{warps}"] = hashlib.sha256(k.asm["ptx"].encode()).hexdigest()[:16]
    for bias, block, warps in itertools.product([0, 1], [64, 128], [4, 8]):
        consts = dict(D=64, BLOCK_S=block, HAS_BIAS=bias)
        ptr = {"Q": f"*{dt}", "K": f"*{dt}", "V": f"*{dt}", "BIAS": "*fp32", "VIS": "*i1", "M": "*fp32", "L": "*fp32", "ACC": "*fp32"}
        fn = DK._decode_attn_partial_kernel
        k = triton.compile(ASTSource(fn, sig_of(fn, ptr, consts), consts), target=target, options={"num_warps": warps, "num_stages": 2})
        out[f"decode/{dt}/{bias}/{block}/{warps}"] = hashlib.sha256(k.asm["ptx"].encode()).hexdigest()[:16]
json.dump(out, open(sys.argv[1], "w"), indent=1); print(len(out), "builds")
