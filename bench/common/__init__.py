"""Shared helpers of the Leash benchmark suite (bench/): the Fashion-MNIST loader used by
every Python peer, the peers' model definitions, ports from the suite's range, process
handling, and result bookkeeping (time to a target accuracy, medians, ratios).
Plain functions; nothing here is shared between threads."""

import os
import subprocess
import sys

# OpenBLAS's x86 kernels older than AVX: what it falls back to for a CPU it does not know
# (kernels/include/leash/kernels/blas_core.h has the same list for leash-worker).
_PRE_AVX = {"katmai", "coppermine", "northwood", "prescott", "banias", "atom", "core2", "penryn", "dunnington",
            "nehalem", "opteron", "opteron(sse3)", "barcelona", "nano", "bobcat", "athlon"}


def openblas_coretype():
    """The OPENBLAS_CORETYPE this machine's Python peers need, or None. Debian's PyTorch and numpy
    compute through OpenBLAS, which picks its kernels when it loads; on a CPU newer than the library
    (bookworm's 0.3.21 on Intel family 6 model 207) it takes its pre-AVX kernels, ~2.5x slower, and a
    peer would be measured at that speed. leash-worker restarts itself with better ones
    (blas_core.h); the peers get them from the environment set here, before they load OpenBLAS.
    Asked of a child process, so this one never loads OpenBLAS with the wrong kernels."""
    if "OPENBLAS_CORETYPE" in os.environ:
        return None
    probe = ("import ctypes\nl = ctypes.CDLL('libopenblas.so.0')\nl.openblas_get_corename.restype = ctypes.c_char_p\n"
             "print(l.openblas_get_corename().decode())")
    try:
        core = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                              env=dict(os.environ, OPENBLAS_NUM_THREADS="1")).stdout.strip().lower()
        with open("/proc/cpuinfo") as f:
            flags = next((ln.split(":", 1)[1].split() for ln in f if ln.startswith("flags")), [])
    except (OSError, subprocess.SubprocessError):
        return None
    if core not in _PRE_AVX:
        return None
    if all(x in flags for x in ("avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl")):
        return "SkylakeX"
    if "avx2" in flags and "fma" in flags:
        return "Haswell"
    return "Sandybridge" if "avx" in flags else None


_core = openblas_coretype()
if _core:
    os.environ["OPENBLAS_CORETYPE"] = _core
    print(f"bench: OpenBLAS does not know this CPU and would use pre-AVX kernels; OPENBLAS_CORETYPE={_core} "
          "for the Python peers", file=sys.stderr)
