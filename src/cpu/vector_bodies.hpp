// Compiles a kernel's vector body once per x86 instruction set: include this file (no include
// guard) with EMBROPE_VECTOR_BODY defined as the body's file name ("apply_rope.inc"). The body
// lands in namespaces avx2, avx512 and avx512_bf16, each with I = its simd.hpp struct, inside a
// region whose functions are compiled for that instruction set (isa.hpp).
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

// Instantiated for bfloat16 outputs only (isa.hpp).
EMBROPE_BEGIN_AVX512_BF16
namespace avx512_bf16 {
using I = simd::Avx512Bf16;
#include EMBROPE_VECTOR_BODY
}  // namespace avx512_bf16
EMBROPE_END_TARGET
#endif
#undef EMBROPE_VECTOR_BODY
