#include "graph/op_registry.h"

#include <sstream>

#include "core/strings.h"

namespace loom::graph {

OpSchema OpSchema::simple(std::string type, std::string annotation) {
  OpSchema s;
  s.type = std::move(type);
  s.annotation = [text = std::move(annotation)](const Attrs&) { return text; };
  return s;
}

void carry_traits(const OpSchema& schema, OpDef& def) {
  def.attention_core = schema.attention_core;
  def.weight_product = schema.weight_product;
  def.rules = schema.rules;
}

Status OpRegistry::add(OpSchema schema) {
  if (schema.type.empty()) return Error::at("op", "an op type needs a name");
  if (schemas_.count(schema.type))
    return Error::at(schema.type, "op type '" + schema.type + "' is already registered");
  if (!schema.annotation)
    return Error::at(schema.type, "op type '" + schema.type + "' has no annotation");
  // Ops whose annotation depends on attributes are checked when used; a constant one now.
  auto parsed = Annotation::parse(schema.annotation(Attrs{}));
  if (!parsed.ok())
    return Error::at(schema.type, "op type '" + schema.type + "': " + parsed.error().message);
  schemas_.emplace(schema.type, std::move(schema));
  return Status::success();
}

const OpSchema* OpRegistry::find(const std::string& type) const {
  auto it = schemas_.find(type);
  return it == schemas_.end() ? nullptr : &it->second;
}

std::vector<std::string> OpRegistry::types() const {
  std::vector<std::string> out;
  for (const auto& [k, v] : schemas_) out.push_back(k);
  return out;
}

Result<Annotation> OpRegistry::annotation_of(const std::string& type, const Attrs& attrs) const {
  const OpSchema* s = find(type);
  if (!s) {
    std::string msg = "unknown op type '" + type + "'";
    std::string close = closest_match(type, types());
    if (!close.empty()) msg += " (did you mean '" + close + "'?)";
    return Error::at(type, msg);
  }
  return Annotation::parse(s->annotation(attrs));
}

Result<std::vector<Shape>> OpRegistry::infer_shapes(const std::string& type,
                                                    const std::vector<Shape>& inputs,
                                                    const Attrs& attrs) const {
  LOOM_ASSIGN_OR_RETURN(Annotation a, annotation_of(type, attrs));
  if (a.inputs().size() != inputs.size())
    return Error::at(type, "op '" + type + "' takes " + std::to_string(a.inputs().size()) +
                               " inputs (" + a.to_string() + "), got " +
                               std::to_string(inputs.size()));
  const OpSchema* s = find(type);
  if (s->infer_shapes) return s->infer_shapes(a, inputs, attrs);
  return shapes_from_annotation(a, inputs, attrs);
}

std::vector<DType> OpRegistry::infer_dtypes(const std::string& type,
                                            const std::vector<DType>& inputs,
                                            const Attrs& attrs) const {
  const OpSchema* s = find(type);
  LOOM_CHECK(s) << "unknown op type " << type;
  if (s->infer_dtypes) return s->infer_dtypes(inputs, attrs);
  DType out = inputs.empty() ? DType::kFloat32 : inputs[0];
  for (DType d : inputs) {
    if (d == DType::kFloat32 || d == DType::kFloat16 || d == DType::kBFloat16) {
      out = d;
      break;
    }
  }
  auto a = annotation_of(type, attrs);
  LOOM_CHECK(a.ok()) << a.error().message;
  return std::vector<DType>(a->outputs().size(), out);
}

namespace {

Error annotation_error(const Annotation& a, const std::string& why) {
  return Error::at(a.to_string(), "annotation '" + a.to_string() + "': " + why);
}

// Sizes by position in a.labels(): planning binds the labels of every op of every rank, so
// this runs without a map or a string copy until the result.
struct LabelSizes {
  const std::vector<std::string>& names;
  std::vector<int64_t> size;
  std::vector<char> bound;

  explicit LabelSizes(const std::vector<std::string>& labels)
      : names(labels), size(labels.size(), 0), bound(labels.size(), 0) {}

  size_t index_of(const std::string& name) const {
    return static_cast<size_t>(std::find(names.begin(), names.end(), name) - names.begin());
  }

  // The size of `dim`, or -1 with `missing` set to a label not bound yet.
  int64_t dim_size(const DimSpec& dim, std::string& missing) const {
    int64_t n = 1;
    for (const auto& l : dim.labels) {
      if (l.kind == LabelKind::kFixed) {
        n *= l.size;
        continue;
      }
      const size_t k = index_of(l.name);
      if (!bound[k]) {
        missing = l.name;
        return -1;
      }
      n *= size[k];
    }
    return n;
  }
};

// Labels given as integer attributes, and every input's rank against its annotation.
Status bind_from_attrs(const Annotation& a, const std::vector<Shape>& inputs, const Attrs& attrs,
                       LabelSizes& labels) {
  for (size_t k = 0; k < labels.names.size(); ++k)
    if (attrs.has(labels.names[k])) {
      int64_t v = attrs.get_or<int64_t>(labels.names[k], 0);
      if (v <= 0)
        return annotation_error(a,
                                "attribute '" + labels.names[k] + "' must be a positive integer");
      labels.size[k] = v, labels.bound[k] = 1;
    }
  for (size_t i = 0; i < inputs.size(); ++i)
    if (a.inputs()[i].dims.size() != inputs[i].size())
      return annotation_error(a, "input " + std::to_string(i) + " has shape " +
                                     to_string(inputs[i]) + " but '" + a.inputs()[i].to_string() +
                                     "' has " + std::to_string(a.inputs()[i].dims.size()) +
                                     " dimensions");
  return Status::success();
}

// Binds labels from the inputs' sizes until nothing new is learnt: a dimension with one label
// left unbound gives that label its size.
Status bind_from_inputs(const Annotation& a, const std::vector<Shape>& inputs, LabelSizes& labels) {
  for (bool progress = true; progress;) {
    progress = false;
    for (size_t i = 0; i < inputs.size(); ++i) {
      for (size_t d = 0; d < inputs[i].size(); ++d) {
        int64_t known = 1;
        int unknown = 0;
        size_t last = 0;
        for (const auto& l : a.inputs()[i].dims[d].labels) {
          if (l.kind == LabelKind::kFixed) {
            known *= l.size;
            continue;
          }
          const size_t k = labels.index_of(l.name);
          if (labels.bound[k])
            known *= labels.size[k];
          else
            ++unknown, last = k;
        }
        if (unknown != 1) continue;
        if (known <= 0 || inputs[i][d] % known != 0)
          return annotation_error(a, "dimension " + std::to_string(d) + " of input " +
                                         std::to_string(i) + " is " + std::to_string(inputs[i][d]) +
                                         ", not divisible by " + std::to_string(known));
        labels.size[last] = inputs[i][d] / known, labels.bound[last] = 1;
        progress = true;
      }
    }
  }
  return Status::success();
}

// Every input dimension's size agrees with the bound labels, and every output label is bound.
Status check_dims(const Annotation& a, const std::vector<Shape>& inputs, const LabelSizes& labels) {
  for (size_t i = 0; i < inputs.size(); ++i) {
    for (size_t d = 0; d < inputs[i].size(); ++d) {
      std::string missing;
      int64_t expect = labels.dim_size(a.inputs()[i].dims[d], missing);
      if (expect < 0)
        return annotation_error(a, "the size of label '" + missing +
                                       "' cannot be inferred; give it as an integer attribute");
      if (expect != inputs[i][d])
        return annotation_error(a, "'" + a.inputs()[i].dims[d].to_string() + "' is " +
                                       std::to_string(expect) + " elsewhere but dimension " +
                                       std::to_string(d) + " of input " + std::to_string(i) +
                                       " is " + std::to_string(inputs[i][d]));
    }
  }
  for (const auto& spec : a.outputs())
    for (const auto& dim : spec.dims) {
      std::string missing;
      if (labels.dim_size(dim, missing) < 0)
        return annotation_error(
            a, "output label '" + missing + "' is not bound by any input or attribute");
    }
  return Status::success();
}

}  // namespace

Result<std::map<std::string, int64_t>> bind_labels(const Annotation& a,
                                                   const std::vector<Shape>& inputs,
                                                   const Attrs& attrs) {
  LabelSizes labels(a.labels());
  LOOM_TRY(bind_from_attrs(a, inputs, attrs, labels));
  LOOM_TRY(bind_from_inputs(a, inputs, labels));
  LOOM_TRY(check_dims(a, inputs, labels));
  std::map<std::string, int64_t> out;
  for (size_t k = 0; k < labels.names.size(); ++k)
    if (labels.bound[k]) out.emplace_hint(out.end(), labels.names[k], labels.size[k]);
  return out;
}

Result<std::vector<Shape>> shapes_from_annotation(const Annotation& a,
                                                  const std::vector<Shape>& inputs,
                                                  const Attrs& attrs) {
  LOOM_ASSIGN_OR_RETURN(auto size, bind_labels(a, inputs, attrs));
  std::vector<Shape> out;
  for (const auto& spec : a.outputs()) {
    Shape s;
    for (const auto& dim : spec.dims) {
      int64_t n = 1;
      for (const auto& l : dim.labels) n *= l.kind == LabelKind::kFixed ? l.size : size.at(l.name);
      s.push_back(n);
    }
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace loom::graph
