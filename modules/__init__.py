"""The application layer: what trains, evaluates and probes models. The Lightning module of training
(``LanguageModel``, ``OptimConfig``, guards, checkpoint I/O, scaling), the evaluation application of ``eval.py``
(``modules.evaluation``) and the probe table's (``modules.probes``), all built on the library ``fpa_lightning``."""
from modules.language_model import LanguageModel, OptimConfig

__all__ = ["LanguageModel", "OptimConfig"]
