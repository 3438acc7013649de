// blas_core.h: which OpenBLAS kernels replace a pre-AVX fallback, and only a fallback.
#include "leash/kernels/blas_core.h"

#include <gtest/gtest.h>

namespace leash::kernels::cpu {
namespace {

constexpr CpuIsa kAvx512{true, true, true};
constexpr CpuIsa kAvx2{true, true, false};
constexpr CpuIsa kAvx{true, false, false};
constexpr CpuIsa kSse{};

TEST(BlasCoreTest, APreAvxFallbackGivesWayToTheCpusWidestVectors) {
  EXPECT_EQ(BetterOpenBlasCore("Prescott", kAvx512), "SkylakeX");
  EXPECT_EQ(BetterOpenBlasCore("Prescott", kAvx2), "Haswell");
  EXPECT_EQ(BetterOpenBlasCore("Prescott", kAvx), "Sandybridge");
  EXPECT_EQ(BetterOpenBlasCore("Nehalem", kAvx2), "Haswell");
  EXPECT_EQ(BetterOpenBlasCore("Core2", kAvx512), "SkylakeX");
  EXPECT_EQ(BetterOpenBlasCore("Barcelona", kAvx2), "Haswell");
  EXPECT_EQ(BetterOpenBlasCore("PRESCOTT", kAvx512), "SkylakeX") << "names compare without case";
}

TEST(BlasCoreTest, OpenBlasOwnChoiceStandsOtherwise) {
  EXPECT_EQ(BetterOpenBlasCore("Prescott", kSse), "") << "the CPU has no AVX: Prescott is right";
  EXPECT_EQ(BetterOpenBlasCore("SkylakeX", kAvx512), "");
  EXPECT_EQ(BetterOpenBlasCore("Haswell", kAvx512), "") << "an AVX kernel is OpenBLAS's choice";
  EXPECT_EQ(BetterOpenBlasCore("Sandybridge", kAvx2), "");
  EXPECT_EQ(BetterOpenBlasCore("Zen", kAvx512), "");
  EXPECT_EQ(BetterOpenBlasCore("ARMV8", kSse), "") << "unknown names are left alone";
  EXPECT_EQ(BetterOpenBlasCore("", kAvx512), "");
}

TEST(BlasCoreTest, OpenBlasNamesTheKernelsItLoaded) {
  const std::string core = OpenBlasCore();
  EXPECT_FALSE(core.empty());
  // The test process chose nothing: whatever OpenBLAS took here, a better choice, if any,
  // is one of the three AVX kernels.
  const std::string better = BetterOpenBlasCore(core, HostIsa());
  EXPECT_TRUE(better.empty() || better == "SkylakeX" || better == "Haswell" ||
              better == "Sandybridge")
      << better;
}

}  // namespace
}  // namespace leash::kernels::cpu
