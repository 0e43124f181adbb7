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

OracleReport check_plan_ops(const graph::Graph& planned, const std::vector<at::Tensor>& full,
                            const KernelRegistry& kernels, double tolerance) {
  LOOM_CHECK(full.size() == planned.tensors().size())
      << full.size() << " values for " << planned.tensors().size() << " planned tensors";
  at::NoGradGuard no_grad;
  OracleReport report;
  // Value chunks of one piece: chunk index -> (its value, the sub-op that made it), and the
  // first sub-op (in program order) that made one.
  struct Chunks {
    const graph::SubTensor* piece = nullptr;
    std::map<int64_t, std::pair<at::Tensor, std::string>> parts;
    size_t first_index = 0;
    const graph::Op* first_op = nullptr;
  };
  std::map<std::string, Chunks> partial;
  // Mismatches by the program index of the sub-op they name, so the first is the earliest.
  struct Found {
    size_t index;
    std::string op, piece, message;
  };
  std::vector<Found> found;
  auto piece_name = [&](const graph::SubTensor& s) {
    return planned.tensor(s.tensor).name + s.ranges_string();
  };
  auto mismatch = [&](size_t index, const graph::Op& op, const graph::SubTensor& s,
                      const std::string& what) {
    std::ostringstream os;
    os << "op " << op.name() << " (" << op.type() << ", device " << op.device << "): output '"
       << planned.tensor(s.tensor).name << "' piece " << s.ranges_string() << " " << what;
    found.push_back({index, op.name(), piece_name(s), os.str()});
  };

  for (size_t index = 0; index < planned.ops().size(); ++index) {
    const graph::Op& op = planned.ops()[index];
    const Kernel* kernel = kernels.find(op.type());
    if (!kernel) {
      found.push_back(
          {index, op.name(), "", "op " + op.name() + ": no kernel for type '" + op.type() + "'"});
      continue;
    }
    std::vector<at::Tensor> args;
    for (const auto& in : op.inputs) args.push_back(cut_piece(full[in.tensor.value()], in));
    std::vector<at::Tensor> outs = (*kernel)(KernelContext{planned, op}, args);
    ++report.ops_checked;
    for (size_t o = 0; o < op.outputs.size(); ++o) {
      const graph::SubTensor& s = op.outputs[o];
      if (!s.is_partial()) {
        double err = rel_error(outs[o], cut_piece(full[s.tensor.value()], s));
        ++report.pieces_checked;
        if (err > tolerance)
          mismatch(index, op, s, "differs from the single-device run by " + std::to_string(err));
        continue;
      }
      // Partial pieces are checked once all chunks are in; a chunk made twice (a replica) must
      // be made identically.
      graph::SubTensor whole = s;
      whole.value_chunk = 0;
      std::string key = key_of(whole) + "/" + std::to_string(s.value_chunks);
      Chunks& c = partial[key];
      if (!c.first_op) {
        c.first_op = &op;
        c.first_index = index;
      }
      c.piece = &s;
      auto [it, fresh] = c.parts.emplace(s.value_chunk, std::make_pair(outs[o], op.name()));
      if (!fresh && rel_error(outs[o], it->second.first) > tolerance)
        mismatch(index, op, s, "differs from its replica made by " + it->second.second);
    }
  }
  for (const auto& [key, c] : partial) {
    graph::SubTensor whole = *c.piece;
    whole.value_chunk = 0;
    whole.value_chunks = 1;
    if (static_cast<int64_t>(c.parts.size()) != c.piece->value_chunks) {
      found.push_back({c.first_index, c.first_op->name(), piece_name(whole),
                       "piece " + key + " ('" + piece_name(whole) + "', first made by op " +
                           c.first_op->name() + "): " + std::to_string(c.parts.size()) + " of " +
                           std::to_string(c.piece->value_chunks) + " value chunks are made"});
      continue;
    }
    at::Tensor sum;
    for (const auto& [i, part] : c.parts) sum = sum.defined() ? sum + part.first : part.first;
    ++report.pieces_checked;
    double err = rel_error(sum, cut_piece(full[whole.tensor.value()], whole));
    if (err > tolerance)
      found.push_back({c.first_index, c.first_op->name(), piece_name(whole),
                       "op " + c.first_op->name() + " (" + c.first_op->type() + ") and the ops " +
                           "making the other value chunks of '" + piece_name(whole) +
                           "': the chunks add up to values that differ from the single-device " +
                           "run by " + std::to_string(err)});
  }
  std::stable_sort(found.begin(), found.end(),
                   [](const Found& a, const Found& b) { return a.index < b.index; });
  for (const Found& f : found) report.mismatches.push_back(f.message);
  if (!found.empty()) {
    report.first_op = found.front().op;
    report.first_piece = found.front().piece;
  }
  return report;
}

}  // namespace loom::runtime
