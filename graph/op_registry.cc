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

Result<std::map<std::string, int64_t>> bind_labels(const Annotation& a,
                                                   const std::vector<Shape>& inputs,
                                                   const Attrs& attrs) {
  auto fail = [&](const std::string& why) {
    return Error::at(a.to_string(), "annotation '" + a.to_string() + "': " + why);
  };
  // Sizes by position in a.labels(): planning binds the labels of every op of every rank, so
  // this runs without a map or a string copy until the result.
  const std::vector<std::string>& names = a.labels();
  std::vector<int64_t> size(names.size(), 0);
  std::vector<char> bound(names.size(), 0);
  auto index_of = [&](const std::string& name) {
    return static_cast<size_t>(std::find(names.begin(), names.end(), name) - names.begin());
  };
  for (size_t k = 0; k < names.size(); ++k)
    if (attrs.has(names[k])) {
      int64_t v = attrs.get_or<int64_t>(names[k], 0);
      if (v <= 0) return fail("attribute '" + names[k] + "' must be a positive integer");
      size[k] = v, bound[k] = 1;
    }
  for (size_t i = 0; i < inputs.size(); ++i)
    if (a.inputs()[i].dims.size() != inputs[i].size())
      return fail("input " + std::to_string(i) + " has shape " + to_string(inputs[i]) + " but '" +
                  a.inputs()[i].to_string() + "' has " + std::to_string(a.inputs()[i].dims.size()) +
                  " dimensions");

  // Bind labels from the inputs until nothing new is learnt, then check every dimension.
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
          const size_t k = index_of(l.name);
          if (bound[k])
            known *= size[k];
          else
            ++unknown, last = k;
        }
        if (unknown != 1) continue;
        if (known <= 0 || inputs[i][d] % known != 0)
          return fail("dimension " + std::to_string(d) + " of input " + std::to_string(i) + " is " +
                      std::to_string(inputs[i][d]) + ", not divisible by " + std::to_string(known));
        size[last] = inputs[i][d] / known, bound[last] = 1;
        progress = true;
      }
    }
  }
  auto dim_size = [&](const DimSpec& dim, std::string& missing) -> int64_t {
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
  };
  for (size_t i = 0; i < inputs.size(); ++i) {
    for (size_t d = 0; d < inputs[i].size(); ++d) {
      std::string missing;
      int64_t expect = dim_size(a.inputs()[i].dims[d], missing);
      if (expect < 0)
        return fail("the size of label '" + missing +
                    "' cannot be inferred; give it as an integer attribute");
      if (expect != inputs[i][d])
        return fail("'" + a.inputs()[i].dims[d].to_string() + "' is " + std::to_string(expect) +
                    " elsewhere but dimension " + std::to_string(d) + " of input " +
                    std::to_string(i) + " is " + std::to_string(inputs[i][d]));
    }
  }
  for (const auto& spec : a.outputs())
    for (const auto& dim : spec.dims) {
      std::string missing;
      if (dim_size(dim, missing) < 0)
        return fail("output label '" + missing + "' is not bound by any input or attribute");
    }
  std::map<std::string, int64_t> out;
  for (size_t k = 0; k < names.size(); ++k)
    if (bound[k]) out.emplace_hint(out.end(), names[k], size[k]);
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
