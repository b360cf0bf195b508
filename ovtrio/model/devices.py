"""Whether the OpenVINO devices a model is to run on exist on this machine.

Checked before anything loads, so that `--device GPU` on a machine without an Intel GPU
(or without its driver) stops startup with one line that says what OpenVINO does find,
instead of failing deep in the engine after the model was read (and, for a GGUF file,
taking the engine's error for a damaged cache entry).

The CPU device ships with every OpenVINO wheel, so a CPU-only configuration is not
checked at all and costs no startup time; other names cost one device query (most of
it importing OpenVINO, which loading does next anyway; see
docs/benchmarks.md#loading-a-model).
"""

from __future__ import annotations

import functools

from ovtrio.model.source import ModelLoadError

# Devices that pick or combine others: "AUTO", "AUTO:GPU,CPU", "HETERO:GPU,CPU", ...
_VIRTUAL = ("AUTO", "MULTI", "HETERO", "BATCH")

# What a device needs beyond the OpenVINO wheel, for the refusal's hint.
_DRIVERS = {
    "GPU": "an Intel GPU and its OpenCL runtime (intel-opencl-icd)",
    "NPU": "an Intel NPU and its driver (intel-level-zero-npu)",
}


def physical_devices(device: str) -> list[str]:
    """The concrete devices a device string names: "GPU.1" -> ["GPU.1"],
    "HETERO:GPU,CPU" -> ["GPU", "CPU"], "AUTO" -> [] (it uses whatever exists)."""
    kind, _, listed = device.partition(":")
    if kind.upper() in _VIRTUAL:
        return [name.split("(")[0].strip() for name in listed.split(",") if name.strip()]
    return [device.strip()]


def is_available(device: str, available: list[str]) -> bool:
    """`device` ("GPU", "GPU.0", "NPU") among OpenVINO's available devices; a bare type
    matches any of its numbered devices ("GPU" when OpenVINO lists "GPU.0", "GPU.1")."""
    device = device.upper()
    return any(
        device == found.upper() or ("." not in device and found.upper().split(".")[0] == device) for found in available
    )


@functools.cache
def available_devices() -> list[str]:
    """OpenVINO's devices on this machine, asked once per process: `ovtrio serve` checks
    each model before binding the port and the app checks it again at startup."""
    import openvino as ov

    return list(ov.Core().available_devices)


def check_device(device: str, setting: str = "device") -> None:
    """Raise ModelLoadError (one line) if `device` names a device this machine lacks."""
    wanted = [name for name in physical_devices(device) if name.upper() != "CPU"]
    if not wanted:
        return
    available = available_devices()
    for name in wanted:
        if not is_available(name, available):
            needs = _DRIVERS.get(name.upper().split(".")[0])
            raise ModelLoadError(
                f"{setting} {device}: OpenVINO finds no {name} device on this machine (it finds:"
                f" {', '.join(available) or 'none'})" + (f"; {name} needs {needs}" if needs else "")
            )
