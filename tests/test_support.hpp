// Assertions shared by the test files.
#pragma once

#include <catch2/catch.hpp>
#include <embrope/embrope.h>
#include <embrope/error.hpp>

#include <initializer_list>

#include "reference.hpp"

// f() must throw embrope::Error with one of `codes` and a message mentioning every part.
template <typename F>
void expect_error(F&& f, std::initializer_list<embrope::ErrorCode> codes,
                  std::initializer_list<const char*> parts) {
  try {
    f();
    FAIL("no embrope::Error was thrown");
  } catch (const embrope::Error& e) {
    INFO("message: " << e.what());
    bool code_ok = false;
    for (embrope::ErrorCode code : codes) code_ok = code_ok || e.code() == code;
    CHECK(code_ok);
    for (const char* part : parts) {
      INFO("expected the message to mention \"" << part << "\"");
      CHECK(ref::mentions(e.what(), part));
    }
  }
}

// The DLPack spelling of an embrope dtype.
inline DLDataType dl_dtype(embrope::DType d) {
  switch (d) {
    case embrope::DType::float32:
      return DLDataType{kDLFloat, 32, 1};
    case embrope::DType::float16:
      return DLDataType{kDLFloat, 16, 1};
    case embrope::DType::bfloat16:
      return DLDataType{kDLBfloat, 16, 1};
    case embrope::DType::int32:
      return DLDataType{kDLInt, 32, 1};
    case embrope::DType::int64:
      return DLDataType{kDLInt, 64, 1};
    case embrope::DType::float8_e4m3fn:
      return DLDataType{10, 8, 1};  // DLPack 1.1 kDLFloat8_e4m3fn
    case embrope::DType::float8_e5m2:
      return DLDataType{12, 8, 1};  // DLPack 1.1 kDLFloat8_e5m2
    case embrope::DType::uint8:
      return DLDataType{kDLUInt, 8, 1};
    case embrope::DType::int8:
      return DLDataType{kDLInt, 8, 1};
  }
  return DLDataType{kDLOpaqueHandle, 0, 0};  // not an embrope dtype
}
