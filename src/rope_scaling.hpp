// The RoPE scaling variants, one unit each (src/rope_scaling/<variant>.hpp: its name and HF
// rope_type, the RopeConfig fields it reads, its checks, frequencies and attention factor, and
// how it reads a HF config), and the table that the rest of the library reaches them through.
// Semantics: HF transformers, src/transformers/modeling_rope_utils.py (_compute_*_parameters),
// with the rotary dim R in the role of HF's `dim`. A new variant is a new unit, its row below
// and its RopeScaling value (with the C enum's and the Python enum's).
#pragma once

#include <cstring>
#include <string_view>
#include <vector>

#include "embrope/rope_cache.hpp"
#include "rope_scaling/common.hpp"
#include "rope_scaling/dynamic.hpp"
#include "rope_scaling/linear.hpp"
#include "rope_scaling/llama3.hpp"
#include "rope_scaling/longrope.hpp"
#include "rope_scaling/none.hpp"
#include "rope_scaling/yarn.hpp"

namespace embrope::internal {

struct ScalingVariant {
  RopeScaling kind;
  const char* name;
  const char* hf_types;  // HF rope_type values, separated by spaces
  const char* fields;    // the fields it reads beyond rotary_dim, base and max_positions
  void (*check)(const RopeConfig&);
  std::vector<double> (*inv_freq)(const RopeConfig&);
  double (*attention_factor)(const RopeConfig&);
  void (*from_hf)(const HfRopeParams&, RopeConfig&);
};

template <typename Unit>
constexpr ScalingVariant scaling_variant_of() {
  return {Unit::kind,  Unit::name,     Unit::hf_types,         Unit::fields,
          Unit::check, Unit::inv_freq, Unit::attention_factor, Unit::from_hf};
}

inline constexpr ScalingVariant kScalingVariants[] = {
    scaling_variant_of<NoScaling>(),      scaling_variant_of<LinearScaling>(),
    scaling_variant_of<DynamicScaling>(), scaling_variant_of<YarnScaling>(),
    scaling_variant_of<Llama3Scaling>(),  scaling_variant_of<LongRopeScaling>(),
};

// Whether `word` is one of the space-separated words of `words`.
inline bool has_word(const char* words, std::string_view word) {
  std::string_view rest(words);
  while (!rest.empty()) {
    const std::size_t end = std::min(rest.find(' '), rest.size());
    if (rest.substr(0, end) == word) return true;
    rest.remove_prefix(std::min(end + 1, rest.size()));
  }
  return false;
}

// The variant of a RopeScaling value, or null for a value that names none (a C caller's).
inline const ScalingVariant* scaling_variant(RopeScaling scaling) {
  for (const ScalingVariant& v : kScalingVariants) {
    if (v.kind == scaling) return &v;
  }
  return nullptr;
}
inline const ScalingVariant* scaling_variant(long long value) {
  for (const ScalingVariant& v : kScalingVariants) {
    if (static_cast<long long>(v.kind) == value) return &v;
  }
  return nullptr;
}

// The variant of a HF rope_type, or null.
inline const ScalingVariant* scaling_variant_for_hf(std::string_view rope_type) {
  for (const ScalingVariant& v : kScalingVariants) {
    if (has_word(v.hf_types, rope_type)) return &v;
  }
  return nullptr;
}

}  // namespace embrope::internal
