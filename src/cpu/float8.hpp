// The active instruction set's float8 conversion loops, or the portable loops. Included inside
// namespace embrope::cpu right after vector_bodies.hpp has compiled float8.inc (whose
// avx2:: and avx512:: functions it names), like vector_bodies.hpp itself: no include guard,
// no includes (isa.hpp and numeric_types.hpp come first).

template <typename T, typename O>
using QuantizeValues = void (*)(const T*, O*, std::int64_t, float);

// out[j] = O(in[j] * scale), rounded once.
template <typename T, typename O>
void quantize_values_portable(const T* in, O* out, std::int64_t n, float scale) {
  for (std::int64_t j = 0; j < n; ++j) {
    out[j] = detail::from_float<O>(detail::to_float(in[j]) * scale);
  }
}

template <typename T, typename O>
QuantizeValues<T, O> quantize_values_for(Isa isa) {
#if EMBROPE_CPU_X86
  if (isa >= Isa::avx512) return avx512::quantize_values<T, O>;
  if (isa == Isa::avx2) return avx2::quantize_values<T, O>;
#endif
  (void)isa;
  return quantize_values_portable<T, O>;
}

// out[j] = O(in[j] / scale), rounded once (a float8 KV cache row).
template <typename T, typename O>
void divide_into_float8(const T* in, O* out, std::int64_t n, float scale) {
#if EMBROPE_CPU_X86
  const Isa isa = active_isa();
  if (isa >= Isa::avx512) return avx512::divide_into_float8(in, out, n, scale);
  if (isa == Isa::avx2) return avx2::divide_into_float8(in, out, n, scale);
#endif
  for (std::int64_t e = 0; e < n; ++e) {
    out[e] = detail::from_float<O>(detail::to_float(in[e]) / scale);
  }
}
