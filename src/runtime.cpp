#include "backend.hpp"
#include "embrope/embrope.hpp"

namespace embrope {

int cuda_device_count() {
  return gpu::device_count();
}

}  // namespace embrope
