// Transforms applied the checked way (LLVM's verifier after every pass, here after every
// transform). A policy makes one Rewriter and applies each transform through it; when the mode
// is kEachTransform (debug builds, tests, LOOM_VERIFY_EACH_TRANSFORM=1) each transform is checked
// as soon as it runs, and a failure names the pass, the transform and the op:
//   tp policy: partition(op 'h0.mlp.fc1', dim n, 2) left 'h0.mlp.h' unproducible: ...
// A transform of one op (partition, replicate, a policy's own rewrite) is checked on what it
// touched: each new op satisfies its annotation (verify_op), reads only within what the old op
// read, writes only within what it wrote, and together the new ops write all of it. A graph the
// verifier accepted therefore stays accepted, and the checks cost time linear in the plan
// (verifying the whole graph after every op would be quadratic). A transform of the whole graph
// is followed by the whole-graph verifier, once.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/result.h"
#include "graph/graph.h"

namespace loom::graph {

enum class VerifyMode {
  kOff,            // no checks here: the caller verifies the finished graph (release builds)
  kEachTransform,  // every transform checked as it runs
};

// kEachTransform in debug builds, kOff in release builds; LOOM_VERIFY_EACH_TRANSFORM=1 (or 0)
// turns it on (off) in either.
VerifyMode default_verify_mode();

class Rewriter {
 public:
  // A one-op transform: `op` becomes the ops it returns.
  using OpTransform = std::function<Result<std::vector<Op>>(const Op& op)>;

  // `graph` holds the tensors the transformed ops read and write (for checks and messages);
  // `pass` says who transforms, e.g. "tp policy".
  Rewriter(const Graph& graph, std::string pass, VerifyMode mode);

  VerifyMode mode() const { return mode_; }
  const std::string& pass() const { return pass_; }

  // graph/transform.h's split_op and replicate_op, checked. A split the annotation refuses
  // returns split_op's error as it is.
  Result<std::vector<Op>> partition(const Op& op, const std::string& label, int64_t n) const;
  Result<std::vector<Op>> replicate(const Op& op, int64_t n) const;
  // Places `op` on `device` of `devices`, in pipeline stage `stage` of `stages`.
  Status assign(Op& op, DeviceId device, int64_t devices) const;
  Status stage(Op& op, StageId stage, int64_t stages) const;
  // A transform of one op that the pass writes itself; `name` and `args` describe it in errors
  // as "name(op 'x', args)".
  Result<std::vector<Op>> rewrite(const std::string& name, const std::string& args, const Op& op,
                                  const OpTransform& transform) const;
  // A transform of the whole graph, followed by graph::verify (without an op registry).
  Result<Graph> apply(const std::string& name, const Graph& graph,
                      const std::function<Result<Graph>(const Graph&)>& transform) const;

 private:
  // `parts` as a refinement of `op`; errors start with "<pass>: <transform>".
  Status check_parts(const std::string& transform, const Op& op,
                     const std::vector<Op>& parts) const;
  std::string describe(const std::string& name, const Op& op, const std::string& args) const;

  const Graph* graph_;
  std::string pass_;
  VerifyMode mode_;
};

}  // namespace loom::graph
