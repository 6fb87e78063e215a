# Warnings, -Werror (STRATA_STRICT), sanitizers and the SIMD target, applied to Strata's
# own targets through the strata_options interface library (never to dependencies).
add_library(strata_options INTERFACE)
target_compile_options(strata_options INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wno-missing-field-initializers>)
if(STRATA_STRICT)
  target_compile_options(strata_options INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
  # GCC 12's AVX-512 intrinsics start from _mm512_undefined_ps(), a self-initialized variable,
  # and once inlined its -Wmaybe-uninitialized fires on them (GCC bug 105593, fixed in 13):
  # with -march=native that depends on the build machine's CPU (q8_test.cc on an AVX-512 EPYC).
  # The warning stays printed; it only stops failing the build.
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
    target_compile_options(strata_options INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-Wno-error=maybe-uninitialized>)
  endif()
endif()
if(STRATA_ARCH)
  # SIMD width is chosen at build time; STRATA_ARCH="" gives a portable (SSE2) build.
  target_compile_options(strata_options INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-march=${STRATA_ARCH}>)
endif()
if(STRATA_SANITIZE)
  if(NOT STRATA_SANITIZE MATCHES "^(address|undefined|thread|address,undefined)$")
    message(FATAL_ERROR "STRATA_SANITIZE='${STRATA_SANITIZE}': use address, undefined, address,undefined or thread")
  endif()
  set(_san -fsanitize=${STRATA_SANITIZE} -fno-omit-frame-pointer)
  if(STRATA_SANITIZE MATCHES "undefined")
    list(APPEND _san -fno-sanitize-recover=all)  # any undefined behaviour fails the test
  endif()
  target_compile_options(strata_options INTERFACE $<$<COMPILE_LANGUAGE:CXX,C>:${_san}>)
  target_link_options(strata_options INTERFACE ${_san})
endif()

# STRATA_FUZZ: coverage for libFuzzer in every Strata target, with ASan and UBSan (any
# report aborts); the harnesses in fuzz/ add libFuzzer's main at link time.
if(STRATA_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "STRATA_FUZZ=ON needs clang (libFuzzer): configure with CC=clang CXX=clang++")
  endif()
  if(STRATA_SANITIZE)
    message(FATAL_ERROR "STRATA_FUZZ=ON brings its own sanitizers (address, undefined): leave STRATA_SANITIZE empty")
  endif()
  set(_fuzz -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer)
  target_compile_options(strata_options INTERFACE $<$<COMPILE_LANGUAGE:CXX,C>:-fsanitize=fuzzer-no-link ${_fuzz}>)
  target_link_options(strata_options INTERFACE ${_fuzz})
endif()

find_program(STRATA_CCACHE ccache)
if(STRATA_CCACHE AND NOT CMAKE_CXX_COMPILER_LAUNCHER)
  set(CMAKE_CXX_COMPILER_LAUNCHER ${STRATA_CCACHE})
  set(CMAKE_C_COMPILER_LAUNCHER ${STRATA_CCACHE})
  set(CMAKE_CUDA_COMPILER_LAUNCHER ${STRATA_CCACHE})
endif()

# Targets with xsimd kernels link strata_simd. GCC 12 reports false maybe-uninitialized
# warnings inside its own AVX-512 intrinsic headers (GCC bug 105593), which -Werror would
# turn into build failures; the warning stays on for every other target.
add_library(strata_simd INTERFACE)
# xsimd's headers are in the default include path; its CMake target drags in -lxtl.
target_compile_options(strata_simd INTERFACE $<$<CXX_COMPILER_ID:GNU>:-Wno-maybe-uninitialized>)
# At -O0 GCC turns some AVX-512 intrinsics into casting macros that xsimd 8's select()
# cannot pass its batch types through; SIMD kernels are compiled with -O1 in Debug builds.
target_compile_options(strata_simd INTERFACE $<$<CONFIG:Debug>:-O1>)
# Under AddressSanitizer GCC 12's flow analysis reports false (maybe-)uninitialized values
# in system headers (libstdc++ <regex> through Catch2, and psrldi512/pslldi512 in
# avx512fintrin.h, GCC bug 105593). The unsanitized strict build keeps both warnings; the
# ASan build (scripts/test.sh) drops them so -Werror stops only on warnings in our code.
if(STRATA_SANITIZE MATCHES "address")
  target_compile_options(strata_options INTERFACE
    $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<CXX_COMPILER_ID:GNU>>:-Wno-maybe-uninitialized -Wno-uninitialized>)
endif()
