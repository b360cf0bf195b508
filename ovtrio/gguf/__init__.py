"""The GGUF file: its header read without trusting it (header.py), its tensors rewritten
into types the engine reads (convert.py, targets.py), what the engine builds from it kept
on disk (cache.py, engine_file.py), and the OpenVINO models ovtrio builds from files of
architectures the engine's own reader lacks (builder/), in a child process whose log
records reach the server's (child_log.py)."""
