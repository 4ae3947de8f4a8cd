"""Hugging Face interop (needs the ``hf`` extra: ``pip install -e ".[hf]"``). Importing this package registers the
``fpa_lightning`` model type with ``AutoConfig`` and ``AutoModelForCausalLM``; the rest of the library imports it
only for ``eval.py export``.

``FPAConfig`` (the ``ModelConfig``), ``FPAForCausalLM`` (the ``Decoder``), ``FPACache`` (the KV cache behind
``generate``); ``remote.write_remote_code`` makes a saved folder loadable with ``trust_remote_code=True`` where this
package is not installed; ``save_export.save_export`` writes the folder of ``eval.py export`` (docs/hf.md).
"""
from transformers import AutoConfig, AutoModelForCausalLM

from fpa_lightning.export import MODEL_TYPE
from fpa_lightning.hf.cache import FPACache
from fpa_lightning.hf.config import FPAConfig
from fpa_lightning.hf.modeling import FPAForCausalLM

AutoConfig.register(MODEL_TYPE, FPAConfig, exist_ok=True)
AutoModelForCausalLM.register(FPAConfig, FPAForCausalLM, exist_ok=True)

__all__ = ["FPACache", "FPAConfig", "FPAForCausalLM"]
