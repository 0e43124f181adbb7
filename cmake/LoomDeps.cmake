# Every dependency comes from Debian's archive (scripts/install-deps) except LibTorch, which is the
# one in the pinned torch wheel (scripts/torch-env; scripts/build passes its CMAKE_PREFIX_PATH;
# scripts/gpu-check passes the GPU machine's own torch).

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
                      "the one scripts/install-deps installs) avoids that.")
    endif()
  endif()
endmacro()
# TorchConfig finds some of LibTorch's libraries (torch, c10, c10_cuda, kineto) with
# find_library, which searches the system's folders before the wheel's: a LibTorch installed
# system-wide (Debian's libtorch-dev) would be mixed into the build. The wheel's are named here
# first, where CMAKE_PREFIX_PATH says the wheel is.
macro(loom_pin_torch_libraries)
  find_file(LOOM_TORCH_CONFIG Torch/TorchConfig.cmake PATHS ${CMAKE_PREFIX_PATH} NO_DEFAULT_PATH)
  if(LOOM_TORCH_CONFIG)
    get_filename_component(_loom_torch_lib "${LOOM_TORCH_CONFIG}/../../../../lib" ABSOLUTE)
    find_library(TORCH_LIBRARY torch PATHS ${_loom_torch_lib} NO_DEFAULT_PATH)
    find_library(c10_LIBRARY c10 PATHS ${_loom_torch_lib} NO_DEFAULT_PATH)
    find_library(C10_CUDA_LIBRARY c10_cuda PATHS ${_loom_torch_lib} NO_DEFAULT_PATH)
    find_library(kineto_LIBRARY kineto PATHS ${_loom_torch_lib} NO_DEFAULT_PATH)
  endif()
endmacro()

# The CPU-only variant: LibTorch's CPU libraries (libtorch_cpu, libc10) of the same wheel, without
# TorchConfig, whose CUDA part needs the toolkit. Sets what find_package(Torch) would.
macro(loom_find_torch_cpu_only)
  find_file(LOOM_TORCH_CONFIG Torch/TorchConfig.cmake PATHS ${CMAKE_PREFIX_PATH} NO_DEFAULT_PATH)
  if(NOT LOOM_TORCH_CONFIG)
    message(FATAL_ERROR "LibTorch not found: CMAKE_PREFIX_PATH must hold the torch wheel's "
                        "share/cmake (scripts/build passes it; scripts/torch-env says where)")
  endif()
  get_filename_component(Torch_DIR "${LOOM_TORCH_CONFIG}" DIRECTORY)
  get_filename_component(_loom_torch_root "${Torch_DIR}/../../.." ABSOLUTE)
  set(Torch_VERSION "")
  foreach(part MAJOR MINOR PATCH)
    file(STRINGS "${_loom_torch_root}/include/torch/headeronly/version.h" _loom_line
         REGEX "#define TORCH_VERSION_${part} ")
    string(REGEX MATCH "[0-9]+$" _loom_n "${_loom_line}")
    string(APPEND Torch_VERSION "${_loom_n}.")
  endforeach()
  string(REGEX REPLACE "\\.$" "" Torch_VERSION "${Torch_VERSION}")
  set(TORCH_CXX_FLAGS "")  # torch 2.x wheels use the new C++ ABI, as Debian's libraries do
  add_library(loom_torch_cpu INTERFACE IMPORTED)
  set_target_properties(loom_torch_cpu PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES
      "${_loom_torch_root}/include;${_loom_torch_root}/include/torch/csrc/api/include"
    INTERFACE_COMPILE_DEFINITIONS "USE_DISTRIBUTED;USE_C10D_GLOO"
    INTERFACE_LINK_LIBRARIES
      "${_loom_torch_root}/lib/libtorch_cpu.so;${_loom_torch_root}/lib/libc10.so")
  set(TORCH_LIBRARIES loom_torch_cpu)
  set(TORCH_INCLUDE_DIRS "${_loom_torch_root}/include")
  set(TORCH_INSTALL_PREFIX "${_loom_torch_root}")
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
  # The torch wheel's LibTorch (CMAKE_PREFIX_PATH from
  # `python -c 'import torch.utils; print(torch.utils.cmake_prefix_path)'`). A CUDA wheel's
  # TorchConfig needs the CUDA toolkit of its major version (nvcc) and enables CUDA itself; with
  # LOOM_CUDA=OFF (a machine without the toolkit) loom takes the wheel's CPU libraries alone.
  if(LOOM_CUDA STREQUAL "OFF")
    loom_find_torch_cpu_only()
  else()
    loom_pin_torch_libraries()
    find_package(Torch REQUIRED)
  endif()
  # TorchConfig puts its flags in TORCH_CXX_FLAGS; keep them target-local.
  separate_arguments(LOOM_TORCH_CXX_FLAGS UNIX_COMMAND "${TORCH_CXX_FLAGS}")
  if(TORCH_CUDA_LIBRARIES OR TARGET torch_cuda OR TARGET c10_cuda)
    set(LOOM_TORCH_CUDA 1)
  endif()
  message(STATUS "loom: LibTorch ${Torch_VERSION} at ${Torch_DIR} (CUDA: ${LOOM_TORCH_CUDA})")
  if(Torch_VERSION VERSION_LESS 2.0)
    message(FATAL_ERROR "LibTorch ${Torch_VERSION} at ${Torch_DIR}: loom needs LibTorch 2.x, the "
                        "one in the torch wheel scripts/install-deps installs (scripts/torch-env)")
  endif()
  # One CUDA runtime per process: the wheel's (site-packages/nvidia/...), the one libtorch_cuda
  # loads, never the toolkit's copy of the same soname that LibTorch's CMake files would link.
  set(LOOM_NVIDIA_ROOT "" CACHE PATH
      "site-packages/nvidia of the torch wheel: NCCL and cudart come from there (empty: found from Torch_DIR)")
  set(LOOM_NVIDIA_DIR "${LOOM_NVIDIA_ROOT}")
  if(NOT LOOM_NVIDIA_DIR AND Torch_DIR MATCHES "^(.*)/torch/share/cmake/Torch/?$")
    set(_loom_site "${CMAKE_MATCH_1}")  # (expanded only after the match: two steps)
    if(EXISTS "${_loom_site}/nvidia")
      set(LOOM_NVIDIA_DIR "${_loom_site}/nvidia")
    endif()
  endif()
  if(LOOM_TORCH_CUDA AND LOOM_NVIDIA_DIR)
    # CUDA 13 wheels keep the runtime in nvidia/cu13, CUDA 12 ones in nvidia/cuda_runtime. Wheels
    # ship only versioned sonames.
    find_library(LOOM_CUDART_LIBRARY NAMES libcudart.so.13 libcudart.so.12
                 PATHS ${LOOM_NVIDIA_DIR}/cu13/lib ${LOOM_NVIDIA_DIR}/cuda_runtime/lib NO_DEFAULT_PATH)
    if(LOOM_CUDART_LIBRARY AND TARGET torch::cudart)
      find_package(CUDAToolkit REQUIRED)
      set_property(TARGET torch::cudart PROPERTY INTERFACE_LINK_LIBRARIES ${LOOM_CUDART_LIBRARY})
      set_property(TARGET torch::cudart PROPERTY INTERFACE_INCLUDE_DIRECTORIES
                   ${CUDAToolkit_INCLUDE_DIRS})
    endif()
    # TORCH_LIBRARIES names the toolkit's libnvrtc, which loom never calls (libtorch_cuda loads
    # the wheel's own): linked, its folder would put the toolkit's libcudart on the search path.
    if(CUDA_NVRTC_LIB)
      list(REMOVE_ITEM TORCH_LIBRARIES "${CUDA_NVRTC_LIB}")
    endif()
  endif()
  loom_set_cxx11_abi()
  # The wheel's LibTorch carries parts of libstdc++ that its manylinux toolchain adds to an older
  # base (std::filesystem among them) and exports them. A binary that loads libstdc++ after
  # LibTorch binds those calls to LibTorch's copies, whose layout is not its headers': the first
  # std::filesystem call crashes. Every binary of loom loads libstdc++ first.
  # (Inside one -Wl: a bare -lstdc++ is the compiler driver's to move, and some drivers do.)
  set(LOOM_STDCXX_FIRST "LINKER:--push-state,--no-as-needed,-l:libstdc++.so.6,--pop-state")
  add_link_options(${LOOM_STDCXX_FIRST})
endif()

# yaml-cpp 0.7 on Debian exports the target as `yaml-cpp`; newer releases as yaml-cpp::yaml-cpp.
if(TARGET yaml-cpp::yaml-cpp)
  set(LOOM_YAML yaml-cpp::yaml-cpp)
else()
  set(LOOM_YAML yaml-cpp)
endif()
