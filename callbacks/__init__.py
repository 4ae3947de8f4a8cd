"""Lightning callbacks: head survival statistics and long-context loss, logged to TensorBoard (docs/observability.md), and the JSONL writer of ``train.py predict`` (docs/generation.md)."""
from callbacks.generation_writer import GenerationWriter
from callbacks.head_survival import HeadSurvivalCallback
from callbacks.long_context import LongContextLossCallback
from callbacks.throughput import ThroughputCallback

__all__ = ["GenerationWriter", "HeadSurvivalCallback", "LongContextLossCallback", "ThroughputCallback"]
