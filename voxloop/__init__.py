"""voxloop: local, real-time voice chat (VAD -> ASR -> LLM -> TTS over one WebSocket)."""

__version__ = "0.1.0"
