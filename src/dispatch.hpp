// Value dtype dispatch, the one place where a runtime DType becomes a storage type: float,
// detail::Half or detail::BFloat16 (include/embrope/detail/numeric_types.hpp). Both backends'
// launchers use it; a dtype that is not a value dtype is a bug (validation rejects it
// before dispatch), reported as an internal error rather than read as float.
#pragma once

#include <string>

#include "embrope/detail/numeric_types.hpp"
#include "embrope/error.hpp"
#include "embrope/tensor.hpp"

namespace embrope::detail {

template <typename T>
struct TypeTag {
  using type = T;
};

// Calls f(TypeTag<T>{}) with T the storage type of `dtype` and returns what it returns.
template <typename F>
decltype(auto) dispatch_value_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::float32:
      return f(TypeTag<float>{});
    case DType::float16:
      return f(TypeTag<Half>{});
    case DType::bfloat16:
      return f(TypeTag<BFloat16>{});
    default:
      throw Error(ErrorCode::internal, std::string("value dtype dispatch: ") + dtype_name(dtype) +
                                           " is not a value dtype");
  }
}

}  // namespace embrope::detail
