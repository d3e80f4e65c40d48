// DLPack interop: a DLTensor (dlpack/dlpack.h) seen as an embrope Tensor view. The C API and
// the Python module take their tensors through this one conversion.
#pragma once

#include <dlpack/dlpack.h>

#include "embrope/export.hpp"
#include "embrope/tensor.hpp"
#include "embrope/version.hpp"

EMBROPE_BEGIN_NAMESPACE

// The view of `t`'s memory (data + byte_offset) with its dtype, shape, strides and device.
// Throws Error(invalid_argument) "<op>: <name> ..." when the DLTensor is null, has more than
// kMaxDims dimensions, a null shape, a dtype other than float32, float16, bfloat16, int32,
// int64 or the storage dtypes float8_e4m3fn, float8_e5m2, uint8 and int8 (float8 outputs and
// caches, quantized tables) with one lane, a device other than kDLCPU or kDLCUDA, or a byte_offset
// that is not a multiple of the element size or wraps the address space. Null strides mean
// row-major. The device of a DLDevice: kDLCPU or kDLCUDA (with its ordinal); any other type throws
// Error(invalid_argument) naming op and name.
EMBROPE_EXPORT Device device_from_dlpack(DLDevice device, const char* op, const char* name);

EMBROPE_EXPORT Tensor tensor_from_dlpack(const DLTensor* t, const char* op, const char* name);

EMBROPE_END_NAMESPACE
