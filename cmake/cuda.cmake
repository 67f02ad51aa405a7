# The CUDA backend: src/*/cuda/* as the plugin libslimkv_cuda.so (opened on `--device cuda`:
# engine/cuda_backend.h), its test binary slimkv_cuda_tests (tests/cuda/*_test.cc, skipping when no GPU
# is usable) and bench/cuda/*.cc. Built when SLIMKV_CUDA is ON, or AUTO and nvcc is found; never in
# sanitizer or fuzz builds.
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

# The backend's sources as a static library of position-independent code: linked into the plugin, and
# directly into the CUDA tests and benchmarks (which call its kernels). The engine library, and with it
# the CLI, server, tests and Python module, links no CUDA library: a CPU run maps neither the CUDA runtime
# nor cuBLAS (docs/cuda.md, "The backend as a plugin").
file(GLOB_RECURSE SLIMKV_CUDA_SOURCES CONFIGURE_DEPENDS src/*/cuda/*.cu src/*/cuda/*.cc)
list(FILTER SLIMKV_CUDA_SOURCES EXCLUDE REGEX "src/engine/cuda/cuda_plugin.cc$")
add_library(slimkv_cuda_backend STATIC ${SLIMKV_CUDA_SOURCES})
# CMake 3.25 knows no C++20 flag for nvcc (it would take CUDA_STANDARD from CXX_STANDARD 20 and
# fail): .cu files, and the headers they include, are C++17.
set_target_properties(slimkv_cuda_backend PROPERTIES POSITION_INDEPENDENT_CODE ON CUDA_STANDARD 17
                      CUDA_STANDARD_REQUIRED ON CUDA_ARCHITECTURES "${CMAKE_CUDA_ARCHITECTURES}")
target_compile_options(slimkv_cuda_backend PRIVATE
  $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra>
  $<$<AND:$<COMPILE_LANGUAGE:CUDA>,$<BOOL:${SLIMKV_WERROR}>>:-Werror=all-warnings>)
target_link_libraries(slimkv_cuda_backend PUBLIC slimkv_core CUDA::cudart_static CUDA::cublas)
# NCCL (the KV stream between GPUs: backend/cuda/nccl_link.h) is not a Debian package: its header where the
# toolkit or the system has one; the library is opened at run time, so the plugin never requires it.
find_path(SLIMKV_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} $ENV{NCCL_HOME}/include)
if(SLIMKV_NCCL_INCLUDE_DIR)
  message(STATUS "slimkv: NCCL header in ${SLIMKV_NCCL_INCLUDE_DIR}: the KV stream's NCCL path is built")
  set_source_files_properties(${CMAKE_SOURCE_DIR}/src/backend/cuda/nccl_link.cc PROPERTIES
                              COMPILE_DEFINITIONS SLIMKV_HAVE_NCCL_H INCLUDE_DIRECTORIES "${SLIMKV_NCCL_INCLUDE_DIR}")
else()
  message(STATUS "slimkv: no nccl.h found (set NCCL_HOME): the KV stream's NCCL path says so when asked for")
endif()

# The plugin and the engine's loader share a tag made once per build folder: the engine opens only the
# plugin of its own build (they share C++ types by layout). Defined on these two files alone.
if(NOT SLIMKV_CUDA_PLUGIN_TAG)
  string(RANDOM LENGTH 16 ALPHABET 0123456789abcdef tag)
  set(SLIMKV_CUDA_PLUGIN_TAG "${PROJECT_VERSION}-${tag}" CACHE INTERNAL "the CUDA plugin's build tag")
endif()
set_source_files_properties(${CMAKE_SOURCE_DIR}/src/engine/cuda_backend.cc ${CMAKE_SOURCE_DIR}/src/engine/cuda/cuda_plugin.cc
                            PROPERTIES COMPILE_DEFINITIONS "SLIMKV_CUDA_PLUGIN_TAG=\"${SLIMKV_CUDA_PLUGIN_TAG}\"")
# The plugin (a MODULE: only ever dlopen'ed) holds its own copy of what it uses of the engine library;
# only its entry is exported (hidden visibility, and none of the static libraries' symbols), so nothing
# in it interposes on the program's copy.
add_library(slimkv_cuda MODULE src/engine/cuda/cuda_plugin.cc)
target_link_libraries(slimkv_cuda PRIVATE slimkv_cuda_backend)
set_target_properties(slimkv_cuda PROPERTIES CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON
                      LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR})
target_link_options(slimkv_cuda PRIVATE -Wl,--exclude-libs,ALL -Wl,--no-undefined)
# Whatever can run `--device cuda` is rebuilt with its plugin, so the two never come from different sources.
foreach(user slimkv slimkv_python)
  if(TARGET ${user})
    add_dependencies(${user} slimkv_cuda)
  endif()
endforeach()
if(TARGET slimkv_python)  # the module looks beside itself: build/python/, and where it is installed
  add_custom_command(TARGET slimkv_cuda POST_BUILD
                     COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_BINARY_DIR}/python
                     COMMAND ${CMAKE_COMMAND} -E copy_if_different $<TARGET_FILE:slimkv_cuda> ${CMAKE_BINARY_DIR}/python/)
  # Built and installed, its run path is the directories of the libraries it links outside the system's
  # (libcublas under /usr/local/cuda), which cmake --install would otherwise strip, and without the empty
  # entry (the current directory) CMake pads a build tree's run path with (CMakeLists.txt, slimkv_python).
  set_target_properties(slimkv_cuda PROPERTIES BUILD_WITH_INSTALL_RPATH ON INSTALL_RPATH_USE_LINK_PATH ON)
  install(TARGETS slimkv_cuda LIBRARY DESTINATION ${SLIMKV_PYTHON_DESTINATION})
endif()

file(GLOB SLIMKV_CUDA_TEST_SOURCES CONFIGURE_DEPENDS tests/cuda/*_test.cc)
add_executable(slimkv_cuda_tests ${SLIMKV_CUDA_TEST_SOURCES})
target_link_libraries(slimkv_cuda_tests PRIVATE slimkv_cuda_backend GTest::gtest GTest::gtest_main)
add_dependencies(slimkv_cuda_tests slimkv_cuda)  # its engine tests open the plugin
target_include_directories(slimkv_cuda_tests PRIVATE tests)
target_compile_definitions(slimkv_cuda_tests PRIVATE SLIMKV_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
gtest_discover_tests(slimkv_cuda_tests DISCOVERY_TIMEOUT 60)

if(SLIMKV_BENCH)
  file(GLOB SLIMKV_CUDA_BENCH_SOURCES CONFIGURE_DEPENDS bench/cuda/*.cc)
  foreach(src ${SLIMKV_CUDA_BENCH_SOURCES})
    get_filename_component(name ${src} NAME_WE)
    add_executable(${name} ${src})
    target_link_libraries(${name} PRIVATE slimkv_cuda_backend CLI11::CLI11)
    add_dependencies(${name} slimkv_cuda)
  endforeach()
  # The step tracer (bench/cuda/step_trace/step_trace.cc), preloaded into a program: where the toolkit has CUPTI.
  if(TARGET CUDA::cupti)
    add_library(slimkv_step_trace SHARED bench/cuda/step_trace/step_trace.cc)
    target_link_libraries(slimkv_step_trace PRIVATE CUDA::cupti)
  endif()
endif()
