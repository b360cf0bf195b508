"""A byte bound on the engine's cache of compiled grammars (structured output).

OpenVINO GenAI compiles every output constraint (a JSON schema, structural tags) with
XGrammar's GrammarCompiler and keeps each compiled grammar in that compiler's cache. It
builds the compiler with XGrammar's defaults, and the default cache is unlimited: every
distinct schema a client ever sent stays in memory (a few schemas of large enums held
a great deal of it: docs/benchmarks.md#structured-output-grammars). XGrammar itself has
the remedy, an LRU bounded in bytes (its fourth constructor argument,
`max_memory_bytes`, sized by XGrammar's own estimate of each compiled grammar), but
OpenVINO GenAI offers no way to pass it.

So the call is redirected: libopenvino_genai calls the compiler's constructor through
its procedure linkage table, and `install` points that one entry at a function that
calls the real constructor with the byte limit (and fewer compiling threads than cores,
see compile_threads). Nothing else changes: the compiler, its cache and its eviction are
XGrammar's. The compiler's address is kept, so the cache's
size (`cache_bytes`, XGrammar's estimate) can be read for /metrics and tests.

A compiler belongs to one pipeline (XGrammarStructuredOutput holds it) and is freed
with it, so a kept address must be forgotten before its pipeline goes: read after, it
is a call through freed memory. The engine builds the compiler inside the step that
first needs a grammar, on the thread that steps, so whoever steps an engine does so
within its EngineGrammars' `building()` (a thread-local mark), and the compilers built
meanwhile are that engine's, forgotten by its `forget()` once it is stepped no more.

The entry is found by reading the library's ELF relocation table (pyelftools). A
library built otherwise (the call inlined or bound directly) has no such entry:
`install` then returns False, and the cache stays unbounded (the server says so at
startup); the size of one schema is still bounded by the API layer.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from ovtrio import seams

log = logging.getLogger("ovtrio")

# xgrammar::GrammarCompiler::GrammarCompiler(TokenizerInfo const&, int max_threads,
# bool cache_enabled, long max_memory_bytes), the complete-object constructor.
CONSTRUCTOR = "_ZN8xgrammar15GrammarCompilerC1ERKNS_13TokenizerInfoEibl"
CACHE_SIZE = "_ZNK8xgrammar15GrammarCompiler17GetCacheSizeBytesEv"

_Constructor = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_bool, ctypes.c_int64)
_CacheSize = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p)


class EngineGrammars:
    """The grammar compilers of one engine (pipeline): those its calls build while they
    run within `building()`, to be forgotten (`forget`) before the engine is released."""

    @contextmanager
    def building(self) -> Iterator[None]:
        """Compilers the engine builds on this thread meanwhile are this engine's."""
        earlier = getattr(_building, "engine", None)
        _building.engine = self
        try:
            yield
        finally:
            _building.engine = earlier

    def forget(self) -> None:
        """Stop counting this engine's compilers (and any whose engine is unknown, which
        may be this one): call once nothing steps it any more, before it is released."""
        if _hook is not None:
            _hook.forget(self)


# The engine whose call runs on this thread (EngineGrammars.building).
_building = threading.local()


class _Hook:
    """The installed redirection: the limit, the real constructor, the compilers made
    (each with the engine that built it, None when unknown)."""

    def __init__(self) -> None:
        self.limit = -1
        self.real: Callable[[int, int, int, bool, int], None] | None = None
        self.cache_size: Callable[[int], int] | None = None
        self.compilers: dict[int, EngineGrammars | None] = {}
        # Held while a compiler is read, so that none is forgotten (and then freed)
        # in the middle of a read from another thread.
        self.lock = threading.Lock()
        self.callback = _Constructor(self._construct)  # kept alive: the library calls it

    def _construct(self, this: int, tokenizer_info: int, max_threads: int, cache_enabled: bool, _limit: int) -> None:
        # Called by the engine (with the GIL, which ctypes takes for the call) whenever a
        # pipeline first needs a grammar compiled. Must construct the object, whatever.
        assert self.real is not None
        self.real(this, tokenizer_info, compile_threads(max_threads), cache_enabled, self.limit)
        engine = getattr(_building, "engine", None)
        if engine is None:
            log.debug("a grammar compiler was built outside any engine's step: forgotten at the next unload")
        with self.lock:
            self.compilers[this] = engine

    def forget(self, engine: EngineGrammars) -> None:
        with self.lock:
            for address, owner in list(self.compilers.items()):
                if owner is engine or owner is None:
                    del self.compilers[address]


_hook: _Hook | None = None


def compile_threads(asked: int) -> int:
    """Threads one grammar compiles on: XGrammar's default (8), but at most one fewer
    than the machine's cores. On 2 cores, 8 compiling threads left the event loop too
    little CPU while schemas compiled (see docs/benchmarks.md#structured-output-grammars)."""
    return max(1, min(asked, (os.cpu_count() or 2) - 1))


# The name the seam is listed under at startup (ovtrio/seams.py).
SEAM = "compiled-grammar cache bound"


def install(limit_bytes: int) -> bool:
    """Make every grammar compiler OpenVINO GenAI builds from now on keep at most
    `limit_bytes` of compiled grammars (least recently used dropped first; -1: no limit).
    Call before the first pipeline compiles a grammar. True when the limit is in force."""
    global _hook
    if _hook is not None:
        _hook.limit = limit_bytes
        return True
    try:
        hook = _Hook()
        hook.limit = limit_bytes
        library = _genai_library()
        handle = ctypes.CDLL(str(library))
        real_address = _address(getattr(handle, CONSTRUCTOR))
        hook.real = _Constructor(real_address)
        hook.cache_size = _CacheSize(_address(getattr(handle, CACHE_SIZE)))
        value, slot_offset = _symbol_value_and_slot(library, CONSTRUCTOR)
        base = real_address - value
        _write_pointer(base + slot_offset, _address(hook.callback))
    except Exception as exc:  # noqa: BLE001 - any build we cannot redirect keeps working unbounded
        log.warning("cannot bound the engine's compiled-grammar cache (%s): it grows with every distinct schema", exc)
        return seams.record(SEAM, "openvino-genai", False, "its compiled grammars grow with every distinct schema")
    _hook = hook
    return seams.record(SEAM, "openvino-genai", True, "")


def cache_bytes() -> int:
    """Bytes of compiled grammars held by the compilers of the engines not yet
    forgotten, by XGrammar's own estimate (0 before any grammar was compiled)."""
    if _hook is None or _hook.cache_size is None:
        return 0
    with _hook.lock:
        return sum(max(0, _hook.cache_size(address)) for address in _hook.compilers)


def compilers() -> int:
    """How many compilers `cache_bytes` reads: one per engine that compiled a grammar
    and is not yet forgotten."""
    if _hook is None:
        return 0
    with _hook.lock:
        return len(_hook.compilers)


def _address(function: ctypes._CFunctionType) -> int:
    address = ctypes.cast(function, ctypes.c_void_p).value
    if address is None:
        raise LookupError("a null function pointer")
    return address


def _genai_library() -> Path:
    import openvino_genai

    folder = Path(openvino_genai.__file__).parent
    found = sorted(folder.glob("libopenvino_genai.so*"))
    if not found:
        raise FileNotFoundError(f"no libopenvino_genai.so in {folder}")
    return found[0]


def _symbol_value_and_slot(library: Path, name: str) -> tuple[int, int]:
    """The symbol's address in the file, and the offset of the PLT slot through which
    the library calls it."""
    from elftools.elf.elffile import ELFFile
    from elftools.elf.relocation import RelocationSection
    from elftools.elf.sections import SymbolTableSection

    with open(library, "rb") as file:
        elf = ELFFile(file)
        dynsym = elf.get_section_by_name(".dynsym")
        if not isinstance(dynsym, SymbolTableSection):
            raise LookupError("no .dynsym section")
        index = next(i for i, symbol in enumerate(dynsym.iter_symbols()) if symbol.name == name)
        value = dynsym.get_symbol(index)["st_value"]
        plt = elf.get_section_by_name(".rela.plt")
        if not isinstance(plt, RelocationSection):
            raise LookupError("no .rela.plt section")
        for relocation in plt.iter_relocations():
            if relocation["r_info_sym"] == index:
                return value, relocation["r_offset"]
    raise LookupError(f"the library does not call {name} through its PLT")


def _write_pointer(address: int, value: int) -> None:
    page = os.sysconf("SC_PAGE_SIZE")
    start = address & ~(page - 1)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    read_write = 0x1 | 0x2  # PROT_READ | PROT_WRITE
    if libc.mprotect(start, page * (2 if address + 8 > start + page else 1), read_write) != 0:
        raise OSError(ctypes.get_errno(), "mprotect failed")
    ctypes.c_void_p.from_address(address).value = value
