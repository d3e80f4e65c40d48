// The C++ API of embrope. See README.md for an overview and docs/ for the contract.
//
// Errors: every entry point validates all of its arguments before any kernel runs and throws
// embrope::Error (error.hpp) with a message "<op>: <argument> <value> <rule>". A call that
// throws invalid_argument or not_implemented has written nothing. Bad ids and positions are
// found by the kernels: their rows are zero-filled, other rows are written, and the first
// offending row is reported (deferred_status.hpp). NaN and infinity in values are not errors: they
// propagate into the outputs as IEEE arithmetic says.
//
// Memory: an output shares no byte with any input, with another output or with itself
// (two of its elements at one address); the one exception is in-place RoPE, where q_out
// (k_out) may be exactly q (k): the same data, shape and strides. Views that interleave in
// one buffer without sharing a byte (q and k of a fused QKV buffer) are fine. Breaking the
// rule is an invalid_argument error, found from the views' numbers alone.
//
// Threads: every function may be called from any number of threads at once, as long as no
// two concurrent calls write the same memory and no call writes memory another concurrent
// call reads. What may be shared between concurrent calls: input tensors (table, ids,
// positions, q and k of out-of-place calls, cos/sin tables) and a RopeCache, which is
// immutable after construction (do not move-assign or destroy it while a call that uses it
// runs or is queued). What may not: output tensors (out, q and k when rotated in place,
// q_out, k_out), and a DeferredStatus, whose record is read and written without
// synchronisation (deferred_status.hpp). Errors carry their own message (an exception); the C API
// keeps its last error per thread.
#pragma once

// One header per op family (the op and its backward), by the op's name:
#include "embrope/apply_rope.hpp"            // apply_rope, apply_rope_backward
#include "embrope/apply_rope_append_kv.hpp"  // apply_rope_append_kv, KvCache, KvSlots
#include "embrope/apply_qk_norm_rope.hpp"    // apply_qk_norm_rope(_backward), QkNorm
#include "embrope/deferred_status.hpp"       // DeferredStatus
#include "embrope/embed.hpp"                 // embed, embed_backward
#include "embrope/error.hpp"                 // Error, ErrorCode
#include "embrope/export.hpp"
#include "embrope/model_config.hpp"      // model_preset, model_config_from_hf_json
#include "embrope/packed_positions.hpp"  // packed_positions
#include "embrope/rope_cache.hpp"        // RopeConfig, RopeCache, AdaptiveRopeCache
#include "embrope/dlpack.hpp"            // tensor_from_dlpack
#include "embrope/tensor.hpp"            // Tensor
#include "embrope/types.hpp"             // DType, Device, Stream, the options' enums
#include "embrope/version.hpp"

EMBROPE_BEGIN_NAMESPACE

// Number of CUDA devices usable by this build: 0 when built without CUDA, without a driver,
// or without a device.
EMBROPE_EXPORT int cuda_device_count();

// The instruction set of the CPU kernels: "avx512_bf16" (AVX-512 with AVX512_BF16), "avx512",
// "avx2" (with F16C) or "portable", the widest this CPU has unless the environment variable
// EMBROPE_CPU_ISA (one of those names) caps it. Chosen once per process; every choice gives
// the same bits. Throws Error(invalid_argument) when EMBROPE_CPU_ISA names none of them.
EMBROPE_EXPORT const char* cpu_isa();

EMBROPE_END_NAMESPACE
