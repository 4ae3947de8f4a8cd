"""fpa-lightning: training and studying FPA (path-minimum forgetting attention) and its peers."""
from fpa_lightning.attention.config import AttentionConfig
from fpa_lightning.config import ModelConfig
from fpa_lightning.model import Decoder

__all__ = ["AttentionConfig", "Decoder", "ModelConfig"]
__version__ = "0.1.0"
