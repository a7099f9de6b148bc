// Runs test cases of the running test binary again, in a child process per
// OpenBLAS core type that this CPU can run (OPENBLAS_CORETYPE, read by
// OpenBLAS's DYNAMIC_ARCH builds when the library loads), so that a property
// that must hold for any BLAS kernel is checked under each of them, whatever
// the machine's own choice.
//
//   TEST_CASE("gemm gives the same bits with one thread or several") {
//     weft::testing::checkRequestedBlasCore();  // in the child: OpenBLAS runs the core asked for
//     ...
//   }
//   TEST_CASE("... under each OpenBLAS core type") {
//     weft::testing::checkUnderEachBlasCoreType("gemm gives the same bits with one thread or several");
//   }
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "captured_text.h"
#include "tools/subprocess.h"
#include "weft_test.h"

extern "C" {
// OpenBLAS's own descriptions of its build and of the kernels it chose.
char* openblas_get_config(void);
char* openblas_get_corename(void);
}

namespace weft::testing {

// Set in the child beside OPENBLAS_CORETYPE: the core name OpenBLAS must report.
inline constexpr const char* kRequestedBlasCoreVar = "WEFT_TEST_BLAS_CORE";

// The core types to try: those whose instructions this CPU has; none when
// OpenBLAS is not a DYNAMIC_ARCH build (it then has one core type only).
inline std::vector<std::string> blasCoreTypesToTry() {
  std::vector<std::string> out;
#if defined(__x86_64__)
  if (!contains(openblas_get_config(), "DYNAMIC_ARCH")) return out;
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512cd")) {
    out.push_back("SkylakeX");
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    out.push_back("Haswell");
    out.push_back("Zen");
  }
  if (__builtin_cpu_supports("avx")) out.push_back("Sandybridge");
  if (__builtin_cpu_supports("sse4.2")) out.push_back("Nehalem");
  if (__builtin_cpu_supports("sse3")) out.push_back("Prescott");
#endif
  return out;
}

// In a child started by checkUnderEachBlasCoreType: OpenBLAS runs the core
// type that was asked for (else the child would check the wrong kernels).
inline void checkRequestedBlasCore() {
  const char* requested = std::getenv(kRequestedBlasCoreVar);
  if (!requested) return;
  const std::string want(requested), got(openblas_get_corename());
  INFO("OPENBLAS_CORETYPE=" << want << " but OpenBLAS runs " << got);
  CHECK(got == want);
}

// Runs the test cases matching `testCases` (a doctest -tc filter) in a child
// per core type, with weft's own float32 kernel off (WEFT_GEMM=blas), and checks that each ran `expectedCases` cases and all passed.
inline void checkUnderEachBlasCoreType(const std::string& testCases, int expectedCases = 1) {
  std::vector<std::string> cores = blasCoreTypesToTry();
  if (cores.empty()) {
    MESSAGE("OpenBLAS has a single core type here (not a DYNAMIC_ARCH build, or not x86-64): nothing to compare");
    return;
  }
  char exe[4096];
  ssize_t len = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  REQUIRE(len > 0);
  exe[len] = '\0';
  for (const std::string& core : cores) {
    CAPTURE(core);
    // WEFT_GEMM=blas: float32 products go to OpenBLAS even where weft's own
    // AVX-512 kernel (kernels/cpu/sgemm.h) would take them.
    Subprocess child({exe, "-tc=" + testCases},
                     {"OPENBLAS_CORETYPE=" + core, std::string(kRequestedBlasCoreVar) + "=" + core, "WEFT_GEMM=blas"});
    Subprocess::Result r = child.wait(std::chrono::seconds(100));
    INFO("child output:\n" << r.out << r.err);
    REQUIRE_FALSE(r.timedOut);
    CHECK(r.exitCode == 0);
    int ran = -1, passed = -1, failed = -1;
    std::sscanf(restOfLine(r.out, "test cases:").c_str(), " %d | %d passed | %d failed", &ran, &passed, &failed);
    CHECK(ran == expectedCases);
    CHECK(passed == expectedCases);
    CHECK(failed == 0);
  }
}

}  // namespace weft::testing
