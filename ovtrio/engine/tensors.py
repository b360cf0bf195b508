"""Token ids as the engine takes them."""

from __future__ import annotations

from typing import Any

import numpy as np


def prompt_tensor(prompt_ids: list[int]) -> Any:
    """A prompt as the engine takes it: a [1, n] tensor of int64 token ids."""
    import openvino as ov

    return ov.Tensor(np.asarray([prompt_ids], dtype=np.int64))
