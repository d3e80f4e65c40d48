// The C++ API of embrope. See README.md for an overview and DESIGN.md for the contract.
#pragma once

#include "embrope/detail/export.hpp"

#include "embrope/embedding.hpp"
#include "embrope/error.hpp"
#include "embrope/model_config.hpp"
#include "embrope/packed_positions.hpp"
#include "embrope/rope.hpp"
#include "embrope/rope_cache.hpp"
#include "embrope/status.hpp"
#include "embrope/tensor.hpp"
#include "embrope/version.hpp"

// Backward passes (training).
#include "embrope/embedding_backward.hpp"
#include "embrope/rope_backward.hpp"

namespace embrope {

// Number of CUDA devices usable by this build: 0 when built without CUDA, without a driver,
// or without a device.
EMBROPE_EXPORT int cuda_device_count();

}  // namespace embrope
