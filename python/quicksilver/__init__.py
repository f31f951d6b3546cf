"""Quicksilver: gradient-communication scheduling for data-parallel training.

`quicksilver.torch` trains PyTorch models through Quicksilver's schedulers (docs/pytorch.md).
"""
import os as _os
import sys as _sys

__all__ = ["torch"]


def _load_native():
    """Imports the compiled module `quicksilver._quicksilver` so that its gloo cannot meet
    the gloo inside the user's torch.

    The all-reduce runtime links the system's libgloo.so.0. A PyTorch from pip carries a
    different gloo inside libtorch_cpu.so, exporting the same C++ names; where torch's
    libraries sit in the global symbol scope (TORCH_USE_RTLD_GLOBAL=1, or a framework
    that loads torch with RTLD_GLOBAL), our calls into gloo bound to torch's copy and the
    all-reduce path died with SIGSEGV. RTLD_DEEPBIND puts the module's own dependencies
    (its libgloo) ahead of the global scope for every lookup the module and they make, so
    nothing binds across (docs/pytorch.md shows the LD_DEBUG=bindings check; the test is
    tests/python/test_torch.py::test_no_gloo_symbol_binds_across). Debian's torch links
    the very same libgloo.so.0, so there it changes nothing. Sanitizer runtimes refuse
    RTLD_DEEPBIND: QS_NO_DEEPBIND=1 loads the module the ordinary way.

    torch is imported first when it is installed: a library group loaded with
    RTLD_DEEPBIND before torch's own makes torch's import die in free() (seen with torch
    2.11 from pip on Ubuntu 24.04: `free(): invalid pointer` inside `import torch`, in a
    process that imported quicksilver first)."""
    try:
        import torch  # noqa: F401
    except ImportError:
        pass
    flags = _sys.getdlopenflags()
    deep = getattr(_os, "RTLD_DEEPBIND", 0)
    if deep and _os.environ.get("QS_NO_DEEPBIND") != "1":
        _sys.setdlopenflags(_os.RTLD_NOW | _os.RTLD_LOCAL | deep)
    try:
        from . import _quicksilver  # noqa: F401
    except ImportError:
        pass  # quicksilver.torch says what is missing, when it is asked for
    finally:
        _sys.setdlopenflags(flags)


_load_native()
