// Which OpenBLAS kernels compute the CPU's matrix products, and a better choice where
// OpenBLAS did not recognise the CPU. OpenBLAS built for many CPUs (Debian's) picks its
// kernels by CPU model at load; a model newer than the library (Debian bookworm's 0.3.21 on
// Intel Xeon family 6 model 207) falls back to its SSE3 "Prescott" kernels, about 2.5x slower
// for the MLP than its AVX-512 ones. OPENBLAS_CORETYPE, read when the library loads,
// chooses others (docs/running.md, "OpenBLAS on CPUs it does not know").
#pragma once

#include <string>
#include <string_view>

namespace leash::kernels::cpu {

// The instruction sets of a CPU that decide which OpenBLAS kernels suit it.
struct CpuIsa {
  bool avx = false;
  bool avx2_fma = false;  // AVX2 and FMA3
  bool avx512 = false;    // AVX-512 F, CD, BW, DQ and VL (what OpenBLAS's SkylakeX kernels use)
};

// This process's CPU.
CpuIsa HostIsa();

// The kernels OpenBLAS chose in this process, as it names them ("SkylakeX", "Prescott").
// In leash_kernels_cpu (which links OpenBLAS); the other two are in leash_blas_core.
std::string OpenBlasCore();

// What OPENBLAS_CORETYPE should name instead of `core` on a CPU with `isa`: the kernels for
// the CPU's widest vectors ("SkylakeX", "Haswell" or "Sandybridge"), but only where `core` is
// one of OpenBLAS's pre-AVX kernels (what it falls back to for a CPU it does not know) on a
// CPU with AVX or more. Empty otherwise, `core` unknown included: OpenBLAS's own choice stands.
std::string BetterOpenBlasCore(std::string_view core, const CpuIsa& isa);

}  // namespace leash::kernels::cpu
