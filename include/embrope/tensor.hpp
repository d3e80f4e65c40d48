// Non-owning tensor views (docs/ops.md, "Tensors").
#pragma once

#include <cstdint>
#include <initializer_list>

#include "embrope/export.hpp"
#include "embrope/types.hpp"
#include "embrope/version.hpp"

EMBROPE_BEGIN_NAMESPACE

// Its name: "float32", "bfloat16", ...
EMBROPE_EXPORT const char* dtype_name(DType dtype);

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

EMBROPE_END_NAMESPACE
