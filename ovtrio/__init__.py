"""ovtrio: an OpenAI-compatible LLM server on Trio and OpenVINO GenAI."""

__version__ = "0.1.0"
