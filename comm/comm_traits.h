// What a live Comm's backend does that buffers and ordering depend on (core/run_spec.h's
// CommTraits, the same the plan's estimate reads), from its backend_name().
#pragma once

#include "comm/comm.h"
#include "core/check.h"
#include "core/run_spec.h"

namespace loom::comm {

inline CommTraits comm_traits(const Comm& comm) {
  Result<CommBackend> backend = parse_backend(comm.backend_name());
  LOOM_CHECK(backend.ok() && *backend != CommBackend::kAuto)
      << "a Comm whose backend has no traits: " << comm.backend_name();
  return CommTraits::of(*backend);
}

}  // namespace loom::comm
