// Element access the kernels share: one element of a value tensor (float32, float16 or
// bfloat16) or of an index tensor (int32 or int64) whose dtype is known only at run time.
#pragma once

#include <cstdint>

#include "embrope/detail/config.hpp"
#include "embrope/detail/numeric_types.hpp"
#include "embrope/types.hpp"

namespace embrope::internal {

// Element j of a [D] vector of float32 or of 16-bit values (a norm weight or bias), as float32.
EMBROPE_HD float load_vector_value(const void* base, DType dtype, std::int64_t j) {
  return dtype == DType::float32   ? static_cast<const float*>(base)[j]
         : dtype == DType::float16 ? to_float(static_cast<const detail::Half*>(base)[j])
                                   : to_float(static_cast<const detail::BFloat16*>(base)[j]);
}

// Stores x, rounded once, as element `offset` of a float32 or 16-bit value tensor.
EMBROPE_HD void store_value(void* base, DType dtype, std::int64_t offset, float x) {
  if (dtype == DType::float32) {
    static_cast<float*>(base)[offset] = x;
  } else if (dtype == DType::float16) {
    static_cast<detail::Half*>(base)[offset] = detail::from_float<detail::Half>(x);
  } else {
    static_cast<detail::BFloat16*>(base)[offset] = detail::from_float<detail::BFloat16>(x);
  }
}

// Loads an index element of either index dtype.
EMBROPE_HD std::int64_t load_index(const void* base, DType dtype, std::int64_t offset) {
  return dtype == DType::int32
             ? static_cast<std::int64_t>(static_cast<const std::int32_t*>(base)[offset])
             : static_cast<const std::int64_t*>(base)[offset];
}

EMBROPE_HD void store_index(void* base, DType dtype, std::int64_t offset, std::int64_t value) {
  if (dtype == DType::int32) {
    static_cast<std::int32_t*>(base)[offset] = static_cast<std::int32_t>(value);
  } else {
    static_cast<std::int64_t*>(base)[offset] = value;
  }
}

}  // namespace embrope::internal
