// DLTensor -> Tensor (include/embrope/dlpack.hpp): the one place DLPack's codes are read.
#include "embrope/dlpack.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

#include "c_enum.hpp"
#include "embrope/error.hpp"
#include "embrope/version.hpp"

EMBROPE_BEGIN_NAMESPACE
namespace {

[[noreturn]] void fail(const char* op, const std::string& message) {
  throw Error(ErrorCode::invalid_argument, fmt::format("{}: {}", op, message));
}

using embrope::internal::raw_enum;

// DLPack 1.1's codes of the 8-bit float formats (DLDataTypeCode kDLFloat8_e4m3fn and
// kDLFloat8_e5m2), spelled here so that older dlpack.h headers, which lack them, still read
// the float8 tensors PyTorch exports.
constexpr int kCodeFloat8E4M3fn = 10;
constexpr int kCodeFloat8E5M2 = 12;

}  // namespace

Device device_from_dlpack(DLDevice device, const char* op, const char* name) {
  const long long type = raw_enum(device.device_type);
  switch (type) {
    case kDLCPU:
      return Device::cpu();
    case kDLCUDA:
      return Device::cuda(device.device_id);
    default:
      fail(op, fmt::format("{} has DLPack device type {}; only kDLCPU ({}) and kDLCUDA ({}) "
                           "are supported",
                           name, type, static_cast<int>(kDLCPU), static_cast<int>(kDLCUDA)));
  }
}

namespace {

// "float64", "uint8x4": the dtype's name where DLPack's code is one of the common ones.
std::string dtype_label(DLDataType t) {
  const char* kind = t.code == kDLFloat    ? "float"
                     : t.code == kDLInt    ? "int"
                     : t.code == kDLUInt   ? "uint"
                     : t.code == kDLBfloat ? "bfloat"
                                           : nullptr;
  if (kind == nullptr) return "with an unnamed code";
  std::string label = kind + std::to_string(t.bits);
  if (t.lanes != 1) label += "x" + std::to_string(t.lanes);
  return label;
}

// What an argument accepts, by its name (each argument has one name in every API), for the
// message about a DLPack dtype that embrope has no counterpart of. A name not listed gets
// every dtype embrope reads.
const char* accepted_dtypes(std::string_view name) {
  const auto among = [name](std::initializer_list<std::string_view> names) {
    return std::find(names.begin(), names.end(), name) != names.end();
  };
  if (among({"positions", "ids", "position_ids", "position_offsets", "type_ids", "slot_mapping",
             "cache_offsets", "cu_seqlens", "start_offsets"})) {
    return "int32 or int64";
  }
  if (among({"k_cache", "v_cache", "kv_cache"})) {
    return "float32, float16, bfloat16, float8_e4m3fn or float8_e5m2";
  }
  if (among({"table.data"})) return "int8, uint8, float8_e4m3fn or float8_e5m2 (by its format)";
  if (among({"table.zero_points"})) return "float32, float16, bfloat16, int8 or int32";
  if (among({"q_weight_grad", "k_weight_grad", "grads.q_weight", "grads.k_weight"})) {
    return "float32";
  }
  if (among({"q",
             "k",
             "v",
             "dq",
             "dk",
             "q_out",
             "k_out",
             "cos",
             "sin",
             "cos_sin_cache",
             "table",
             "position_table",
             "type_table",
             "out",
             "pre_norm_out",
             "grad_out",
             "grad_table",
             "grad_position_table",
             "grad_type_table",
             "norm_weight",
             "norm_bias",
             "table.scales",
             "q_weight",
             "k_weight"})) {
    return "float32, float16 or bfloat16";
  }
  return "float32, float16, bfloat16, int32, int64, float8_e4m3fn, float8_e5m2, uint8 or int8";
}

DType to_dtype(const char* op, const char* name, DLDataType t) {
  if (t.lanes == 1) {
    if (t.code == kDLFloat && t.bits == 32) return DType::float32;
    if (t.code == kDLFloat && t.bits == 16) return DType::float16;
    if (t.code == kDLBfloat && t.bits == 16) return DType::bfloat16;
    if (t.code == kDLInt && t.bits == 32) return DType::int32;
    if (t.code == kDLInt && t.bits == 64) return DType::int64;
    if (t.code == kCodeFloat8E4M3fn && t.bits == 8) return DType::float8_e4m3fn;
    if (t.code == kCodeFloat8E5M2 && t.bits == 8) return DType::float8_e5m2;
    if (t.code == kDLUInt && t.bits == 8) return DType::uint8;
    if (t.code == kDLInt && t.bits == 8) return DType::int8;
  }
  fail(op, fmt::format("{} has dtype {} (DLPack dtype code {}, bits {}, lanes {}); it must be {} "
                       "with one lane",
                       name, dtype_label(t), static_cast<int>(t.code), static_cast<int>(t.bits),
                       static_cast<int>(t.lanes), accepted_dtypes(name)));
}

}  // namespace

Tensor tensor_from_dlpack(const DLTensor* t, const char* op, const char* name) {
  if (t == nullptr) fail(op, fmt::format("{} is null", name));
  if (t->ndim < 0 || t->ndim > kMaxDims) {
    fail(op, fmt::format("{} has ndim {}; at most {} are supported", name, t->ndim, kMaxDims));
  }
  if (t->ndim > 0 && t->shape == nullptr) fail(op, fmt::format("{} has a null shape", name));
  const DType dtype = to_dtype(op, name, t->dtype);
  const int size = dtype_size(dtype);
  if (t->byte_offset % static_cast<std::uint64_t>(size) != 0) {
    fail(op, fmt::format("{} has byte_offset {}, not a multiple of its element size {}", name,
                         t->byte_offset, size));
  }
  // Added as integers: a byte_offset that wraps the address space is an error, not a
  // pointer overflow.
  const auto base = reinterpret_cast<std::uintptr_t>(t->data);
  if (t->data != nullptr && t->byte_offset > UINTPTR_MAX - base) {
    fail(op, fmt::format("{} has byte_offset {}, which wraps past the end of the address space",
                         name, t->byte_offset));
  }
  void* data = t->data == nullptr ? nullptr : reinterpret_cast<void*>(base + t->byte_offset);
  // A tensor without elements addresses no memory, so its strides say nothing (NumPy reports
  // 0 for every one): read it as compact row-major, as DLPack's null strides mean, so that a
  // zero-size call is the no-op it is rather than a stride error. A negative extent keeps
  // the strides given, and the Tensor's own check names it.
  bool empty = false, negative = false;
  for (int d = 0; d < t->ndim; ++d) {
    empty = empty || t->shape[d] == 0;
    negative = negative || t->shape[d] < 0;
  }
  const std::int64_t* strides = empty && !negative ? nullptr : t->strides;
  return Tensor(data, dtype, t->ndim, t->shape, strides, device_from_dlpack(t->device, op, name));
}

EMBROPE_END_NAMESPACE
