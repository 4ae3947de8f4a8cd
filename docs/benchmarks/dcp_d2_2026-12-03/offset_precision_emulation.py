"""How much of the dcp_fused candidate's bf16 offset-gradient error at 1 x 4096 (GPU test, 2.81 against a
float64 value of -740.33; PyTorch's bf16 error 0.33) could tf32 operands in the kernel's in-tile triangular sums
explain? float64 emulation on the CPU of the kernel's structure: R = reverse cumulative sum over queries of the
heads' dS, doffset = sum of g * R over pairs; the in-tile strict suffix (backward) or prefix (forward bias) sums
take rounded operands, everything else is exact; then the forward's and the backward's biases rounded with different
tiles (P in the backward no longer matching the forward's log-sum-exp), and Δ = rowsum(dO·O) from a rounded O.
Inputs are the test's (seed 26, bf16-rounded).
usage: python emul.py [T]   (run with the candidate's tree on PYTHONPATH: fpa_lightning.ops.dcp.naive)"""
import math, sys, time, torch
from fpa_lightning.ops.dcp.naive import dcp_attention_naive, log_keep_rows
B, T, H, D, r = 1, int(sys.argv[1]) if len(sys.argv) > 1 else 4096, 4, 64, 32
gen = torch.Generator().manual_seed(26)
q, k, v, do = (torch.randn(B, T, H, D, generator=gen, dtype=torch.float64) for _ in range(4))
qi, ki = (torch.randn(B, T, r, generator=gen, dtype=torch.float64) * 0.5 for _ in range(2))
off = torch.tensor(0.6, dtype=torch.float64)
def bf(x): return x.to(torch.bfloat16).double()
q, k, v, qi, ki, do = map(bf, (q, k, v, qi, ki, do))   # the test's rounded inputs (exact_on_rounded)
t0 = time.time()
offr = off.clone().requires_grad_()
out = dcp_attention_naive(q, k, v, qi, ki, offr)
out.backward(do)
print(f"float64 doffset {offr.grad.item():.6f}  ({time.time()-t0:.0f} s)")
# kernel-structured emulation: per-head dS, R = reverse cumulative sum over queries, g = d log keep / dz
L = log_keep_rows(qi, ki, off, 0, T)[0]                          # (T', S), zero where s >= t'
z = (qi[0] @ ki[0].T) / math.sqrt(r) + off
x = (z + 1) / 2
g = torch.where((x >= 1e-30) & (x <= 1), 1 / (2 * x), torch.zeros_like(x))
live = torch.ones(T, T, dtype=torch.bool).tril(-1)               # s < t'
g = torch.where(live, g, torch.zeros_like(g))
bias = L.cumsum(0).masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
scale = 1 / math.sqrt(D)
dS = []
for h in range(H):
    s = q[0, :, h] @ k[0, :, h].T * scale + bias
    P = torch.softmax(s, -1)
    dP = do[0, :, h] @ v[0, :, h].T
    dS.append(P * (dP - (P * dP).sum(-1, keepdim=True)))
def doffset(rows):  # rows: list of per-head (T, S) dS as used in the suffix sums; exact dS elsewhere
    R = sum(dS).flip(0).cumsum(0).flip(0)                          # Σ_{t ≥ t'} Σ_h dS
    err = torch.zeros_like(R)
    BT = 32
    for h in range(H):
        e = rows[h] - dS[h]                                         # rounding of each operand
        # strict in-tile suffix: Σ_{t > t', same BT-tile} e[t, s]
        et = e.view(T // BT, BT, T)
        suffix = et.flip(1).cumsum(1).flip(1) - et
        err += suffix.reshape(T, T)
    return ((R + err) * g).sum().item()
def tf32_trunc(x):
    x32 = x.float().contiguous(); i = x32.view(torch.int32) & ~((1 << 13) - 1); return i.view(torch.float32).double()
def tf32_rne(x):
    x32 = x.float().contiguous(); i = x32.view(torch.int32).long()
    i = (i + (1 << 12) - 1 + ((i >> 13) & 1)) & ~((1 << 13) - 1)
    return i.to(torch.int32).view(torch.float32).double()
exact = doffset(dS)
print(f"emulated exact     {exact:.6f}")
print(f"fp32 operands      {doffset([d.float().double() for d in dS]):.6f}")
print(f"tf32 truncation    {doffset([tf32_trunc(d) for d in dS]):.6f}")
print(f"tf32 round-nearest {doffset([tf32_rne(d) for d in dS]):.6f}")
print(f"bf16 operands      {doffset([d.to(torch.bfloat16).double() for d in dS]):.6f}")
def with_bias_error(round_fn, BT):
    e = round_fn(L) - L                                             # (T', S)
    et = e.view(T // BT, BT, T)
    prefix = (et.cumsum(1) - et).reshape(T, T)                      # strict in-tile prefix over queries
    b2 = bias + prefix
    R = torch.zeros(T, T, dtype=torch.float64)
    for h in range(H):
        s = q[0, :, h] @ k[0, :, h].T * scale + b2
        P = torch.softmax(s, -1)
        dP = do[0, :, h] @ v[0, :, h].T
        R += P * (dP - (P * dP).sum(-1, keepdim=True))
    R = R.flip(0).cumsum(0).flip(0)
    return (R * g).sum().item()
for BT in (32, 64):
    print(f"bias prefix tf32 trunc, BT={BT}: {with_bias_error(tf32_trunc, BT):.6f}   rne: {with_bias_error(tf32_rne, BT):.6f}")
def prefix_err(round_fn, BT):
    e = round_fn(L) - L
    et = e.view(T // BT, BT, T)
    return (et.cumsum(1) - et).reshape(T, T)
def inconsistent(round_fn, bt_fwd, bt_bwd):
    """lse and O from the forward's bias (tiles of bt_fwd), P in the backward from its own bias (tiles of bt_bwd)."""
    b_f, b_b = bias + prefix_err(round_fn, bt_fwd), bias + prefix_err(round_fn, bt_bwd)
    R = torch.zeros(T, T, dtype=torch.float64)
    for h in range(H):
        qk = q[0, :, h] @ k[0, :, h].T * scale
        s_f = qk + b_f
        lse = torch.logsumexp(s_f, -1, keepdim=True)
        O = torch.exp(s_f - lse) @ v[0, :, h]
        delta = (do[0, :, h] * O).sum(-1, keepdim=True)
        P = torch.exp(qk + b_b - lse)
        dP = do[0, :, h] @ v[0, :, h].T
        R += P * (dP - delta)
    R = R.flip(0).cumsum(0).flip(0)
    return (R * g).sum().item()
for name, fn in (("trunc", tf32_trunc), ("rne", tf32_rne)):
    print(f"{name}: forward tiles 64, backward 32: {inconsistent(fn, 64, 32):.6f};  both 64: {inconsistent(fn, 64, 64):.6f}")
def with_rounded_o(round_fn):
    R = torch.zeros(T, T, dtype=torch.float64)
    for h in range(H):
        s = q[0, :, h] @ k[0, :, h].T * scale + bias
        P = torch.softmax(s, -1)
        O = round_fn(P @ v[0, :, h])
        delta = (do[0, :, h] * O).sum(-1, keepdim=True)
        dP = do[0, :, h] @ v[0, :, h].T
        R += P * (dP - delta)
    R = R.flip(0).cumsum(0).flip(0)
    return (R * g).sum().item()
print(f"Δ from bf16 O: {with_rounded_o(lambda x: x.to(torch.bfloat16).double()):.6f}")
print(f"Δ from fp16 O: {with_rounded_o(lambda x: x.to(torch.float16).double()):.6f}")
print(f"Δ from fp32 O: {with_rounded_o(lambda x: x.float().double()):.6f}")
