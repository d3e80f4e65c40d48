// Reading an enum field that C code filled in (embrope.h's option structs, DLPack's structs).
#pragma once

#include <cstring>
#include <type_traits>

namespace embrope::internal {

// The value a C caller stored in an enum field. C lets any int live in an enum object; in
// C++ loading a value outside the enum's range is undefined, so the bytes are read as the
// underlying integer and compared against the enumerators.
template <typename Enum>
long long raw_enum(const Enum& field) {
  std::underlying_type_t<Enum> value;
  std::memcpy(&value, &field, sizeof value);
  return static_cast<long long>(value);
}

}  // namespace embrope::internal
