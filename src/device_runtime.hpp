// The device runtime's services (cuda/runtime.cu; src/cuda_unavailable.cpp in a build without
// CUDA): devices, memory and streams, apart from the kernels (backend.hpp). Without CUDA (at
// build time or at run time) device_count() is 0 and the rest throw Error(not_implemented).
#pragma once

#include <cstddef>

#include "embrope/types.hpp"

namespace embrope::gpu {

int device_count();
void* allocate(std::size_t bytes, Device device);
void release(void* pointer, Device device) noexcept;
void copy_to_host(void* host, const void* device_pointer, std::size_t bytes, Device device,
                  Stream stream);
void copy_to_device(void* device_pointer, const void* host, std::size_t bytes, Device device,
                    Stream stream);
void synchronize(Stream stream, Device device);
// Whether `stream` is capturing a CUDA graph, where nothing may synchronise it.
bool capturing(Stream stream, Device device);

}  // namespace embrope::gpu
