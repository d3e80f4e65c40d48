#include "embrope/tensor.hpp"

#include <cstdint>
#include <string>

#include "embrope/error.hpp"
#include "embrope/version.hpp"

EMBROPE_BEGIN_NAMESPACE

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::float32:
      return "float32";
    case DType::float16:
      return "float16";
    case DType::bfloat16:
      return "bfloat16";
    case DType::int32:
      return "int32";
    case DType::int64:
      return "int64";
    case DType::float8_e4m3fn:
      return "float8_e4m3fn";
    case DType::float8_e5m2:
      return "float8_e5m2";
    case DType::uint8:
      return "uint8";
    case DType::int8:
      return "int8";
  }
  return "unknown";
}

Tensor::Tensor(void* data, DType dtype, int ndim, const std::int64_t* shape,
               const std::int64_t* strides, Device device)
    : data_(data), dtype_(dtype), device_(device), ndim_(ndim) {
  if (ndim < 0 || ndim > kMaxDims) {
    throw Error(ErrorCode::invalid_argument, "Tensor: ndim " + std::to_string(ndim) +
                                                 " is outside [0, " + std::to_string(kMaxDims) +
                                                 "]");
  }
  if (ndim > 0 && shape == nullptr) {
    throw Error(ErrorCode::invalid_argument,
                "Tensor: shape is null for ndim " + std::to_string(ndim));
  }
  for (int d = 0; d < ndim; ++d) shape_[d] = shape[d];
  if (strides != nullptr) {
    for (int d = 0; d < ndim; ++d) strides_[d] = strides[d];
  } else {
    // Saturated: a shape whose product overflows int64 must not overflow here (it is
    // rejected by each op's check of the element count, with a message).
    std::int64_t stride = 1;
    for (int d = ndim - 1; d >= 0; --d) {
      strides_[d] = stride;
      const std::int64_t size = shape_[d] > 0 ? shape_[d] : 1;
      stride = stride > INT64_MAX / size ? INT64_MAX : stride * size;
    }
  }
}

Tensor::Tensor(void* data, DType dtype, std::initializer_list<std::int64_t> shape, Device device)
    : Tensor(data, dtype, static_cast<int>(shape.size()), shape.begin(), nullptr, device) {}

namespace {
// Checked before the delegated constructor reads shape.size() strides from the list.
const std::int64_t* strides_for(std::initializer_list<std::int64_t> shape,
                                std::initializer_list<std::int64_t> strides) {
  if (strides.size() != shape.size()) {
    throw Error(ErrorCode::invalid_argument, "Tensor: " + std::to_string(strides.size()) +
                                                 " strides for " + std::to_string(shape.size()) +
                                                 " dimensions");
  }
  return strides.begin();
}
}  // namespace

Tensor::Tensor(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
               std::initializer_list<std::int64_t> strides, Device device)
    : Tensor(data, dtype, static_cast<int>(shape.size()), shape.begin(),
             strides_for(shape, strides), device) {}

std::int64_t Tensor::numel() const {
  for (int d = 0; d < ndim_; ++d) {
    if (shape_[d] == 0) return 0;
  }
  std::int64_t n = 1;
  for (int d = 0; d < ndim_; ++d) {
    if (__builtin_mul_overflow(n, shape_[d], &n)) return INT64_MAX;  // saturated, never UB
  }
  return n;
}

EMBROPE_END_NAMESPACE
