"""Per-kernel profile of cached_token_losses (cache_prune --real-eviction's path) on one 8192-token random doc."""
import sys, time, torch
from torch.profiler import ProfilerActivity, profile
from fpa_lightning.evaluation.checkpoint import load_decoder
from fpa_lightning.generation.rule import PruneRule
from fpa_lightning.generation.session import cached_token_losses
m = load_decoder(sys.argv[1], torch.device("cuda"))
dec = m.decoder
ids = torch.randint(3, dec.cfg.vocab_size, (1, 8193), device="cuda")
rule = PruneRule(threshold=-10.0)
for piece in [int(p) for p in sys.argv[2:]] or [512, 2048]:  # pieces: the arguments after the checkpoint
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        cached_token_losses(dec, ids, rule, piece=piece); torch.cuda.synchronize()
        t = time.perf_counter(); cached_token_losses(dec, ids, rule, piece=piece); torch.cuda.synchronize()
        wall = time.perf_counter() - t
        with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
            cached_token_losses(dec, ids, rule, piece=piece); torch.cuda.synchronize()
    ev = prof.key_averages()
    cuda = sorted(((e.key, e.device_time_total / 1e3, e.count) for e in ev if e.device_time_total > 0), key=lambda r: -r[1])
    total = sum(r[1] for r in cuda)
    print(f"piece {piece}: wall {wall*1e3:.0f} ms, CUDA kernel time {total:.0f} ms")
    for k, t_ms, n in cuda[:14]:
        print(f"   {t_ms:8.1f} ms  {n:6d}x  {k[:90]}")
    cpu = sorted(((e.key, e.cpu_time_total / 1e3, e.count) for e in ev if e.cpu_time_total > 0 and e.key.startswith("aten::")), key=lambda r: -r[1])
    for k, t_ms, n in cpu[:8]:
        print(f"   cpu {t_ms:8.1f} ms  {n:6d}x  {k[:60]}")
