# loom_library(NAME SOURCES a.cc b.cc DEPS loom_core ...)
#   One static library per folder. The repository root is the include root, so headers are
#   included as "core/result.h", "graph/graph.h", ...
function(loom_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS;PRIVATE_DEPS" ${ARGN})
  add_library(${name} STATIC ${ARG_SOURCES})
  target_include_directories(${name} PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}>
                                            $<BUILD_INTERFACE:${PROJECT_BINARY_DIR}/generated>)
  target_link_libraries(${name} PUBLIC ${ARG_DEPS} PRIVATE ${ARG_PRIVATE_DEPS})
  loom_warnings(${name})
endfunction()

# loom_test(NAME SOURCES ... DEPS ... [LABELS ...] [TIMEOUT s])
#   A GoogleTest executable whose tests are each registered with ctest, each run in a temporary
#   directory of its own (tests/support/private_temp_dir.cc).
function(loom_test name)
  cmake_parse_arguments(ARG "" "TIMEOUT" "SOURCES;DEPS;LABELS" ${ARGN})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 120)
  endif()
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} loom_test_temp_dir GTest::gtest
                                        GTest::gtest_main)
  target_compile_definitions(${name} PRIVATE LOOM_SOURCE_DIR="${PROJECT_SOURCE_DIR}"
                                             LOOM_BINARY_DIR="${PROJECT_BINARY_DIR}")
  loom_warnings(${name})
  # Tests plan with the verifier after every transform, as debug builds do (core/debug_env.h).
  # One label: gtest_discover_tests passes its properties as a flat list, so a second label would
  # be read as a property name and dropped (scripts/test-numerics selects `numerical`).
  list(LENGTH ARG_LABELS labels)
  if(labels GREATER 1)
    message(FATAL_ERROR "loom_test(${name}): one label, got ${ARG_LABELS}")
  endif()
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60
                       PROPERTIES ENVIRONMENT "LOOM_VERIFY_EACH_TRANSFORM=1" TIMEOUT ${ARG_TIMEOUT}
                                  LABELS "${ARG_LABELS}")
endfunction()

function(loom_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wno-unused-parameter)
  if(LOOM_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()

# loom_bench(NAME SOURCES ... DEPS ...): a benchmark executable, plus a ctest entry that runs it
# with --quick so it keeps working (its figures are read by people, never asserted).
function(loom_bench name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  add_executable(bench_${name} ${ARG_SOURCES})
  target_link_libraries(bench_${name} PRIVATE ${ARG_DEPS})
  loom_warnings(bench_${name})
  if(LOOM_BUILD_TESTS)
    add_test(NAME bench.${name}.smoke COMMAND bench_${name} --quick)
    set_tests_properties(bench.${name}.smoke PROPERTIES TIMEOUT 300 LABELS bench)
  endif()
endfunction()
