"""OpenVINO models built from GGUF files of the architectures the engine's own GGUF
reader does not build (it builds llama, qwen2 and qwen3): one module per architecture
over shared graph blocks (graph.py), the file's quantized weights kept compressed
(weights.py), the tokenizer rebuilt from the file's vocabulary (tokenizer.py), written
as an IR folder (folder.py) in a process of its own (child.py) and kept in the model
cache (cached.py)."""

# The architectures folder.ARCHITECTURES builds, named here so that checking a file
# needs no OpenVINO import.
BUILT_ARCHITECTURES = frozenset(
    {"gemma2", "gemma3", "gpt-oss", "granite", "mistral3", "olmo2", "phi3", "qwen2moe", "qwen3moe", "smollm3"}
)
