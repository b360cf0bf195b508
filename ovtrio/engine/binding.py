"""The engine's Python binding, made safe to use from several threads at once.

OpenVINO's binding builds two tables lazily, in function-local statics, the first time
any thread turns engine data into a numpy array (`Tensor.data`, `Constant.get_data()`):
pybind11's table of numpy's C API (its initializer imports a numpy module, running
Python code that lets go of the GIL) and the element-type-to-dtype map. A second
thread that arrives meanwhile waits on the static's guard while holding the GIL, and
the first can never take the GIL back to finish: the process freezes (a load's two
threads stuck, in ovtrio/text/vocabulary.py and ovtrio/text/plain_text.py; how often:
docs/benchmarks.md#loading-a-model). Building both tables once, on one thread, before a
second one touches the binding, removes the race.
"""

from __future__ import annotations

import threading

_ready = threading.Event()


def prepare_binding() -> None:
    """Import the engine's library and build the binding's lazy tables, in the calling
    thread. Call it before starting a second thread that uses the engine; cheap after
    the first call."""
    if _ready.is_set():
        return
    import numpy as np
    import openvino as ov
    import openvino_genai  # noqa: F401 (its import holds the GIL: done here too, once)

    ov.Tensor(np.zeros(1, dtype=np.int64)).data  # noqa: B018 (reading it builds the tables)
    _ready.set()
