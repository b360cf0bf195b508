"""Build llama.cpp's `llama-server`, the peer of the `peer` scenario, from the llama.cpp
sources vendored in the `llama-cpp-python` sdist (fetched with pip: no other network).

    python -m bench.build_llama_server [--version 0.3.16] [--out ~/.cache/ovtrio-bench] [--isa avx2]

Needs a C++ compiler and CMake; takes 5-10 minutes on 2 cores (20 under load). Prints
the binary's path; the peer scenario looks for it in the same place.

It is built for this CPU (`-march=native`) but without ggml's AMX kernels: on an Intel
Xeon with AMX (a KVM guest) the llama.cpp of llama-cpp-python 0.3.36 built with them
died at its first matmul, on an illegal `tilezero` (SIGILL), while a plain AMX program
ran there. Its AVX-512 (VNNI, BF16) kernels and its repacked Q4_0 blocks are kept.
`--amx` builds them in.

`--isa avx2` builds instead for CPUs with AVX2, FMA and F16C but no AVX-512 (Zen 3,
Haswell to Comet Lake), as `llama-server-avx2`: with `python -m bench peer --isa avx2`, which
also narrows OpenVINO's CPU plugin to AVX2, an AVX-512 machine measures both servers'
AVX2 code.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

# Explicit -mno-* flags win over what -march=native turns on, so ggml's AMX code is left out.
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
DEFAULT_OUT = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "ovtrio-bench"


# CMake options of ggml for each --isa: the build machine's own, or AVX2 without AVX-512.
ISA_OPTIONS = {
    "native": ["-DGGML_NATIVE=ON"],
    "avx2": ["-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON",
             "-DGGML_AVX512=OFF", "-DGGML_AVX_VNNI=OFF", "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF"],
}  # fmt: skip


def binary_path(out: Path = DEFAULT_OUT, isa: str = "native") -> Path:
    return out / ("llama-server" if isa == "native" else f"llama-server-{isa}")


def download_sdist(version: str | None, into: Path) -> Path:
    spec = f"llama-cpp-python=={version}" if version else "llama-cpp-python"
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--dest", str(into), spec],
        check=True,
    )
    return next(into.glob("llama_cpp_python-*.tar.gz"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", help="llama-cpp-python version (default: the newest)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--amx", action="store_true", help="keep ggml's AMX kernels (see above)")
    parser.add_argument("--isa", choices=sorted(ISA_OPTIONS), default="native", help="the CPU to build for (see above)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    keep_amx = args.amx or args.isa != "native"  # only -march=native turns AMX on
    with tempfile.TemporaryDirectory() as temp:
        work = Path(temp)
        sdist = download_sdist(args.version, work)
        with tarfile.open(sdist) as archive:
            archive.extractall(work, filter="data")
        source = next(work.glob("llama_cpp_python-*/vendor/llama.cpp"))
        build = work / "build"
        subprocess.run(
            [
                "cmake",
                "-S",
                str(source),
                "-B",
                str(build),
                "-DCMAKE_BUILD_TYPE=Release",
                "-DLLAMA_CURL=OFF",
                *ISA_OPTIONS[args.isa],
                "-DLLAMA_BUILD_SERVER=ON",
                "-DLLAMA_BUILD_TESTS=OFF",
                "-DLLAMA_BUILD_EXAMPLES=OFF",
                "-DBUILD_SHARED_LIBS=OFF",
                *([] if keep_amx else [f"-DCMAKE_C_FLAGS={NO_AMX}", f"-DCMAKE_CXX_FLAGS={NO_AMX}"]),
            ],
            check=True,
        )
        subprocess.run(["cmake", "--build", str(build), "--target", "llama-server", "-j", str(args.jobs)], check=True)
        built = next(build.glob("**/bin/llama-server"))
        target = binary_path(args.out, args.isa)
        shutil.copy2(built, target)
        target.with_name(target.name + ".version").write_text(sdist.name + "\n")
    print(target)


if __name__ == "__main__":
    main()
