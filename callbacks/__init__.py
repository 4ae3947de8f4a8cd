"""Lightning callbacks: head survival statistics and long-context loss, logged to TensorBoard (README, "Head statistics")."""
from callbacks.head_survival import HeadSurvivalCallback
from callbacks.long_context import LongContextLossCallback

__all__ = ["HeadSurvivalCallback", "LongContextLossCallback"]
