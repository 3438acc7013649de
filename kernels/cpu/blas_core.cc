// blas_core.h: a better choice of OpenBLAS kernels where OpenBLAS fell back. No OpenBLAS
// here (leash_blas_core), so the Python extension can ask it too; OpenBlasCore is in
// cpu_kernels.cc.
#include "leash/kernels/blas_core.h"

#include <algorithm>
#include <array>
#include <cctype>

namespace leash::kernels::cpu {

CpuIsa HostIsa() {
  CpuIsa isa;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  isa.avx = __builtin_cpu_supports("avx");
  isa.avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  isa.avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
               __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
               __builtin_cpu_supports("avx512vl");
#endif
  return isa;
}

std::string BetterOpenBlasCore(std::string_view core, const CpuIsa& isa) {
  // OpenBLAS's x86 kernels older than AVX (driver/others/dynamic.c's names), lower case.
  static constexpr std::array<std::string_view, 16> kPreAvx = {
      "katmai",    "coppermine", "northwood",  "prescott", "banias",  "atom",
      "core2",     "penryn",     "dunnington", "nehalem",  "opteron", "opteron(sse3)",
      "barcelona", "nano",       "bobcat",     "athlon"};
  std::string lower(core);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (std::find(kPreAvx.begin(), kPreAvx.end(), lower) == kPreAvx.end()) return "";
  if (isa.avx512) return "SkylakeX";
  if (isa.avx2_fma) return "Haswell";
  if (isa.avx) return "Sandybridge";
  return "";
}

}  // namespace leash::kernels::cpu
