#include "lower/plan_file.h"

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string_view>

#include "core/check.h"
#include "core/plan.pb.h"
#include "lower/plan_json_writer.h"

#ifndef LOOM_VERSION_STRING
#define LOOM_VERSION_STRING "unknown"
#endif

namespace loom::lower {
namespace {

namespace pb = loom::planpb;
constexpr const char* kFormat = "loom-plan";
// Bounds that no plan loom makes comes near: a damaged file cannot make the runtime index past
// its tables (micro-batches: the message tags' limit, kMaxMicroBatches of program.h).
constexpr int64_t kMaxStages = 1 << 20;

// FNV-1a, 64 bits: stable across builds and platforms (std::hash is not).
uint64_t fnv1a(std::string_view text, uint64_t h = 1469598103934665603ull) {
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

// The reader has checked the kind is one of the enum's values.
BlockKind from_proto(pb::Block::Kind kind) {
  switch (kind) {
    case pb::Block::BACKWARD:
      return BlockKind::kB;
    case pb::Block::INPUT_GRAD:
      return BlockKind::kI;
    case pb::Block::WEIGHT_GRAD:
      return BlockKind::kW;
    default:
      return BlockKind::kF;
  }
}

std::string hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// The seal is plan.json's first member, so it is found and removed without parsing: what it
// covers is exactly the printer's bytes with the seal absent.
constexpr std::string_view kSealOpen = "{\"seal\":\"";
constexpr size_t kSealDigits = 16;
constexpr size_t kSealedPrefix = kSealOpen.size() + kSealDigits + 2;  // {"seal":"<16 hex>",

struct Unsealed {
  std::string json;  // the text with the seal member removed
  std::string seal;  // empty when the text has none
};

Unsealed unseal(const std::string& text) {
  if (text.size() > kSealedPrefix && text.compare(0, kSealOpen.size(), kSealOpen) == 0 &&
      text.compare(kSealOpen.size() + kSealDigits, 2, "\",") == 0)
    return {"{" + text.substr(kSealedPrefix), text.substr(kSealOpen.size(), kSealDigits)};
  return {text, ""};
}

// Trailing whitespace is not covered: an editor that adds a final newline changes no plan.
std::string seal_of(std::string_view unsealed) {
  size_t end = unsealed.find_last_not_of(" \t\r\n");
  return hex(fnv1a(unsealed.substr(0, end == std::string_view::npos ? 0 : end + 1)));
}

// ---- from proto: every index is checked, so a damaged file is an error, not a crash ---------

class Reader {
 public:
  explicit Reader(std::string source) : source_(std::move(source)) {}

  Error bad(const std::string& field, const std::string& what) const {
    return Error::at(source_, source_ + ": malformed plan: " + field + ": " + what);
  }

  Status in_range(int64_t value, int64_t size, const std::string& field) const {
    if (value < 0 || value >= size)
      return bad(field,
                 std::to_string(value) + " is out of range [0, " + std::to_string(size) + ")");
    return Status::success();
  }

  Result<graph::SubTensor> sub(const pb::SubTensor& p, int64_t tensors,
                               const std::string& field) const {
    LOOM_TRY(in_range(p.tensor(), tensors, field + ".tensor"));
    graph::SubTensor s;
    s.tensor = TensorId(p.tensor());
    for (const auto& r : p.ranges()) s.ranges.push_back({r.start(), r.end()});
    s.value_chunk = p.value_chunk();
    s.value_chunks = p.value_chunks();
    if (s.value_chunks < 1 || s.value_chunk >= s.value_chunks || s.value_chunk < 0)
      return bad(field, "value chunk " + std::to_string(s.value_chunk) + " of " +
                            std::to_string(s.value_chunks));
    return s;
  }

  Result<Layout> layout(const pb::Layout& p, int64_t world, const std::string& field) const {
    Layout l;
    l.r = p.r();
    l.v = p.v();
    l.d.assign(p.d().begin(), p.d().end());
    for (int64_t d : p.devices()) {
      LOOM_TRY(in_range(d, world, field + ".devices"));
      l.devices.emplace_back(d);
    }
    if (Status s = l.validate(); !s.ok()) return bad(field, s.error().message);
    return l;
  }

  Result<CommPath> path(const pb::CommPath& p, int64_t world, const std::string& field) const {
    CommPath out;
    for (int i = 0; i < p.steps_size(); ++i) {
      const auto& ps = p.steps(i);
      const std::string f = field + ".steps[" + std::to_string(i) + "]";
      CommStep st;
      if (ps.primitive() < 0 || ps.primitive() > pb::SEND_RECV)
        return bad(f + ".primitive", "unknown");
      st.primitive = static_cast<Primitive>(ps.primitive());
      LOOM_ASSIGN_OR_RETURN(st.before, layout(ps.before(), world, f + ".before"));
      LOOM_ASSIGN_OR_RETURN(st.after, layout(ps.after(), world, f + ".after"));
      st.from_factor = ps.from_factor();
      st.to_factor = ps.to_factor();
      st.k = ps.k();
      for (const auto& g : ps.groups()) {
        std::vector<DeviceId> group;
        for (int64_t d : g.devices()) {
          LOOM_TRY(in_range(d, world, f + ".groups"));
          group.emplace_back(d);
        }
        st.groups.push_back(std::move(group));
      }
      st.cost_s = ps.cost_s();
      out.steps.push_back(std::move(st));
    }
    out.cost_s = p.cost_s();
    out.via_full_replication = p.via_full_replication();
    return out;
  }

  Result<graph::Graph> graph(const pb::Graph& p, int64_t world) const {
    graph::Graph g(p.name());
    LOOM_TRY(add_tensors(p, g));
    std::vector<std::shared_ptr<const graph::OpDef>> defs;
    for (int i = 0; i < p.defs_size(); ++i) {
      LOOM_ASSIGN_OR_RETURN(auto d, def(p.defs(i), i));
      defs.push_back(std::move(d));
    }
    const int64_t n = p.tensors_size();
    for (int i = 0; i < p.ops_size(); ++i) {
      LOOM_ASSIGN_OR_RETURN(graph::Op op, this->op(p.ops(i), i, world, n, defs));
      g.add_op(std::move(op));
    }
    LOOM_TRY(in_range(p.loss(), n, "graph.loss"));
    g.set_loss(TensorId(p.loss()));
    return g;
  }

  // `stages`: one more than the graph's largest stage; `micro_batches`: per step.
  Result<Lowered> lowered(const pb::Lowered& p, int64_t world, int64_t tensors, int64_t ops,
                          int64_t stages, int64_t micro_batches) const {
    Lowered l;
    const int64_t adapters = p.adapters_size();
    for (int64_t i = 0; i < adapters; ++i) {
      LOOM_ASSIGN_OR_RETURN(Adapter a,
                            adapter(p.adapters(static_cast<int>(i)), i, world, tensors, stages));
      l.adapters.push_back(std::move(a));
    }
    for (int i = 0; i < p.grad_syncs_size(); ++i) {
      LOOM_ASSIGN_OR_RETURN(GradSync s, grad_sync(p.grad_syncs(i), i, world, tensors));
      l.grad_syncs.push_back(std::move(s));
    }
    if (p.programs_size() != world)
      return bad("lowered.programs", std::to_string(p.programs_size()) +
                                         " programs for world size " + std::to_string(world));
    const Counts counts{ops, adapters, stages, micro_batches,
                        static_cast<int64_t>(l.grad_syncs.size())};
    for (int r = 0; r < p.programs_size(); ++r) {
      LOOM_ASSIGN_OR_RETURN(Program prog, program(p.programs(r), r, counts));
      l.programs.push_back(std::move(prog));
    }
    return l;
  }

 private:
  // The graph's tensors, numbered in order and named once.
  Status add_tensors(const pb::Graph& p, graph::Graph& g) const {
    std::set<std::string> names;
    for (int64_t i = 0; i < p.tensors_size(); ++i) {
      const auto& pt = p.tensors(static_cast<int>(i));
      const std::string f = "graph.tensors[" + std::to_string(i) + "]";
      if (pt.id() != i)
        return bad(f + ".id", "is " + std::to_string(pt.id()) + ", expected " + std::to_string(i));
      if (!names.insert(pt.name()).second) return bad(f + ".name", "'" + pt.name() + "' repeats");
      graph::FullTensor t;
      t.name = pt.name();
      t.shape.assign(pt.shape().begin(), pt.shape().end());
      auto dtype = parse_dtype(pt.dtype());
      if (!dtype) return bad(f + ".dtype", "unknown dtype '" + pt.dtype() + "'");
      t.dtype = *dtype;
      if (pt.role() > pb::LOSS || pt.init() > pb::INIT_ONES || pt.role() < 0 || pt.init() < 0)
        return bad(f, "unknown role or init");
      t.role = static_cast<graph::TensorRole>(pt.role());
      t.init.kind = static_cast<graph::ParamInit::Kind>(pt.init());
      t.init.std = pt.init_std();
      g.add_tensor(std::move(t));
    }
    return Status::success();
  }

  // Op definition i: type, name, attributes, annotation.
  Result<std::shared_ptr<const graph::OpDef>> def(const pb::OpDef& pd, int i) const {
    auto def = std::make_shared<graph::OpDef>();
    def->type = pd.type();
    def->name = pd.name();
    for (const auto& pa : pd.attrs()) {
      switch (pa.value_case()) {
        case pb::Attr::kIntValue:
          def->attrs.set(pa.name(), pa.int_value());
          break;
        case pb::Attr::kRealValue:
          def->attrs.set(pa.name(), pa.real_value());
          break;
        case pb::Attr::kBoolValue:
          def->attrs.set(pa.name(), pa.bool_value());
          break;
        case pb::Attr::kStringValue:
          def->attrs.set(pa.name(), pa.string_value());
          break;
        case pb::Attr::kIntsValue:
          def->attrs.set(pa.name(), std::vector<int64_t>(pa.ints_value().values().begin(),
                                                         pa.ints_value().values().end()));
          break;
        default:
          return bad("graph.defs[" + std::to_string(i) + "].attrs." + pa.name(), "has no value");
      }
    }
    auto annotation = graph::Annotation::parse(pd.annotation());
    if (!annotation.ok())
      return bad("graph.defs[" + std::to_string(i) + "].annotation", annotation.error().message);
    def->annotation = *annotation;
    def->layer = pd.layer();
    def->attention_core = pd.attention_core();
    def->weight_product = pd.weight_product();
    return std::shared_ptr<const graph::OpDef>(std::move(def));
  }

  // Op i: a definition, pieces of the graph's `tensors`, a rank of the world and a stage.
  Result<graph::Op> op(const pb::Op& po, int i, int64_t world, int64_t tensors,
                       const std::vector<std::shared_ptr<const graph::OpDef>>& defs) const {
    const std::string f = "graph.ops[" + std::to_string(i) + "]";
    LOOM_TRY(in_range(po.def(), static_cast<int64_t>(defs.size()), f + ".def"));
    LOOM_TRY(in_range(po.device(), world, f + ".device"));
    graph::Op op;
    op.def = defs[static_cast<size_t>(po.def())];
    for (const auto& s : po.inputs()) {
      LOOM_ASSIGN_OR_RETURN(auto sub_tensor, sub(s, tensors, f + ".inputs"));
      op.inputs.push_back(std::move(sub_tensor));
    }
    for (const auto& s : po.outputs()) {
      LOOM_ASSIGN_OR_RETURN(auto sub_tensor, sub(s, tensors, f + ".outputs"));
      op.outputs.push_back(std::move(sub_tensor));
    }
    for (const auto& pp : po.parts()) op.parts.push_back({pp.index(), pp.count()});
    LOOM_TRY(in_range(po.stage(), kMaxStages, f + ".stage"));
    op.device = DeviceId(po.device());
    op.stage = StageId(po.stage());
    return op;
  }

  // Adapter i: its tensor, stages, layouts and paths.
  Result<Adapter> adapter(const pb::Adapter& pa, int64_t i, int64_t world, int64_t tensors,
                          int64_t stages) const {
    const std::string f = "lowered.adapters[" + std::to_string(i) + "]";
    if (pa.id() != i)
      return bad(f + ".id", "is " + std::to_string(pa.id()) + ", expected " + std::to_string(i));
    LOOM_TRY(in_range(pa.tensor(), tensors, f + ".tensor"));
    Adapter a;
    a.id = pa.id();
    a.tensor = TensorId(pa.tensor());
    a.consumer = pa.consumer();
    a.consumers.assign(pa.consumers().begin(), pa.consumers().end());
    LOOM_TRY(in_range(pa.producer_stage(), stages, f + ".producer_stage"));
    LOOM_TRY(in_range(pa.consumer_stage(), stages, f + ".consumer_stage"));
    a.producer_stage = StageId(pa.producer_stage());
    a.consumer_stage = StageId(pa.consumer_stage());
    LOOM_ASSIGN_OR_RETURN(a.from, layout(pa.from(), world, f + ".from"));
    LOOM_ASSIGN_OR_RETURN(a.to, layout(pa.to(), world, f + ".to"));
    LOOM_ASSIGN_OR_RETURN(a.forward, path(pa.forward(), world, f + ".forward"));
    LOOM_ASSIGN_OR_RETURN(a.backward, path(pa.backward(), world, f + ".backward"));
    a.disjoint = pa.disjoint();
    a.parameter = pa.parameter();
    a.regather = pa.regather();
    if (a.regather && !a.parameter)
      return bad(f + ".regather", "is set on an activation's adapter");
    return a;
  }

  // Gradient sync i: a piece of one of the `tensors` and ranks of the world.
  Result<GradSync> grad_sync(const pb::GradSync& ps, int i, int64_t world, int64_t tensors) const {
    const std::string f = "lowered.grad_syncs[" + std::to_string(i) + "]";
    LOOM_TRY(in_range(ps.tensor(), tensors, f + ".tensor"));
    GradSync s;
    s.tensor = TensorId(ps.tensor());
    LOOM_ASSIGN_OR_RETURN(s.piece, sub(ps.piece(), tensors, f + ".piece"));
    for (int64_t d : ps.devices()) {
      LOOM_TRY(in_range(d, world, f + ".devices"));
      s.devices.emplace_back(d);
    }
    return s;
  }

  // How many of each thing a program's indices may name.
  struct Counts {
    int64_t ops, adapters, stages, micro_batches, grad_syncs;
  };

  // A segment of program `f`: a stage not in `stages_seen` (added), items the plan has,
  // recomputed regions in order.
  Result<Segment> segment(const pb::Segment& ps, const std::string& f, const Counts& n,
                          std::set<int64_t>& stages_seen) const {
    Segment seg;
    LOOM_TRY(in_range(ps.stage(), n.stages, f + ".segments.stage"));
    if (!stages_seen.insert(ps.stage()).second)
      return bad(f + ".segments.stage", "stage " + std::to_string(ps.stage()) + " appears twice");
    seg.stage = StageId(ps.stage());
    for (const auto& pi : ps.items()) {
      const bool is_op = pi.kind() == pb::SegmentItem::OP;
      LOOM_TRY(in_range(pi.index(), is_op ? n.ops : n.adapters, f + ".segments.items.index"));
      seg.items.push_back({is_op ? SegmentItem::Kind::kOp : SegmentItem::Kind::kAdapter, pi.index(),
                           pi.producer_side()});
    }
    int64_t covered = 0;  // regions are in order and disjoint
    for (const auto& pr : ps.recompute()) {
      if (pr.begin() < covered || pr.end() <= pr.begin() ||
          pr.end() > static_cast<int64_t>(seg.items.size()))
        return bad(f + ".segments.recompute",
                   "region [" + std::to_string(pr.begin()) + ", " + std::to_string(pr.end()) +
                       ") is not a non-empty range of the segment's " +
                       std::to_string(seg.items.size()) + " items after the previous region");
      covered = pr.end();
      seg.recompute.push_back({pr.begin(), pr.end()});
    }
    return seg;
  }

  // Rank r's program: one segment per stage, blocks of those stages, gradient syncs.
  Result<Program> program(const pb::Program& pp, int r, const Counts& n) const {
    const std::string f = "lowered.programs[" + std::to_string(r) + "]";
    if (pp.rank() != r) return bad(f + ".rank", "is " + std::to_string(pp.rank()));
    Program prog;
    prog.rank = Rank(pp.rank());
    std::set<int64_t> segment_stages;
    for (const auto& ps : pp.segments()) {
      LOOM_ASSIGN_OR_RETURN(Segment seg, segment(ps, f, n, segment_stages));
      prog.segments.push_back(std::move(seg));
    }
    for (const auto& pb_block : pp.blocks()) {
      LOOM_TRY(in_range(pb_block.micro_batch(), n.micro_batches, f + ".blocks.micro_batch"));
      if (!pb::Block::Kind_IsValid(pb_block.kind()))
        return bad(f + ".blocks.kind", "unknown block kind " + std::to_string(pb_block.kind()));
      if (!segment_stages.count(pb_block.stage()))
        return bad(f + ".blocks.stage", "stage " + std::to_string(pb_block.stage()) +
                                            " has no segment on rank " + std::to_string(r));
      prog.blocks.push_back({from_proto(pb_block.kind()), StageId(pb_block.stage()),
                             MicroBatch(pb_block.micro_batch())});
    }
    for (int64_t id : pp.grad_syncs()) {
      LOOM_TRY(in_range(id, n.grad_syncs, f + ".grad_syncs"));
      prog.grad_syncs.push_back(id);
    }
    prog.loss_seed = pp.loss_seed();
    return prog;
  }

 private:
  std::string source_;
};

}  // namespace

std::string code_fingerprint(const std::vector<std::string>& op_types,
                             const std::vector<std::string>& policy_names) {
  std::string text = std::string("loom ") + LOOM_VERSION_STRING + "; plan format " +
                     std::to_string(kPlanFormatVersion) + "; ops";
  for (const auto& t : op_types) text += " " + t;
  text += "; policies";
  for (const auto& p : policy_names) text += " " + p;
  return text;
}

std::string model_digest(const graph::Graph& model) {
  uint64_t h = fnv1a(model.name());
  for (const auto& t : model.tensors())
    h = fnv1a(t.name + loom::to_string(t.shape) + std::string(loom::to_string(t.dtype)) +
                  graph::to_string(t.role) + t.init.to_string() + ";",
              h);
  for (const auto& op : model.ops())
    h = fnv1a(op.type() + " " + op.name() + " " + op.attrs().to_string() + " " +
                  op.annotation().to_string() + " " + std::to_string(op.layer()) + ";",
              h);
  return hex(h);
}

std::string digest16(std::string_view text) { return hex(fnv1a(text)); }

Result<std::string> plan_to_json(const PlanFile& plan) {
  // The text is written after room for the seal's member and sealed in place: the seal covers
  // the unsealed text, "{" and all that follows it, which the member's "," then replaces.
  std::string out(kSealedPrefix - 1, ' ');
  write_plan_json(plan, out);
  LOOM_CHECK(out.size() > kSealedPrefix && out[kSealedPrefix - 1] == '{')
      << "plan JSON is not an object";
  const std::string seal = seal_of(std::string_view(out).substr(kSealedPrefix - 1));
  out.replace(0, kSealedPrefix, std::string(kSealOpen) + seal + "\",");
  return out;
}

std::string seal_plan_json(const std::string& json) {
  const std::string unsealed = unseal(json).json;
  LOOM_CHECK(!unsealed.empty() && unsealed[0] == '{') << "plan JSON is not an object";
  return std::string(kSealOpen) + seal_of(unsealed) + "\"," + unsealed.substr(1);
}

Result<PlanFile> plan_from_json(const std::string& json, const std::string& source,
                                SealState* seal) {
  Reader reader(source);
  pb::Plan p;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  const Unsealed text = unseal(json);
  auto status = google::protobuf::util::JsonStringToMessage(text.json, &p, options);
  if (!status.ok()) {
    std::string why(status.message());
    for (char& c : why)
      if (c == '\n') c = ' ';
    return Error::at(source, source + ": not a loom plan (" + why + ")");
  }
  if (p.format() != kFormat)
    return reader.bad("format", "is '" + p.format() + "', expected '" + kFormat + "'");
  if (p.format_version() != kPlanFormatVersion)
    return Error::at(source, source + ": plan format version " +
                                 std::to_string(p.format_version()) + ", this loom reads version " +
                                 std::to_string(kPlanFormatVersion) +
                                 "; make the plan again with this loom's `loom plan`");
  // Checked before any field is used: an edited plan would otherwise run as the original plan
  // (most fields are not read back against the config) or fail deep in the runtime.
  if (seal)
    *seal = text.seal.empty()                 ? SealState::kMissing
            : seal_of(text.json) != text.seal ? SealState::kMismatch
                                              : SealState::kMatches;
  if (text.seal.empty() && !seal)
    return Error::at(source, source +
                                 ": plan has no seal (written by an older loom or rewritten by "
                                 "another tool); make it again with `loom plan`");
  // The message never shows the digest the content has: that would be the seal making the edit
  // pass. (The seal catches accidents; what makes an edited plan harmless is that every plan
  // loaded to run is proven against the model first: launch/planned_trainer.cc.)
  if (seal_of(text.json) != text.seal && !seal)
    return Error::at(source, source +
                                 ": plan was edited after `loom plan` wrote it (its seal does not "
                                 "match its content); a plan is not edited by hand: make it "
                                 "again with `loom plan`");
  if (p.world_size() < 1) return reader.bad("world_size", std::to_string(p.world_size()));
  PlanFile plan;
  plan.source = source;
  plan.hash = p.hash();
  plan.code_fingerprint = p.code_fingerprint();
  plan.config_yaml = p.config_yaml();
  plan.model_digest = p.model_digest();
  plan.world_size = p.world_size();
  plan.micro_batches = p.micro_batches();
  plan.schedule_csv = p.schedule_csv();
  LOOM_ASSIGN_OR_RETURN(plan.graph, reader.graph(p.graph(), plan.world_size));
  if (p.micro_batches() < 1 || p.micro_batches() > kMaxMicroBatches)
    return reader.bad("micro_batches", std::to_string(p.micro_batches()));
  int64_t stages = 0;
  for (const auto& op : plan.graph.ops()) stages = std::max(stages, op.stage.value() + 1);
  LOOM_ASSIGN_OR_RETURN(
      plan.lowered,
      reader.lowered(p.lowered(), plan.world_size,
                     static_cast<int64_t>(plan.graph.tensors().size()),
                     static_cast<int64_t>(plan.graph.ops().size()), stages, plan.micro_batches));
  return plan;
}

Result<PlanFile> load_plan_file(const std::string& path, SealState* seal) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    const std::filesystem::path inside = std::filesystem::path(path) / "plan.json";
    return Error::at(path, "'" + path + "' is a directory, not a plan file" +
                               (std::filesystem::is_regular_file(inside, ec)
                                    ? " (did you mean '" + inside.string() + "'?)"
                                    : "; give the plan.json that loom plan wrote"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return Error::at(path, "cannot read plan file '" + path + "'");
  std::stringstream text;
  text << in.rdbuf();
  return plan_from_json(text.str(), path, seal);
}

}  // namespace loom::lower
