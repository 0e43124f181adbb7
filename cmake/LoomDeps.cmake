# Every dependency comes from Debian's archive (scripts/install-deps), LibTorch too unless
# CMAKE_PREFIX_PATH points at another (scripts/gpu-check: the GPU machine's Python torch).

# std::string and std::list differ between the old and the new C++ ABI of libstdc++; every
# library of loom must use the one LibTorch was built with, also those that never include it,
# since they pass strings to each other. TORCH_CXX_FLAGS says which; a Python torch also says
# it as torch._C._GLIBCXX_USE_CXX11_ABI (scripts/gpu-check passes that as LOOM_CXX11_ABI).
set(LOOM_CXX11_ABI "" CACHE STRING "_GLIBCXX_USE_CXX11_ABI for all of loom: 0, 1 or empty (LibTorch's)")
macro(loom_set_cxx11_abi)
  set(_loom_abi "")
  if(TORCH_CXX_FLAGS MATCHES "_GLIBCXX_USE_CXX11_ABI=([01])")
    set(_loom_abi ${CMAKE_MATCH_1})
  endif()
  if(NOT LOOM_CXX11_ABI STREQUAL "")
    if(NOT _loom_abi STREQUAL "" AND NOT _loom_abi STREQUAL LOOM_CXX11_ABI)
      message(FATAL_ERROR "LOOM_CXX11_ABI=${LOOM_CXX11_ABI}, but LibTorch at ${Torch_DIR} was "
                          "built with _GLIBCXX_USE_CXX11_ABI=${_loom_abi}")
    endif()
    set(_loom_abi ${LOOM_CXX11_ABI})
  endif()
  if(NOT _loom_abi STREQUAL "")
    add_compile_definitions(_GLIBCXX_USE_CXX11_ABI=${_loom_abi})
    message(STATUS "loom: _GLIBCXX_USE_CXX11_ABI=${_loom_abi} (LibTorch's C++ ABI) for all of loom")
    if(_loom_abi STREQUAL "0")
      message(WARNING "LibTorch uses the old C++ ABI (_GLIBCXX_USE_CXX11_ABI=0), while Debian's "
                      "yaml-cpp, spdlog, fmt and protobuf use the new one: linking them may fail "
                      "on std::string symbols. A LibTorch with the new ABI (torch >= 2.7 wheels, "
                      "Debian's libtorch-dev) avoids that.")
    endif()
  endif()
endmacro()
find_package(yaml-cpp REQUIRED)
find_package(fmt REQUIRED)
find_package(spdlog REQUIRED)
find_package(CLI11 REQUIRED)
find_package(nlohmann_json REQUIRED)
find_package(Protobuf REQUIRED)
find_package(Threads REQUIRED)
if(LOOM_BUILD_TESTS)
  find_package(GTest REQUIRED)
  include(GoogleTest)
endif()
if(LOOM_BUILD_BENCH)
  find_package(benchmark QUIET)
endif()

set(LOOM_TORCH_CUDA 0)
if(LOOM_WITH_RUNTIME)
  # Debian's libtorch-dev (1.13, CPU) or a Python torch 2.x (CMAKE_PREFIX_PATH from
  # `python3 -c 'import torch; print(torch.utils.cmake_prefix_path)'`; a CUDA build of it needs
  # the CUDA toolkit's nvcc, and enables CMake's CUDA language itself).
  find_package(Torch REQUIRED)
  # TorchConfig puts its flags in TORCH_CXX_FLAGS; keep them target-local.
  separate_arguments(LOOM_TORCH_CXX_FLAGS UNIX_COMMAND "${TORCH_CXX_FLAGS}")
  if(TORCH_CUDA_LIBRARIES OR TARGET torch_cuda OR TARGET c10_cuda)
    set(LOOM_TORCH_CUDA 1)
  endif()
  message(STATUS "loom: LibTorch ${Torch_VERSION} at ${Torch_DIR} (CUDA: ${LOOM_TORCH_CUDA})")
  loom_set_cxx11_abi()
endif()

# yaml-cpp 0.7 on Debian exports the target as `yaml-cpp`; newer releases as yaml-cpp::yaml-cpp.
if(TARGET yaml-cpp::yaml-cpp)
  set(LOOM_YAML yaml-cpp::yaml-cpp)
else()
  set(LOOM_YAML yaml-cpp)
endif()
