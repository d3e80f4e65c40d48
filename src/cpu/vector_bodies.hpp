// Compiles a kernel's vector body once per x86 instruction set: include this file (no include
// guard) with EMBROPE_VECTOR_BODY defined as the body's file name ("apply_rope.inc"). The body
// lands in namespaces avx2 and avx512, each with I = its simd.hpp struct, inside a region
// whose functions are compiled for that instruction set (isa.hpp).
#if EMBROPE_CPU_X86
EMBROPE_BEGIN_AVX2
namespace avx2 {
using I = simd::Avx2;
#include EMBROPE_VECTOR_BODY
}  // namespace avx2
EMBROPE_END_TARGET

EMBROPE_BEGIN_AVX512
namespace avx512 {
using I = simd::Avx512;
#include EMBROPE_VECTOR_BODY
}  // namespace avx512
EMBROPE_END_TARGET
#endif
#undef EMBROPE_VECTOR_BODY
