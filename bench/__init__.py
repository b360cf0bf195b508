"""ovtrio's benchmarks: `python -m bench <scenario>` runs one and writes its result to
bench/results/; `python -m bench report` writes the docs' tables from those results."""
