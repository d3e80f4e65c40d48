// Value dtype dispatch, the one place where a runtime DType becomes a storage type: float,
// detail::Half or detail::BFloat16 (include/embrope/detail/numeric_types.hpp). Both backends'
// launchers use it; a dtype that is not a value dtype is a bug (validation rejects it
// before dispatch), reported as an internal error rather than read as float.
#pragma once

#include <string>
#include <type_traits>
#include <utility>

#include "embrope/detail/numeric_types.hpp"
#include "embrope/error.hpp"
#include "embrope/tensor.hpp"

namespace embrope::internal {

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
      return f(TypeTag<detail::Half>{});
    case DType::bfloat16:
      return f(TypeTag<detail::BFloat16>{});
    default:
      throw Error(ErrorCode::internal, std::string("value dtype dispatch: ") + dtype_name(dtype) +
                                           " is not a value dtype");
  }
}

// The DType of a value storage type: dispatch_value_dtype's inverse.
template <typename T>
constexpr DType value_dtype() {
  if constexpr (std::is_same_v<T, float>) {
    return DType::float32;
  } else if constexpr (std::is_same_v<T, detail::Half>) {
    return DType::float16;
  } else {
    static_assert(std::is_same_v<T, detail::BFloat16>, "not a value storage type");
    return DType::bfloat16;
  }
}

// f(TypeTag<Float8E4M3>) or f(TypeTag<Float8E5M2>) for a float8 dtype.
template <typename F>
decltype(auto) dispatch_float8_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::float8_e4m3fn:
      return f(TypeTag<detail::Float8E4M3>{});
    case DType::float8_e5m2:
      return f(TypeTag<detail::Float8E5M2>{});
    default:
      throw Error(ErrorCode::internal, std::string("float8 dtype dispatch: ") + dtype_name(dtype) +
                                           " is not a float8 dtype");
  }
}

// The same for the dtype of a KV cache: a value dtype, or detail::Float8E4M3 / Float8E5M2.
template <typename F>
decltype(auto) dispatch_cache_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::float8_e4m3fn:
    case DType::float8_e5m2:
      return dispatch_float8_dtype(dtype, std::forward<F>(f));
    default:
      return dispatch_value_dtype(dtype, std::forward<F>(f));
  }
}

}  // namespace embrope::internal
