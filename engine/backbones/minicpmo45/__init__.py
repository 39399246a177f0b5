"""MiniCPM-o 4.5 as a duplex backbone: streaming audio encoder -> Qwen3 LLM -> TTS (-> Step-Audio2 tail)."""
from .backbone import MiniCPMO45Backbone
from .dims import PRESETS, Dims, preset

__all__ = ["MiniCPMO45Backbone", "PRESETS", "Dims", "preset"]
