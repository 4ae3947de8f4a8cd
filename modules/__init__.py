"""Lightning modules: the training logic around ``fpa_lightning.Decoder``."""
from modules.language_model import LanguageModel, OptimConfig

__all__ = ["LanguageModel", "OptimConfig"]
