#pragma once

// The version numbers and EMBROPE_ABI_VERSION (the SONAME's number): one home, shared with C.
#include "embrope/version.h"

// The C++ API lives in an inline namespace named after the ABI version (fmt's
// FMT_BEGIN_NAMESPACE): code names embrope::Tensor, binaries record embrope::v1::Tensor, so a
// program built against another ABI fails to link instead of calling functions whose types
// changed. The numerics of embrope/detail/ (header-only, inline) stay in embrope::detail.
#define EMBROPE_ABI_NAMESPACE_NAME_(n) v##n
#define EMBROPE_ABI_NAMESPACE_NAME(n) EMBROPE_ABI_NAMESPACE_NAME_(n)
#define EMBROPE_BEGIN_NAMESPACE \
  namespace embrope {           \
  inline namespace EMBROPE_ABI_NAMESPACE_NAME(EMBROPE_ABI_VERSION) {
#define EMBROPE_END_NAMESPACE \
  }                           \
  }
