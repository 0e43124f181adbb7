#include "lower/plan_json_writer.h"

#include <google/protobuf/util/json_util.h>

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>

#include "core/check.h"
#include "core/plan.pb.h"

namespace loom::lower {
namespace {

namespace pb = loom::planpb;

// A string as Protobuf's printer escapes it: the short forms of \b \t \n \f \r, other control
// characters, DEL, < and > as \u00XX, and " and \ backslashed. Text with bytes past ASCII (which
// the printer checks as UTF-8 and escapes in part) goes through the printer itself.
void put_escaped(std::string& out, const std::string& text) {
  for (unsigned char c : text)
    if (c >= 0x80) {
      pb::Attr one;
      one.set_name(text);
      std::string json;
      google::protobuf::util::JsonPrintOptions options;
      options.preserve_proto_field_names = true;
      const auto status = google::protobuf::util::MessageToJsonString(one, &json, options);
      LOOM_CHECK(status.ok() && json.size() >= 11) << "cannot print a string: " << status;
      out.append(json, 8, json.size() - 9);  // {"name":"..."} -> "..."
      return;
    }
  static constexpr char kHex[] = "0123456789abcdef";
  out += '"';
  size_t plain = 0;  // the start of the run of characters copied as they are
  for (size_t i = 0; i < text.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    const bool as_is = c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != 0x7f;
    if (as_is) continue;
    out.append(text, plain, i - plain);
    plain = i + 1;
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\f':
        out += "\\f";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        out += "\\u00";
        out += kHex[c >> 4];
        out += kHex[c & 15];
    }
  }
  out.append(text, plain, text.size() - plain);
  out += '"';
}

// Protobuf's SimpleDtoa: 15 significant digits, 17 when 15 do not read back the same value;
// the non-finite values as JSON strings.
void put_double(std::string& out, double v) {
  if (std::isnan(v)) {
    out += "\"NaN\"";
    return;
  }
  if (std::isinf(v)) {
    out += v > 0 ? "\"Infinity\"" : "\"-Infinity\"";
    return;
  }
  char buf[32];
  int n = std::snprintf(buf, sizeof buf, "%.15g", v);
  if (std::strtod(buf, nullptr) != v) n = std::snprintf(buf, sizeof buf, "%.17g", v);
  out.append(buf, static_cast<size_t>(n));
}

// One JSON object after another, with proto3's presence rules: a scalar field at its zero value
// and an empty repeated field are left out; a message field is written when it is set.
class Writer {
 public:
  explicit Writer(std::string& out) : out_(out) {}

  // An object: the whole text's, or an element of a list.
  void open() {
    if (comma_) out_ += ',';
    out_ += '{';
    comma_ = false;
  }
  void close() { close_with('}'); }
  // A message field.
  void open(const char* key) {
    this->key(key);
    out_ += '{';
    comma_ = false;
  }
  // A repeated message field: `key`:[ then one open() ... close() per element.
  void open_list(const char* key) {
    this->key(key);
    out_ += '[';
    comma_ = false;
  }
  void close_list() { close_with(']'); }

  void int64(const char* key, int64_t v) {
    if (v == 0) return;
    this->key(key);
    quoted(v);
    comma_ = true;
  }
  void int32(const char* key, int64_t v) {
    if (v == 0) return;
    this->key(key);
    number(v);
    comma_ = true;
  }
  void boolean(const char* key, bool v) {
    if (!v) return;
    this->key(key);
    out_ += "true";
    comma_ = true;
  }
  void real(const char* key, double v) {
    uint64_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    if (bits == 0) return;  // -0.0 is written, as Protobuf serialises it
    this->key(key);
    put_double(out_, v);
    comma_ = true;
  }
  void string(const char* key, const std::string& v) {
    if (v.empty()) return;
    this->key(key);
    put_escaped(out_, v);
    comma_ = true;
  }
  // An enum by name (by number when `name` is empty: a value the proto does not declare).
  void enumeration(const char* key, int v, const std::string& name) {
    if (v == 0) return;
    this->key(key);
    if (name.empty()) {
      number(v);
    } else {
      out_ += '"';
      out_ += name;
      out_ += '"';
    }
    comma_ = true;
  }
  template <typename Range, typename Value>
  void int64s(const char* key, const Range& values, Value value) {
    if (values.empty()) return;
    this->key(key);
    out_ += '[';
    bool first = true;
    for (const auto& v : values) {
      if (!first) out_ += ',';
      first = false;
      quoted(value(v));
    }
    out_ += ']';
    comma_ = true;
  }
  void strings(const char* key, const std::vector<std::string>& values) {
    if (values.empty()) return;
    this->key(key);
    out_ += '[';
    for (size_t i = 0; i < values.size(); ++i) {
      if (i > 0) out_ += ',';
      put_escaped(out_, values[i]);
    }
    out_ += ']';
    comma_ = true;
  }
  // A oneof member: written whatever its value.
  void oneof_int64(const char* key, int64_t v) {
    this->key(key);
    quoted(v);
    comma_ = true;
  }
  void oneof_real(const char* key, double v) {
    this->key(key);
    put_double(out_, v);
    comma_ = true;
  }
  void oneof_bool(const char* key, bool v) {
    this->key(key);
    out_ += v ? "true" : "false";
    comma_ = true;
  }
  void oneof_string(const char* key, const std::string& v) {
    this->key(key);
    put_escaped(out_, v);
    comma_ = true;
  }

 private:
  void key(const char* key) {
    if (comma_) out_ += ',';
    out_ += '"';
    out_ += key;
    out_ += "\":";
  }
  void close_with(char c) {
    out_ += c;
    comma_ = true;
  }
  void number(int64_t v) {
    char buf[24];
    const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
    out_.append(buf, static_cast<size_t>(end - buf));
  }
  void quoted(int64_t v) {
    out_ += '"';
    number(v);
    out_ += '"';
  }

  std::string& out_;
  bool comma_ = false;  // a value was written at this level: the next one needs a comma
};

template <typename Id>
int64_t id_value(const Id& id) {
  return id.value();
}
int64_t plain_value(int64_t v) { return v; }

const std::string& role_name(int v) {
  static const std::string kNone;
  return pb::Role_IsValid(v) ? pb::Role_Name(static_cast<pb::Role>(v)) : kNone;
}
const std::string& init_name(int v) {
  static const std::string kNone;
  return pb::InitKind_IsValid(v) ? pb::InitKind_Name(static_cast<pb::InitKind>(v)) : kNone;
}
const std::string& primitive_name(int v) {
  static const std::string kNone;
  return pb::Primitive_IsValid(v) ? pb::Primitive_Name(static_cast<pb::Primitive>(v)) : kNone;
}

void put_sub_fields(Writer& w, const graph::SubTensor& s) {
  w.int64("tensor", s.tensor.value());
  if (!s.ranges.empty()) {
    w.open_list("ranges");
    for (const auto& r : s.ranges) {
      w.open();
      w.int64("start", r.start);
      w.int64("end", r.end);
      w.close();
    }
    w.close_list();
  }
  w.int64("value_chunk", s.value_chunk);
  w.int64("value_chunks", s.value_chunks);
}

void put_sub(Writer& w, const graph::SubTensor& s) {
  w.open();
  put_sub_fields(w, s);
  w.close();
}

void put_subs(Writer& w, const char* key, const std::vector<graph::SubTensor>& subs) {
  if (subs.empty()) return;
  w.open_list(key);
  for (const auto& s : subs) put_sub(w, s);
  w.close_list();
}

void put_layout(Writer& w, const char* key, const Layout& l) {
  w.open(key);
  w.int64("r", l.r);
  w.int64("v", l.v);
  w.int64s("d", l.d, plain_value);
  w.int64s("devices", l.devices, id_value<DeviceId>);
  w.close();
}

void put_path(Writer& w, const char* key, const CommPath& p) {
  w.open(key);
  if (!p.steps.empty()) {
    w.open_list("steps");
    for (const CommStep& st : p.steps) {
      w.open();
      const int primitive = static_cast<int>(st.primitive);
      w.enumeration("primitive", primitive, primitive_name(primitive));
      put_layout(w, "before", st.before);
      put_layout(w, "after", st.after);
      w.int32("from_factor", st.from_factor);
      w.int32("to_factor", st.to_factor);
      w.int64("k", st.k);
      if (!st.groups.empty()) {
        w.open_list("groups");
        for (const auto& g : st.groups) {
          w.open();
          w.int64s("devices", g, id_value<DeviceId>);
          w.close();
        }
        w.close_list();
      }
      w.real("cost_s", st.cost_s);
      w.close();
    }
    w.close_list();
  }
  w.real("cost_s", p.cost_s);
  w.boolean("via_full_replication", p.via_full_replication);
  w.close();
}

void put_def(Writer& w, const graph::OpDef& def) {
  w.open();
  w.string("type", def.type);
  w.string("name", def.name);
  if (!def.attrs.values().empty()) {
    w.open_list("attrs");
    for (const auto& [name, value] : def.attrs.values()) {
      w.open();
      w.string("name", name);
      if (auto* i = std::get_if<int64_t>(&value)) {
        w.oneof_int64("int_value", *i);
      } else if (auto* r = std::get_if<double>(&value)) {
        w.oneof_real("real_value", *r);
      } else if (auto* b = std::get_if<bool>(&value)) {
        w.oneof_bool("bool_value", *b);
      } else if (auto* s = std::get_if<std::string>(&value)) {
        w.oneof_string("string_value", *s);
      } else {
        w.open("ints_value");
        w.int64s("values", std::get<std::vector<int64_t>>(value), plain_value);
        w.close();
      }
      w.close();
    }
    w.close_list();
  }
  w.string("annotation", def.annotation.to_string());
  w.int64("layer", def.layer);
  w.boolean("attention_core", def.attention_core);
  w.boolean("weight_product", def.weight_product);
  w.close();
}

void put_graph(Writer& w, const graph::Graph& g) {
  w.open("graph");
  w.string("name", g.name());
  if (!g.tensors().empty()) {
    w.open_list("tensors");
    for (const auto& t : g.tensors()) {
      w.open();
      w.int64("id", t.id.value());
      w.string("name", t.name);
      w.int64s("shape", t.shape, plain_value);
      w.string("dtype", std::string(loom::to_string(t.dtype)));
      const int role = static_cast<int>(t.role), init = static_cast<int>(t.init.kind);
      w.enumeration("role", role, role_name(role));
      w.enumeration("init", init, init_name(init));
      w.real("init_std", t.init.std);
      w.close();
    }
    w.close_list();
  }
  // Each sub-operator's single-device op is written once, numbered in order of first use.
  std::map<const graph::OpDef*, int64_t> defs;
  std::vector<int64_t> def_of;
  def_of.reserve(g.ops().size());
  for (const auto& op : g.ops()) {
    auto [it, fresh] = defs.emplace(op.def.get(), static_cast<int64_t>(defs.size()));
    if (fresh && defs.size() == 1) w.open_list("defs");
    if (fresh) put_def(w, *op.def);
    def_of.push_back(it->second);
  }
  if (!defs.empty()) w.close_list();
  if (!g.ops().empty()) {
    w.open_list("ops");
    for (size_t i = 0; i < g.ops().size(); ++i) {
      const graph::Op& op = g.ops()[i];
      w.open();
      w.int64("id", op.id.value());
      w.int64("def", def_of[i]);
      put_subs(w, "inputs", op.inputs);
      put_subs(w, "outputs", op.outputs);
      if (!op.parts.empty()) {
        w.open_list("parts");
        for (const auto& p : op.parts) {
          w.open();
          w.int32("index", p.index);
          w.int32("count", p.count);
          w.close();
        }
        w.close_list();
      }
      w.int64("device", op.device.value());
      w.int64("stage", op.stage.value());
      w.close();
    }
    w.close_list();
  }
  w.int64("loss", g.loss().value());
  w.close();
}

void put_adapter(Writer& w, const Adapter& a) {
  w.open();
  w.int64("id", a.id);
  w.int64("tensor", a.tensor.value());
  w.string("consumer", a.consumer);
  w.strings("consumers", a.consumers);
  w.int64("producer_stage", a.producer_stage.value());
  w.int64("consumer_stage", a.consumer_stage.value());
  put_layout(w, "from", a.from);
  put_layout(w, "to", a.to);
  put_path(w, "forward", a.forward);
  put_path(w, "backward", a.backward);
  w.boolean("disjoint", a.disjoint);
  w.boolean("parameter", a.parameter);
  w.boolean("regather", a.regather);
  w.close();
}

void put_program(Writer& w, const Program& p) {
  w.open();
  w.int64("rank", p.rank.value());
  if (!p.segments.empty()) {
    w.open_list("segments");
    for (const Segment& seg : p.segments) {
      w.open();
      w.int64("stage", seg.stage.value());
      if (!seg.items.empty()) {
        w.open_list("items");
        for (const SegmentItem& item : seg.items) {
          w.open();
          if (item.kind == SegmentItem::Kind::kAdapter)
            w.enumeration("kind", pb::SegmentItem::ADAPTER,
                          pb::SegmentItem::Kind_Name(pb::SegmentItem::ADAPTER));
          w.int64("index", item.index);
          w.boolean("producer_side", item.producer_side);
          w.close();
        }
        w.close_list();
      }
      if (!seg.recompute.empty()) {
        w.open_list("recompute");
        for (const RecomputeRegion& region : seg.recompute) {
          w.open();
          w.int64("begin", region.begin);
          w.int64("end", region.end);
          w.close();
        }
        w.close_list();
      }
      w.close();
    }
    w.close_list();
  }
  if (!p.blocks.empty()) {
    w.open_list("blocks");
    for (const ProgramBlock& b : p.blocks) {
      w.open();
      // BlockKind's values are Block.Kind's (FORWARD, BACKWARD, INPUT_GRAD, WEIGHT_GRAD).
      static_assert(static_cast<int>(BlockKind::kF) == pb::Block::FORWARD &&
                    static_cast<int>(BlockKind::kB) == pb::Block::BACKWARD &&
                    static_cast<int>(BlockKind::kI) == pb::Block::INPUT_GRAD &&
                    static_cast<int>(BlockKind::kW) == pb::Block::WEIGHT_GRAD);
      const int kind = static_cast<int>(b.kind);
      w.enumeration("kind", kind, pb::Block::Kind_Name(static_cast<pb::Block::Kind>(kind)));
      w.int64("stage", b.stage.value());
      w.int64("micro_batch", b.micro_batch.value());
      w.close();
    }
    w.close_list();
  }
  w.int64s("grad_syncs", p.grad_syncs, plain_value);
  w.real("loss_seed", p.loss_seed);
  w.close();
}

void put_lowered(Writer& w, const Lowered& l) {
  w.open("lowered");
  if (!l.adapters.empty()) {
    w.open_list("adapters");
    for (const Adapter& a : l.adapters) put_adapter(w, a);
    w.close_list();
  }
  if (!l.grad_syncs.empty()) {
    w.open_list("grad_syncs");
    for (const GradSync& s : l.grad_syncs) {
      w.open();
      w.int64("tensor", s.tensor.value());
      w.open("piece");
      put_sub_fields(w, s.piece);
      w.close();
      w.int64s("devices", s.devices, id_value<DeviceId>);
      w.close();
    }
    w.close_list();
  }
  if (!l.programs.empty()) {
    w.open_list("programs");
    for (const Program& p : l.programs) put_program(w, p);
    w.close_list();
  }
  w.close();
}

}  // namespace

void write_plan_json(const PlanFile& plan, std::string& out) {
  Writer w(out);
  w.open();
  w.string("format", "loom-plan");
  w.int32("format_version", kPlanFormatVersion);
  w.string("hash", plan.hash);
  w.string("code_fingerprint", plan.code_fingerprint);
  w.string("config_yaml", plan.config_yaml);
  w.int64("world_size", plan.world_size);
  w.int64("micro_batches", plan.micro_batches);
  put_graph(w, plan.graph);
  put_lowered(w, plan.lowered);
  w.string("schedule_csv", plan.schedule_csv);
  w.string("model_digest", plan.model_digest);
  w.close();
}

}  // namespace loom::lower
