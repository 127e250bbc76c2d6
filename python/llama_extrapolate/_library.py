"""Loading the patched libllama once, for llama_cpp and for ``_core`` alike.

llama-cpp-python reads ``LLAMA_CPP_LIB_PATH`` once, when ``llama_cpp`` is first
imported. If it loaded its own (unpatched) library, a context it creates would
run vanilla attention while our knobs were set on a different copy of the
library: a silent fallback. So the import order is enforced here, and the two
bindings are checked to resolve to the very same functions.
"""

from __future__ import annotations

import ctypes
import os
import sys
import warnings
from pathlib import Path

LIB_DIR = Path(__file__).resolve().parent / "lib"


class LibraryConflictError(ImportError):
    """llama_cpp runs on a libllama other than the patched one of this package."""


def libllama_file() -> Path:
    if sys.platform == "win32":
        return LIB_DIR / "llama.dll"
    if sys.platform == "darwin":
        return LIB_DIR / "libllama.dylib"
    return LIB_DIR / "libllama.so"


def _loaded_path(lib: ctypes.CDLL) -> Path:
    return Path(lib._name).resolve()


def _import_llama_cpp_on_patched_library():
    libfile = libllama_file()
    if not libfile.exists():
        raise ImportError(
            f"the patched libllama is missing: {libfile} does not exist. "
            "Reinstall llama-extrapolate from source (pip install .) so that its build runs."
        )

    already = sys.modules.get("llama_cpp.llama_cpp")
    if already is None:
        previous = os.environ.get("LLAMA_CPP_LIB_PATH")
        if previous is not None and Path(previous).resolve() != LIB_DIR:
            warnings.warn(
                f"LLAMA_CPP_LIB_PATH={previous} is ignored: llama_extrapolate needs its patched "
                f"library in {LIB_DIR}",
                RuntimeWarning,
                stacklevel=3,
            )
        os.environ["LLAMA_CPP_LIB_PATH"] = str(LIB_DIR)
        try:
            import llama_cpp.llama_cpp as already
        finally:
            # the variable was only for this import: child processes keep the user's environment
            if previous is None:
                os.environ.pop("LLAMA_CPP_LIB_PATH", None)
            else:
                os.environ["LLAMA_CPP_LIB_PATH"] = previous

    loaded = _loaded_path(already._lib)
    if loaded != libfile.resolve():
        raise LibraryConflictError(
            f"llama_cpp was imported before llama_extrapolate and loaded {loaded}, not the patched "
            f"library {libfile}. Import llama_extrapolate before llama_cpp (a fresh Python process), "
            f"or start Python with LLAMA_CPP_LIB_PATH={LIB_DIR}."
        )
    return already


def load():
    """Import llama_cpp on the patched library, then ``_core``; check they share it."""
    llama_cpp_lib = _import_llama_cpp_on_patched_library()._lib

    from . import _core

    if _core.api_version() != _core.COMPILED_API_VERSION:
        raise ImportError(
            f"llama_extrapolate._core was compiled for API version {_core.COMPILED_API_VERSION} "
            f"but the loaded library reports {_core.api_version()}: reinstall llama-extrapolate."
        )
    ctypes_address = ctypes.cast(llama_cpp_lib.llama_ext_api_version, ctypes.c_void_p).value
    if ctypes_address != _core.api_address():
        raise LibraryConflictError(
            f"llama_cpp and llama_extrapolate._core loaded two copies of libllama "
            f"({_loaded_path(llama_cpp_lib)} and {_core.library_path()}); reinstall llama-extrapolate "
            "and import it before llama_cpp."
        )
    return _core
