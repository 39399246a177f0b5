"""Step-Audio2 token2wav (MiniCPM-o 4.5, Step-Audio-2-mini) on the engine."""
