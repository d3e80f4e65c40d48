#include "validate.hpp"

#include <fmt/ranges.h>

#include "backend.hpp"

namespace embrope::validate {

std::string shape_string(const Tensor& t) {
  return fmt::format("[{}]", fmt::join(t.shape(), t.shape() + t.ndim(), ", "));
}

namespace {
std::string device_string(Device d) {
  return d.kind == DeviceKind::cpu ? "cpu" : fmt::format("cuda:{}", d.index);
}

}  // namespace

void check_view(const char* op, const char* name, const Tensor& t, int min_ndim, int max_ndim) {
  if (t.ndim() < min_ndim || t.ndim() > max_ndim) {
    if (min_ndim == max_ndim)
      fail(op, "{} has {} dimensions, expected {}", name, t.ndim(), min_ndim);
    fail(op, "{} has {} dimensions, expected {} to {}", name, t.ndim(), min_ndim, max_ndim);
  }
  constexpr std::int64_t limit = INT64_MAX / 8;  // offsets stay valid after scaling by bytes
  std::int64_t count = 1;
  std::int64_t furthest = 0;
  bool empty = false;
  for (int d = 0; d < t.ndim(); ++d) {
    const std::int64_t size = t.shape(d);
    const std::int64_t stride = t.stride(d);
    if (size < 0) fail(op, "{} has negative size {} in dimension {}", name, size, d);
    if (stride < 0) fail(op, "{} has negative stride {} in dimension {}", name, stride, d);
    if (size == 0) empty = true;
  }
  if (empty) return;
  for (int d = 0; d < t.ndim(); ++d) {
    const std::int64_t size = t.shape(d);
    const std::int64_t stride = t.stride(d);
    if (count > limit / size)
      fail(op, "{} of shape {} has more than 2^60 elements", name, shape_string(t));
    count *= size;
    if (stride != 0 && size - 1 > (limit - furthest) / stride) {
      fail(op, "{} of shape {} reaches past 2^60 elements from its data pointer", name,
           shape_string(t));
    }
    furthest += (size - 1) * stride;
  }
  if (t.data() == nullptr) fail(op, "{} has null data but {} elements", name, count);
}

void check_value_dtype(const char* op, const char* name, const Tensor& t) {
  if (!is_value_dtype(t.dtype())) {
    fail(op, "{} has dtype {}, expected float32, float16 or bfloat16", name, dtype_name(t.dtype()));
  }
}

void check_index_dtype(const char* op, const char* name, const Tensor& t) {
  if (!is_index_dtype(t.dtype())) {
    fail(op, "{} has dtype {}, expected int32 or int64", name, dtype_name(t.dtype()));
  }
}

void check_last_contiguous(const char* op, const char* name, const Tensor& t) {
  if (t.ndim() == 0) return;
  const int last = t.ndim() - 1;
  if (t.shape(last) > 1 && t.stride(last) != 1) {
    fail(op, "{} has stride {} in its last dimension, which must be 1", name, t.stride(last));
  }
}

void check_same_device(const char* op, const char* name, const Tensor& t, const char* other_name,
                       Device other) {
  if (t.device() != other) {
    fail(op, "{} is on {} but {} is on {}; all tensors of a call must be on one device", name,
         device_string(t.device()), other_name, device_string(other));
  }
}

void check_same_dtype(const char* op, const char* name, const Tensor& t, const char* other_name,
                      DType other) {
  if (t.dtype() != other) {
    fail(op, "{} has dtype {} but {} has {}; they must match", name, dtype_name(t.dtype()),
         other_name, dtype_name(other));
  }
}

void check_dim(const char* op, const char* name, const Tensor& t, int dim, std::int64_t expected,
               const char* what) {
  if (t.shape(dim) != expected) {
    fail(op, "{} of shape {} has size {} in dimension {}, expected {} ({})", name, shape_string(t),
         t.shape(dim), dim, expected, what);
  }
}

void check_device_usable(const char* op, Device device) {
  if (device.kind == DeviceKind::cpu) return;
  const int count = cuda::device_count();
  if (count == 0) {
    throw Error(ErrorCode::not_implemented,
                fmt::format("{}: tensors are on {} but no CUDA device is usable ({})", op,
                            device_string(device),
                            "built without CUDA, or no driver or device at run time"));
  }
  if (device.index < 0 || device.index >= count) {
    fail(op, "tensors are on {} but only {} CUDA devices exist", device_string(device), count);
  }
}

}  // namespace embrope::validate
