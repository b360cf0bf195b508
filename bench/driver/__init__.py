"""What every scenario shares: starting a server and waiting until it is ready
(server.py), the streamed-chat load and its prompts (requests.py), the bare engine it is
measured against (engine.py), percentiles (stats.py), the machine's fingerprint
(hardware.py) and the result files (results.py)."""
