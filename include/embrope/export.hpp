// Symbol visibility: the library is built with hidden visibility; the public API opts in.
#pragma once

#if defined(_WIN32)
#define EMBROPE_EXPORT
#else
#define EMBROPE_EXPORT __attribute__((visibility("default")))
#endif
