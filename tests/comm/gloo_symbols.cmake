# ctest comm.gloo_links_only_libtorch: loom's gloo backend compiles against gloo's headers (Debian's
# libgloo-dev) only to declare the types LibTorch's ProcessGroupGloo.hpp names. That is sound as
# long as loom's own code holds no gloo code or layout: then the gloo that runs is the one inside
# libtorch_cpu, whatever version the headers are. This checks it on the built objects:
#   1. no object of loom_comm defines a gloo symbol: no gloo function, vtable or type info, and
#      no shared_ptr control block that would destroy a gloo object with the headers' layout;
#   2. every gloo and ProcessGroupGloo symbol loom_comm uses is defined by libtorch_cpu;
#   3. no binary of loom links a libgloo.
# Arguments: -DNM=nm -DLDD=ldd -DLIB=libloom_comm.a -DTORCH_CPU=libtorch_cpu.so -DBIN=bin/loom
foreach(var NM LIB TORCH_CPU BIN LDD)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "gloo_symbols.cmake needs -D${var}=...")
  endif()
endforeach()

execute_process(COMMAND ${NM} -C --defined-only ${LIB} OUTPUT_VARIABLE defined RESULT_VARIABLE rc
                ERROR_QUIET)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${NM} ${LIB} failed")
endif()
string(REPLACE "\n" ";" defined "${defined}")
set(own "")
foreach(line IN LISTS defined)
  # "0000000000000000 W name": the name starts at the third field.
  string(REGEX REPLACE "^[0-9a-f]* *[A-Za-z] " "" name "${line}")
  if(name MATCHES "^((vtable|typeinfo|typeinfo name|VTT|construction vtable) for )?gloo::"
     OR name MATCHES "_Sp_counted_[a-z_]*<gloo::")
    list(APPEND own "${name}")
  endif()
endforeach()
if(own)
  string(REPLACE ";" "\n  " own "${own}")
  message(FATAL_ERROR "loom_comm defines gloo code of its own (built from gloo's headers, whose "
                      "version need not be LibTorch's):\n  ${own}")
endif()

execute_process(COMMAND ${NM} -C --undefined-only ${LIB} OUTPUT_VARIABLE used ERROR_QUIET)
execute_process(COMMAND ${NM} -C -D --defined-only ${TORCH_CPU} OUTPUT_VARIABLE torch_defs
                ERROR_QUIET)
string(REPLACE "\n" ";" used "${used}")
set(count 0)
set(missing "")
foreach(line IN LISTS used)
  string(REGEX REPLACE "^ *U " "" name "${line}")
  if(name MATCHES "^(gloo::|c10d::ProcessGroupGloo)")
    math(EXPR count "${count} + 1")
    string(FIND "${torch_defs}" " ${name}\n" at)
    if(at EQUAL -1)
      list(APPEND missing "${name}")
    endif()
  endif()
endforeach()
if(count EQUAL 0)
  message(FATAL_ERROR "loom_comm uses no ProcessGroupGloo symbol: is the gloo backend built?")
endif()
if(missing)
  string(REPLACE ";" "\n  " missing "${missing}")
  message(FATAL_ERROR "gloo symbols loom_comm uses that ${TORCH_CPU} does not define:\n  ${missing}")
endif()

execute_process(COMMAND ${LDD} ${BIN} OUTPUT_VARIABLE libs ERROR_QUIET)
if(libs MATCHES "libgloo")
  message(FATAL_ERROR "${BIN} links a libgloo besides LibTorch's own gloo:\n${libs}")
endif()
message(STATUS "loom_comm: no gloo code of its own; ${count} gloo symbols, all from ${TORCH_CPU}")
