// Non-owning tensor views (DESIGN.md section 2) and the opaque stream handle.
#pragma once

#include "embrope/detail/export.hpp"

#include <cstdint>
#include <initializer_list>

namespace embrope {

enum class DType : std::uint8_t { float32, float16, bfloat16, int32, int64 };

// Bytes per element of a dtype.
constexpr int dtype_size(DType dtype) {
  return dtype == DType::float16 || dtype == DType::bfloat16 ? 2 : dtype == DType::int64 ? 8 : 4;
}
EMBROPE_EXPORT const char* dtype_name(DType dtype);
constexpr bool is_value_dtype(DType d) {
  return d == DType::float32 || d == DType::float16 || d == DType::bfloat16;
}
constexpr bool is_index_dtype(DType d) {
  return d == DType::int32 || d == DType::int64;
}

enum class DeviceKind : std::uint8_t { cpu, cuda };

struct Device {
  DeviceKind kind = DeviceKind::cpu;
  int index = 0;  // the CUDA device ordinal; 0 for the CPU

  static constexpr Device cpu() { return {DeviceKind::cpu, 0}; }
  static constexpr Device cuda(int index = 0) { return {DeviceKind::cuda, index}; }
  friend constexpr bool operator==(Device a, Device b) {
    return a.kind == b.kind && a.index == b.index;
  }
  friend constexpr bool operator!=(Device a, Device b) { return !(a == b); }
};

// A cudaStream_t passed as an opaque handle, so that public headers need no CUDA headers.
// The null handle is the legacy default stream. Ignored for CPU tensors.
struct Stream {
  void* handle = nullptr;
};

constexpr int kMaxDims = 8;

// A view of memory owned by someone else: data pointer, dtype, device, shape and strides in
// elements. Views are cheap to copy. Construction checks only what the view itself needs
// (rank at most kMaxDims); each op validates the views it is given against its own rules.
class EMBROPE_EXPORT Tensor {
 public:
  Tensor() = default;
  // Row-major contiguous strides.
  Tensor(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
         Device device = Device::cpu());
  Tensor(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
         std::initializer_list<std::int64_t> strides, Device device = Device::cpu());
  // strides may be null (row-major contiguous).
  Tensor(void* data, DType dtype, int ndim, const std::int64_t* shape, const std::int64_t* strides,
         Device device = Device::cpu());

  void* data() const { return data_; }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  int ndim() const { return ndim_; }
  std::int64_t shape(int dim) const { return shape_[dim]; }
  std::int64_t stride(int dim) const { return strides_[dim]; }
  const std::int64_t* shape() const { return shape_; }
  const std::int64_t* strides() const { return strides_; }
  // Product of the shape (0 for a tensor with a zero dimension; 1 for a scalar; INT64_MAX
  // when the product overflows int64, which every op rejects).
  std::int64_t numel() const;

 private:
  void* data_ = nullptr;
  DType dtype_ = DType::float32;
  Device device_{};
  int ndim_ = 0;
  std::int64_t shape_[kMaxDims] = {};
  std::int64_t strides_[kMaxDims] = {};
};

}  // namespace embrope
