"""Where a short document's real-eviction time goes: cached_token_losses (cache_prune --real-eviction's path, default
pieces) on `rows` random documents of L + 1 ids per call, for each rows given; prints ms per call, ms and tokens/s
per document, then for the first and last rows a profile: kernel time (CUDA kernels only), kernel count, the top
kernels and the top host ops.   python evict_rows.py CKPT L ROWS..."""
import sys, time, torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile
from fpa_lightning.evaluation.checkpoint import load_decoder
from fpa_lightning.generation.rule import PruneRule
from fpa_lightning.generation.session import cached_token_losses

dec = load_decoder(sys.argv[1], torch.device("cuda")).decoder
L, all_rows = int(sys.argv[2]), [int(r) for r in sys.argv[3:]]
rule = PruneRule(threshold=-10.0)


def call(ids):
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        out = cached_token_losses(dec, ids, rule)
    torch.cuda.synchronize()
    return out


for rows in all_rows:
    ids = torch.randint(3, dec.cfg.vocab_size, (rows, L + 1), device="cuda")
    call(ids)
    times = []
    for _ in range(5):
        t = time.perf_counter(); call(ids); times.append(time.perf_counter() - t)
    ms = sorted(times)[2] * 1e3
    print(f"L {L} rows {rows}: {ms:.1f} ms per call (median of 5), {ms / rows:.1f} ms per document, "
          f"{rows * L / ms * 1e3 / 1e3:.1f}k tokens/s; all {[round(x * 1e3, 1) for x in times]}", flush=True)
    if rows not in (all_rows[0], all_rows[-1]):
        continue
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        call(ids)
    kernels = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    busy = sum(e.time_range.elapsed_us() for e in kernels) / 1e3
    print(f"  profile rows {rows}: {len(kernels)} kernels, {busy:.1f} ms of kernel time")
    per = {}
    for e in kernels:
        n, t = per.get(e.name, (0, 0.0)); per[e.name] = (n + 1, t + e.time_range.elapsed_us() / 1e3)
    for name, (n, t) in sorted(per.items(), key=lambda kv: -kv[1][1])[:12]:
        print(f"    {t:8.2f} ms {n:6d}x  {name[:100]}")
    cpu = sorted(((e.key, e.cpu_time_total / 1e3, e.count) for e in prof.key_averages()
                  if e.cpu_time_total > 0 and (e.key.startswith("aten::") or e.key.startswith("cuda"))),
                 key=lambda r: -r[1])
    for k, t_ms, n in cpu[:14]:
        print(f"    host {t_ms:8.1f} ms {n:6d}x  {k[:70]}")
