# The CUDA backend: src/*/cuda/* (in slimkv_core), its test binary slimkv_cuda_tests
# (tests/cuda/*_test.cc, skipping when no GPU is usable) and bench/cuda/*.cc. Built when SLIMKV_CUDA is
# ON, or AUTO and nvcc is found; never in sanitizer or fuzz builds.
if(SLIMKV_CUDA STREQUAL "AUTO" AND (SLIMKV_SANITIZE OR SLIMKV_FUZZ))
  set(SLIMKV_CUDA OFF)
endif()
if(SLIMKV_CUDA STREQUAL "OFF")
  return()
endif()
if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
  set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)  # the toolkit's default place, often not on PATH
endif()
include(CheckLanguage)
check_language(CUDA)
if(NOT CMAKE_CUDA_COMPILER)
  if(SLIMKV_CUDA STREQUAL "ON")
    message(FATAL_ERROR "SLIMKV_CUDA=ON but no CUDA compiler (nvcc) was found: set CMAKE_CUDA_COMPILER")
  endif()
  message(STATUS "slimkv: nvcc not found, building without the CUDA backend")
  return()
endif()
# Hopper first (sm_90a: wgmma, setmaxnreg); override, e.g. -DCMAKE_CUDA_ARCHITECTURES="80;90a".
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
  set(CMAKE_CUDA_ARCHITECTURES 90a)
endif()
enable_language(CUDA)
find_package(CUDAToolkit REQUIRED)
if(NOT TARGET CUDA::cublas)
  if(SLIMKV_CUDA STREQUAL "ON")
    message(FATAL_ERROR "SLIMKV_CUDA=ON but the CUDA toolkit has no cuBLAS")
  endif()
  message(STATUS "slimkv: the CUDA toolkit has no cuBLAS, building without the CUDA backend")
  return()
endif()
if(CCACHE)
  set(CMAKE_CUDA_COMPILER_LAUNCHER ${CCACHE})
endif()
message(STATUS "slimkv: CUDA backend for architectures ${CMAKE_CUDA_ARCHITECTURES}")

# The backend's sources join slimkv_core, so the engine (and through it the CLI, tests and benchmarks)
# can run on the GPU; SLIMKV_HAVE_CUDA tells the engine that `--device cuda` is built in.
file(GLOB_RECURSE SLIMKV_CUDA_SOURCES CONFIGURE_DEPENDS src/*/cuda/*.cu src/*/cuda/*.cc)
target_sources(slimkv_core PRIVATE ${SLIMKV_CUDA_SOURCES})
target_compile_definitions(slimkv_core PUBLIC SLIMKV_HAVE_CUDA=1)
# CMake 3.25 knows no C++20 flag for nvcc (it would take CUDA_STANDARD from CXX_STANDARD 20 and
# fail): .cu files, and the headers they include, are C++17.
# slimkv_core was made before the CUDA language was enabled: its architectures are set here.
set_target_properties(slimkv_core PROPERTIES CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON
                      CUDA_ARCHITECTURES "${CMAKE_CUDA_ARCHITECTURES}")
target_compile_options(slimkv_core PRIVATE
  $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra>
  $<$<AND:$<COMPILE_LANGUAGE:CUDA>,$<BOOL:${SLIMKV_WERROR}>>:-Werror=all-warnings>)
target_link_libraries(slimkv_core PUBLIC CUDA::cudart_static CUDA::cublas)

file(GLOB SLIMKV_CUDA_TEST_SOURCES CONFIGURE_DEPENDS tests/cuda/*_test.cc)
add_executable(slimkv_cuda_tests ${SLIMKV_CUDA_TEST_SOURCES})
target_link_libraries(slimkv_cuda_tests PRIVATE slimkv_core GTest::gtest GTest::gtest_main)
target_include_directories(slimkv_cuda_tests PRIVATE tests)
target_compile_definitions(slimkv_cuda_tests PRIVATE SLIMKV_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
gtest_discover_tests(slimkv_cuda_tests DISCOVERY_TIMEOUT 60)

if(SLIMKV_BENCH)
  file(GLOB SLIMKV_CUDA_BENCH_SOURCES CONFIGURE_DEPENDS bench/cuda/*.cc)
  foreach(src ${SLIMKV_CUDA_BENCH_SOURCES})
    get_filename_component(name ${src} NAME_WE)
    add_executable(${name} ${src})
    target_link_libraries(${name} PRIVATE slimkv_core CLI11::CLI11)
  endforeach()
endif()
