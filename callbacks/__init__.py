"""Lightning callbacks: head survival statistics and long-context loss, logged to every attached logger (docs/observability.md), the checkpoint on preemption (docs/training.md), and the JSONL writer of ``train.py predict`` (docs/generation.md)."""
from callbacks.generation_writer import GenerationWriter
from callbacks.head_survival import HeadSurvivalCallback
from callbacks.long_context import LongContextLossCallback
from callbacks.preemption import PreemptionCheckpoint, Preempted
from callbacks.throughput import ThroughputCallback

__all__ = ["GenerationWriter", "HeadSurvivalCallback", "LongContextLossCallback", "PreemptionCheckpoint", "Preempted",
           "ThroughputCallback"]
