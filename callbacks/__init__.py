"""Lightning callbacks: head survival statistics and long-context loss, logged to TensorBoard (README_SNIPPET.md)."""
from callbacks.head_survival import HeadSurvivalCallback
from callbacks.long_context import LongContextLossCallback

__all__ = ["HeadSurvivalCallback", "LongContextLossCallback"]
