# Every dependency comes from Debian's archive (scripts/install-deps).
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

if(LOOM_WITH_RUNTIME)
  find_package(Torch REQUIRED)
  # Debian's TorchConfig puts its flags in TORCH_CXX_FLAGS; keep them target-local.
  separate_arguments(LOOM_TORCH_CXX_FLAGS UNIX_COMMAND "${TORCH_CXX_FLAGS}")
endif()

# yaml-cpp 0.7 on Debian exports the target as `yaml-cpp`; newer releases as yaml-cpp::yaml-cpp.
if(TARGET yaml-cpp::yaml-cpp)
  set(LOOM_YAML yaml-cpp::yaml-cpp)
else()
  set(LOOM_YAML yaml-cpp)
endif()
