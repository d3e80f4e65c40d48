#include "device_runtime.hpp"
#include "embrope/embrope.hpp"
#include "embrope/version.hpp"

EMBROPE_BEGIN_NAMESPACE

int cuda_device_count() {
  return gpu::device_count();
}

EMBROPE_END_NAMESPACE
