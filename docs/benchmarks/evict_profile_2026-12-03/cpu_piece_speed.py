"""Scoring with real eviction on the CPU: cached_token_losses on one random 4096-token document at threshold -10,
best of 3 per piece size. usage: python cpu_piece_speed.py CKPT (run once on each tree of an A/B)."""
import time, torch, sys
from fpa_lightning.evaluation.checkpoint import load_decoder
from fpa_lightning.generation.rule import PruneRule
from fpa_lightning.generation.session import cached_token_losses
torch.manual_seed(0)
m = load_decoder(sys.argv[1], torch.device("cpu"))
ids = torch.randint(3, m.decoder.cfg.vocab_size, (1, 4097))
for piece in (512, 2048):
    ts = []
    for _ in range(3):
        t = time.perf_counter(); losses, s = cached_token_losses(m.decoder, ids, PruneRule(threshold=-10.0), piece=piece); ts.append(time.perf_counter() - t)
    print(f"piece {piece}: best {min(ts):.3f} s ({4096/min(ts):.0f} tok/s), kept {s.stats()['kept_per_query']['kept_fraction']:.3f}, loss {float(losses.mean()):.6f}")
