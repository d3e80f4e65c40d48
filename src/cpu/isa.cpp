// The CPU kernels' instruction set (isa.hpp): detected once, capped by EMBROPE_CPU_ISA.
#include "isa.hpp"

#include <cstdlib>
#include <cstring>
#include <string>

#if EMBROPE_CPU_X86
#include <cpuid.h>
#endif

#include "embrope/embrope.hpp"
#include "embrope/version.hpp"

namespace embrope::cpu {
namespace {

Isa detect() {
#if EMBROPE_CPU_X86
  __builtin_cpu_init();
  // F16C from CPUID leaf 1 (ECX bit 29): not every compiler's __builtin_cpu_supports knows it.
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
  if (f16c && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
    // AVX512_BF16 from CPUID leaf 7, sub-leaf 1 (EAX bit 5); the OS saves the AVX-512 state,
    // which __builtin_cpu_supports("avx512f") has checked.
    const bool bf16 =
        __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) != 0 && (eax & (1u << 5)) != 0;
    return bf16 ? Isa::avx512_bf16 : Isa::avx512;
  }
  if (f16c && __builtin_cpu_supports("avx2")) return Isa::avx2;
#endif
  return Isa::portable;
}

Isa choose() {
  const Isa best = detect();
  const char* cap = std::getenv("EMBROPE_CPU_ISA");
  if (cap == nullptr || *cap == '\0') return best;
  for (Isa isa : {Isa::portable, Isa::avx2, Isa::avx512, Isa::avx512_bf16}) {
    if (std::strcmp(cap, isa_name(isa)) == 0) return isa < best ? isa : best;
  }
  throw Error(
      ErrorCode::invalid_argument,
      std::string("EMBROPE_CPU_ISA is '") + cap +
          "'; it must be portable, avx2, avx512 or avx512_bf16 (the widest the CPU may use)");
}

}  // namespace

Isa active_isa() {
  static const Isa isa = choose();
  return isa;
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::avx512_bf16:
      return "avx512_bf16";
    case Isa::avx512:
      return "avx512";
    case Isa::avx2:
      return "avx2";
    default:
      return "portable";
  }
}

}  // namespace embrope::cpu

EMBROPE_BEGIN_NAMESPACE

const char* cpu_isa() {
  return cpu::isa_name(cpu::active_isa());
}

EMBROPE_END_NAMESPACE
