"""Aten ops per phase of one cached_token_losses call (cache_prune --real-eviction's path) on a random 12-layer FPA
decoder of head dim 16, 200 tokens, threshold -10, attention_impl "fused" (CPU, Triton's interpreter): a proxy of the
host's kernel launches on a GPU. Views (no kernel) are left out; "triton" is the interpreter's own work for the
piece kernel, one launch per layer on a GPU. From the repository root:
    TRITON_INTERPRET=1 PYTHONPATH=. python docs/benchmarks/evict_batch_2026-12-04/count_ops.py
(ROWS=4 for four documents per call). Phases missing from a tree are simply not counted apart."""
import collections, os, sys, torch
from torch.utils._python_dispatch import TorchDispatchMode
sys.path.insert(0, "tests/generation"); sys.path.insert(0, "tests")
from fpa_lightning.config import ModelConfig
from fpa_lightning.model import Decoder
from fpa_lightning.generation.rule import PruneRule
import fpa_lightning.generation.session as S

PHASE = ["other"]
VIEWS = {"view", "unsqueeze", "transpose", "select", "permute", "t", "alias", "expand", "slice", "_unsafe_view",
         "split", "squeeze", "unbind", "as_strided", "detach", "_reshape_alias", "reshape", "flatten", "unflatten",
         "promote_types", "result_type", "is_same_size", "sym_size", "sym_stride", "size", "stride"}
counts = collections.Counter(); names = collections.defaultdict(collections.Counter)
class Count(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket.__name__)
        if name not in VIEWS:
            counts[PHASE[-1]] += 1; names[PHASE[-1]][name] += 1
        return func(*args, **(kwargs or {}))

def phase(name, fn):
    def wrapped(*a, **k):
        PHASE.append(name)
        try: return fn(*a, **k)
        finally: PHASE.pop()
    return wrapped

import triton.runtime.interpreter as I
I.GridExecutor.__call__ = phase("triton", I.GridExecutor.__call__)  # the interpreter's own ops: one launch on a GPU
import fpa_lightning.attention.backends as BK
BK.FpaBackend.decode_prefill_state = phase("prefill_state", BK.FpaBackend.decode_prefill_state)
BK.FpaBackend._advance_fields = phase("advance", BK.FpaBackend._advance_fields)
import fpa_lightning.ops.fpa_piece.fused as PF
PF.range_min_table = phase("rmq", PF.range_min_table)
S._assemble = phase("assemble", S._assemble)
import fpa_lightning.generation.rule as RU
RU.PruningHook.__call__ = phase("hook", RU.PruningHook.__call__)
import fpa_lightning.attention.base as BA
BA.AttentionBackend.__call__ = phase("backend_fwd", BA.AttentionBackend.__call__)
S.KeptCounter.add = phase("counter", S.KeptCounter.add)
S.DecodeSession.prefill = phase("prefill", S.DecodeSession.prefill)
if hasattr(S.DecodeSession, "begin"):
    S.DecodeSession.begin = phase("begin", S.DecodeSession.begin)
S.DecodeSession.reserve = phase("reserve", S.DecodeSession.reserve)
S.DecodeSession._attend = phase("attend", S.DecodeSession._attend)
S.DecodeSession.stats = phase("stats", S.DecodeSession.stats)
S._next_token_losses = phase("loss", S._next_token_losses)
S.DecodeSession.__init__ = phase("init", S.DecodeSession.__init__)
torch.manual_seed(0)
cfg = ModelConfig(vocab_size=512, n_layer=12, d_model=64, n_head=4, d_mlp=128, max_seq_len=512,
                  attention={"impl": "chunked", "block_size": 16, "backend": "fpa", "positional": "none"})
dec = Decoder(cfg).eval()
ids = torch.randint(3, 512, (int(os.environ.get("ROWS", 1)), 200))
rule = PruneRule(threshold=-10.0)
with torch.no_grad():
    S.cached_token_losses(dec, ids, rule, attention_impl="fused")
    with Count():
        losses, session = S.cached_token_losses(dec, ids, rule, attention_impl="fused")
        session.stats()
print(session.piece_attention_impl_used, "total", sum(counts.values()))
for k, v in counts.most_common():
    print(f"{k:8s} {v:5d}  ", ", ".join(f"{n}:{c}" for n, c in names[k].most_common(12)))
