#include "runtime/oracle.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <map>
#include <sstream>

#include "core/check.h"
#include "runtime/init.h"

namespace loom::runtime {

at::Tensor cut_piece(const at::Tensor& full, const graph::SubTensor& piece) {
  at::Tensor t = full;
  for (size_t d = 0; d < piece.ranges.size(); ++d)
    t = t.slice(static_cast<int64_t>(d), piece.ranges[d].start, piece.ranges[d].end);
  if (piece.value_chunks > 1) t = t / static_cast<double>(piece.value_chunks);
  return t;
}

std::vector<at::Tensor> reference_values(const graph::Graph& single, const KernelRegistry& kernels,
                                         uint64_t seed,
                                         const std::unordered_map<int64_t, at::Tensor>& inputs) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> env(single.tensors().size());
  for (const auto& [id, t] : inputs) env[static_cast<size_t>(id)] = t;
  std::vector<at::Tensor> args;
  for (const graph::Op& op : single.ops()) {
    const Kernel* kernel = kernels.find(op.type());
    LOOM_CHECK(kernel) << "no kernel registered for op type '" << op.type() << "' (op " << op.name()
                       << ")";
    args.clear();
    for (const auto& in : op.inputs) {
      at::Tensor& v = env[static_cast<size_t>(in.tensor.value())];
      const graph::FullTensor& t = single.tensor(in.tensor);
      if (!v.defined() && t.role == graph::TensorRole::kParameter)
        v = init_parameter_piece(t, in, seed);
      LOOM_CHECK(v.defined()) << "op " << op.name() << " reads '" << t.name
                              << "' which has no value";
      args.push_back(v);
    }
    std::vector<at::Tensor> outs = (*kernel)(KernelContext{single, op}, args);
    LOOM_CHECK(outs.size() == op.outputs.size())
        << "kernel of " << op.type() << " returned " << outs.size() << " outputs";
    for (size_t o = 0; o < outs.size(); ++o)
      env[static_cast<size_t>(op.outputs[o].tensor.value())] = std::move(outs[o]);
  }
  return env;
}

namespace {

std::string key_of(const graph::SubTensor& s) { return s.tensor.to_string() + s.ranges_string(); }

double rel_error(const at::Tensor& got, const at::Tensor& want) {
  if (got.sizes() != want.sizes()) return 1e30;
  double scale = std::max(want.abs().max().item<double>(), 1e-6);
  return (got - want).abs().max().item<double>() / scale;
}

}  // namespace

namespace {

// Runs every sub-op of a plan on its pieces of the single-device values and collects where
// its outputs differ: whole pieces at once, partial pieces once all their value chunks are in.
class OpsCheck {
 public:
  OpsCheck(const graph::Graph& planned, const std::vector<at::Tensor>& full,
           const KernelRegistry& kernels, double tolerance)
      : planned_(planned), full_(full), kernels_(kernels), tolerance_(tolerance) {}

  OracleReport run() {
    for (size_t index = 0; index < planned_.ops().size(); ++index) check_op(index);
    check_partials();
    std::stable_sort(found_.begin(), found_.end(),
                     [](const Found& a, const Found& b) { return a.index < b.index; });
    for (const Found& f : found_) report_.mismatches.push_back(f.message);
    if (!found_.empty()) {
      report_.first_op = found_.front().op;
      report_.first_piece = found_.front().piece;
    }
    return report_;
  }

 private:
  // Value chunks of one piece: chunk index -> (its value, the sub-op that made it), and the
  // first sub-op (in program order) that made one.
  struct Chunks {
    const graph::SubTensor* piece = nullptr;
    std::map<int64_t, std::pair<at::Tensor, std::string>> parts;
    size_t first_index = 0;
    const graph::Op* first_op = nullptr;
  };
  // Mismatches by the program index of the sub-op they name, so the first is the earliest.
  struct Found {
    size_t index;
    std::string op, piece, message;
  };

  std::string piece_name(const graph::SubTensor& s) const {
    return planned_.tensor(s.tensor).name + s.ranges_string();
  }

  void mismatch(size_t index, const graph::Op& op, const graph::SubTensor& s,
                const std::string& what) {
    std::ostringstream os;
    os << "op " << op.name() << " (" << op.type() << ", device " << op.device << "): output '"
       << planned_.tensor(s.tensor).name << "' piece " << s.ranges_string() << " " << what;
    found_.push_back({index, op.name(), piece_name(s), os.str()});
  }

  // Sub-op `index` on its input pieces: each whole output against the single-device value,
  // each partial one kept for check_partials (a chunk made twice, by a replica, must be made
  // identically).
  void check_op(size_t index) {
    const graph::Op& op = planned_.ops()[index];
    const Kernel* kernel = kernels_.find(op.type());
    if (!kernel) {
      found_.push_back(
          {index, op.name(), "", "op " + op.name() + ": no kernel for type '" + op.type() + "'"});
      return;
    }
    std::vector<at::Tensor> args;
    for (const auto& in : op.inputs) args.push_back(cut_piece(full_[in.tensor.value()], in));
    std::vector<at::Tensor> outs = (*kernel)(KernelContext{planned_, op}, args);
    ++report_.ops_checked;
    for (size_t o = 0; o < op.outputs.size(); ++o) {
      const graph::SubTensor& s = op.outputs[o];
      if (!s.is_partial()) {
        double err = rel_error(outs[o], cut_piece(full_[s.tensor.value()], s));
        ++report_.pieces_checked;
        if (err > tolerance_)
          mismatch(index, op, s, "differs from the single-device run by " + std::to_string(err));
        continue;
      }
      graph::SubTensor whole = s;
      whole.value_chunk = 0;
      std::string key = key_of(whole) + "/" + std::to_string(s.value_chunks);
      Chunks& c = partial_[key];
      if (!c.first_op) {
        c.first_op = &op;
        c.first_index = index;
      }
      c.piece = &s;
      auto [it, fresh] = c.parts.emplace(s.value_chunk, std::make_pair(outs[o], op.name()));
      if (!fresh && rel_error(outs[o], it->second.first) > tolerance_)
        mismatch(index, op, s, "differs from its replica made by " + it->second.second);
    }
  }

  // Each partial piece: all its value chunks are made, and they add up to the single-device
  // value.
  void check_partials() {
    for (const auto& [key, c] : partial_) {
      graph::SubTensor whole = *c.piece;
      whole.value_chunk = 0;
      whole.value_chunks = 1;
      if (static_cast<int64_t>(c.parts.size()) != c.piece->value_chunks) {
        found_.push_back({c.first_index, c.first_op->name(), piece_name(whole),
                          "piece " + key + " ('" + piece_name(whole) + "', first made by op " +
                              c.first_op->name() + "): " + std::to_string(c.parts.size()) + " of " +
                              std::to_string(c.piece->value_chunks) + " value chunks are made"});
        continue;
      }
      at::Tensor sum;
      for (const auto& [i, part] : c.parts) sum = sum.defined() ? sum + part.first : part.first;
      ++report_.pieces_checked;
      double err = rel_error(sum, cut_piece(full_[whole.tensor.value()], whole));
      if (err > tolerance_)
        found_.push_back({c.first_index, c.first_op->name(), piece_name(whole),
                          "op " + c.first_op->name() + " (" + c.first_op->type() +
                              ") and the ops making the other value chunks of '" +
                              piece_name(whole) +
                              "': the chunks add up to values that differ from the " +
                              "single-device run by " + std::to_string(err)});
    }
  }

  const graph::Graph& planned_;
  const std::vector<at::Tensor>& full_;
  const KernelRegistry& kernels_;
  const double tolerance_;
  OracleReport report_;
  std::map<std::string, Chunks> partial_;
  std::vector<Found> found_;
};

}  // namespace

OracleReport check_plan_ops(const graph::Graph& planned, const std::vector<at::Tensor>& full,
                            const KernelRegistry& kernels, double tolerance) {
  LOOM_CHECK(full.size() == planned.tensors().size())
      << full.size() << " values for " << planned.tensors().size() << " planned tensors";
  at::NoGradGuard no_grad;
  return OpsCheck(planned, full, kernels, tolerance).run();
}

}  // namespace loom::runtime
