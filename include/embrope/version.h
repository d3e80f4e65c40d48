/* embrope's version, for C and C++ (C90-clean: embrope.h and embrope/version.hpp include it).
 * EMBROPE_ABI_VERSION is the SONAME's number (libembrope.so.N; CMakeLists.txt reads it from
 * here), raised with every change that breaks a program built against an earlier header
 * (docs/abi.md). A C program can check it when it is compiled:
 *   #if EMBROPE_ABI_VERSION != 1
 *   #error "built for embrope's C ABI 1"
 *   #endif */
#ifndef EMBROPE_VERSION_H_
#define EMBROPE_VERSION_H_

#define EMBROPE_VERSION_MAJOR 0
#define EMBROPE_VERSION_MINOR 1
#define EMBROPE_VERSION_PATCH 0
#define EMBROPE_VERSION_STRING "0.1.0"

#define EMBROPE_ABI_VERSION 1

#endif /* EMBROPE_VERSION_H_ */
