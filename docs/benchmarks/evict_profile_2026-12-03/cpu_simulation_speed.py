"""cache_prune's masking simulation on the CPU: token_losses under pruned_cache (threshold -10, 512-row blocks) on one
random 4096-token document, best of 3. usage: python cpu_simulation_speed.py CKPT (run once on each tree of an A/B)."""
import sys
import time

import torch

from fpa_lightning.analysis.pruning import pruned_cache
from fpa_lightning.evaluation.checkpoint import load_decoder
from fpa_lightning.evaluation.scoring import Runtime, token_losses
from fpa_lightning.generation.rule import PruneRule

torch.manual_seed(0)
m = load_decoder(sys.argv[1], torch.device("cpu"))
ids = torch.randint(3, m.decoder.cfg.vocab_size, (1, 4097))
runtime = Runtime(torch.device("cpu"), "32", 0, 100, 0.95)
times = []
for _ in range(3):
    start = time.perf_counter()
    with pruned_cache(m.decoder, PruneRule(threshold=-10.0), 512) as stats:
        losses = token_losses(m.decoder, ids, runtime)
    times.append(time.perf_counter() - start)
print(f"simulation: best {min(times):.3f} s ({4096 / min(times):.0f} tok/s), kept {stats.mean_fraction():.3f}, "
      f"loss {float(losses.mean()):.6f}")
