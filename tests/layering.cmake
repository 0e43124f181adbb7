# Fails when a folder includes a header of a folder it may not use (DESIGN.md's table): the
# arrows point down the stack, core -> graph -> planner/models/scheduler -> lower -> plan ->
# runtime -> launch -> loom (the public API) -> bench, and the runtime never includes the
# planner. No folder includes tests/. The raw config stops at plan/'s door: graph/, planner/,
# scheduler/ and lower/ take the specs plan::PlanSpec::of reads, never core/config.h. Run as
# cmake -DROOT=... -P.
cmake_minimum_required(VERSION 3.22)
set(may_use_core core)
set(may_use_checkpoint core checkpoint)
set(may_use_data core data)
set(may_use_observe core observe)
set(may_use_graph core graph)
set(may_use_planner core graph planner)
set(may_use_scheduler core scheduler)
# A model type carries its Hugging Face name map, a checkpoint value (checkpoint/hf_names.h).
set(may_use_models core graph planner checkpoint models)
set(may_use_lower core graph scheduler lower)
set(may_use_plan core graph planner scheduler models lower plan)
set(may_use_comm core comm)
# The runtime receives a Plan (lower's programs) and runs it; the block names of its traces are
# the scheduler's.
set(may_use_runtime core graph scheduler lower comm checkpoint data observe runtime)
# launch/ is where planning and running meet: it may use every library.
set(may_use_launch core checkpoint data observe graph planner scheduler models lower plan comm
                   runtime launch)
# loom/, the public API: the specs and builders it exposes, and launch/ for the trainer.
set(may_use_loom core graph planner models lower plan runtime launch loom)
# Benchmarks may use everything but the tests.
set(may_use_bench ${may_use_launch} loom bench)
set(folders core checkpoint data observe graph planner scheduler models lower plan comm runtime
            launch loom bench)
# Folders a source may name in an include: the checked ones and tests/, which none may use.
set(known ${folders} tests)

# Below plan/: no include of the raw config.
set(below_the_door graph planner scheduler lower)

set(violations "")
foreach(folder ${folders})
  if(folder STREQUAL "bench")  # each benchmark in a folder of its own
    file(GLOB_RECURSE sources ${ROOT}/${folder}/*.h ${ROOT}/${folder}/*.cc)
  else()
    file(GLOB sources ${ROOT}/${folder}/*.h ${ROOT}/${folder}/*.cc)
  endif()
  foreach(source ${sources})
    file(STRINGS ${source} includes REGEX "^#include \"[a-z_]+/")
    foreach(line ${includes})
      if(folder IN_LIST below_the_door AND line MATCHES "^#include \"core/config.h\"")
        file(RELATIVE_PATH name ${ROOT} ${source})
        string(APPEND violations "  ${name}: ${line} (the config stops at plan/'s door)\n")
      endif()
      string(REGEX REPLACE "^#include \"([a-z_]+)/.*" "\\1" used "${line}")
      if(NOT used IN_LIST known)
        continue()  # generated headers (plan.pb.h) and third-party folders
      endif()
      if(NOT used IN_LIST may_use_${folder})
        file(RELATIVE_PATH name ${ROOT} ${source})
        string(APPEND violations "  ${name}: ${line} (${folder}/ may use ${may_use_${folder}})\n")
      endif()
    endforeach()
  endforeach()
endforeach()
if(violations)
  message(FATAL_ERROR "includes up the stack:\n${violations}")
endif()
message(STATUS "layering: every folder includes only what it may use")
