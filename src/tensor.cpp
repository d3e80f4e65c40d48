#include "embrope/tensor.hpp"

#include <string>

#include "embrope/error.hpp"

namespace embrope {

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
  for (int d = 0; d < ndim; ++d) shape_[d] = shape[d];
  if (strides != nullptr) {
    for (int d = 0; d < ndim; ++d) strides_[d] = strides[d];
  } else {
    std::int64_t stride = 1;
    for (int d = ndim - 1; d >= 0; --d) {
      strides_[d] = stride;
      stride *= shape_[d] > 0 ? shape_[d] : 1;
    }
  }
}

Tensor::Tensor(void* data, DType dtype, std::initializer_list<std::int64_t> shape, Device device)
    : Tensor(data, dtype, static_cast<int>(shape.size()), shape.begin(), nullptr, device) {}

Tensor::Tensor(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
               std::initializer_list<std::int64_t> strides, Device device)
    : Tensor(data, dtype, static_cast<int>(shape.size()), shape.begin(), strides.begin(), device) {
  if (strides.size() != shape.size()) {
    throw Error(ErrorCode::invalid_argument, "Tensor: " + std::to_string(strides.size()) +
                                                 " strides for " + std::to_string(shape.size()) +
                                                 " dimensions");
  }
}

std::int64_t Tensor::numel() const {
  std::int64_t n = 1;
  for (int d = 0; d < ndim_; ++d) n *= shape_[d];
  return n;
}

}  // namespace embrope
