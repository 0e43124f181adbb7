#include "graph/annotation.h"

#include <cctype>
#include <map>

#include "core/strings.h"

namespace loom::graph {
namespace {

bool is_name_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool is_name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  Result<std::vector<TensorSpec>> tensors(std::string_view part) {
    std::vector<TensorSpec> out;
    for (const std::string& piece : split(part, ',')) {
      LOOM_ASSIGN_OR_RETURN(TensorSpec t, tensor(piece));
      out.push_back(std::move(t));
    }
    return out;
  }

 private:
  Error fail(const std::string& why) const {
    return Error::at(std::string(text_), "annotation '" + std::string(text_) + "': " + why);
  }

  Result<Label> label(std::string_view tok) {
    Label l;
    if (tok.empty()) return fail("empty label");
    if (std::isdigit(static_cast<unsigned char>(tok[0]))) {
      for (char c : tok)
        if (!std::isdigit(static_cast<unsigned char>(c)))
          return fail("'" + std::string(tok) + "' is neither a name nor an integer");
      l.kind = LabelKind::kFixed;
      l.size = std::stoll(std::string(tok));
      if (l.size <= 0) return fail("fixed size must be positive, got " + std::string(tok));
      return l;
    }
    if (!is_name_start(tok[0])) return fail("unexpected '" + std::string(1, tok[0]) + "'");
    size_t i = 0;
    while (i < tok.size() && is_name_char(tok[i])) ++i;
    l.name = std::string(tok.substr(0, i));
    std::string_view suffix = tok.substr(i);
    if (suffix.empty()) {
      l.kind = LabelKind::kSplit;
    } else if (suffix == "+") {
      l.kind = LabelKind::kReduce;
    } else if (suffix == "^") {
      l.kind = LabelKind::kFrozen;
    } else {
      return fail("label '" + std::string(tok) + "' has an unknown suffix '" + std::string(suffix) +
                  "' (expected '+' or '^')");
    }
    return l;
  }

  Result<TensorSpec> tensor(std::string_view piece) {
    TensorSpec spec;
    std::string_view s = trim(piece);
    size_t i = 0;
    auto skip_space = [&] {
      while (i < s.size() && s[i] == ' ') ++i;
    };
    auto token = [&]() -> std::string_view {
      size_t b = i;
      while (i < s.size() && s[i] != ' ' && s[i] != '(' && s[i] != ')') ++i;
      return s.substr(b, i - b);
    };
    skip_space();
    while (i < s.size()) {
      DimSpec dim;
      if (s[i] == '(') {
        ++i;
        skip_space();
        while (i < s.size() && s[i] != ')') {
          if (s[i] == '(') return fail("nested groups are not allowed");
          LOOM_ASSIGN_OR_RETURN(Label l, label(token()));
          dim.labels.push_back(std::move(l));
          skip_space();
        }
        if (i >= s.size()) return fail("unclosed '('");
        ++i;  // ')'
        if (dim.labels.empty()) return fail("empty group '()'");
        for (size_t k = 1; k < dim.labels.size(); ++k)
          if (dim.labels[k].kind == LabelKind::kSplit || dim.labels[k].kind == LabelKind::kReduce)
            return fail("in group '" + dim.to_string() +
                        "' only the first label may be split; mark '" + dim.labels[k].name +
                        "' with '^'");
      } else if (s[i] == ')') {
        return fail("unmatched ')'");
      } else {
        LOOM_ASSIGN_OR_RETURN(Label l, label(token()));
        dim.labels.push_back(std::move(l));
      }
      spec.dims.push_back(std::move(dim));
      skip_space();
    }
    return spec;
  }

  std::string_view text_;
};

}  // namespace

std::string Label::to_string() const {
  switch (kind) {
    case LabelKind::kFixed:
      return std::to_string(size);
    case LabelKind::kReduce:
      return name + "+";
    case LabelKind::kFrozen:
      return name + "^";
    case LabelKind::kSplit:
      break;
  }
  return name;
}

std::string DimSpec::to_string() const {
  if (labels.size() == 1) return labels[0].to_string();
  std::vector<std::string> parts;
  for (const auto& l : labels) parts.push_back(l.to_string());
  return "(" + join(parts, " ") + ")";
}

std::string TensorSpec::to_string() const {
  std::vector<std::string> parts;
  for (const auto& d : dims) parts.push_back(d.to_string());
  return join(parts, " ");
}

Result<Annotation> Annotation::parse(std::string_view text) {
  auto fail = [&](const std::string& why) {
    return Error::at(std::string(text), "annotation '" + std::string(text) + "': " + why);
  };
  size_t arrow = text.find("->");
  if (arrow == std::string_view::npos) return fail("missing '->'");
  if (text.find("->", arrow + 2) != std::string_view::npos) return fail("more than one '->'");
  Parser parser(text);
  Annotation a;
  LOOM_ASSIGN_OR_RETURN(a.inputs_, parser.tensors(text.substr(0, arrow)));
  LOOM_ASSIGN_OR_RETURN(a.outputs_, parser.tensors(text.substr(arrow + 2)));
  if (a.inputs_.size() == 1 && a.inputs_[0].dims.empty() && trim(text.substr(0, arrow)).empty())
    return fail("an op needs at least one input");

  std::map<std::string, LabelKind> kinds;
  auto visit = [&](const std::vector<TensorSpec>& specs, bool output) -> Status {
    for (const auto& t : specs) {
      std::map<std::string, int> seen_in_tensor;
      for (const auto& d : t.dims) {
        for (const auto& l : d.labels) {
          if (l.kind == LabelKind::kFixed) continue;
          if (++seen_in_tensor[l.name] > 1)
            return fail("label '" + l.name + "' appears twice in tensor '" + t.to_string() + "'");
          auto [it, inserted] = kinds.emplace(l.name, l.kind);
          if (inserted) {
            a.labels_.push_back(l.name);
          } else if (it->second != l.kind) {
            return fail("label '" + l.name + "' is marked '" + l.to_string() + "' here but '" +
                        Label{l.name, it->second, 0}.to_string() + "' elsewhere");
          }
          if (output && l.kind == LabelKind::kReduce)
            return fail("reduced label '" + l.to_string() + "' cannot appear in an output");
        }
      }
    }
    return Status::success();
  };
  LOOM_TRY(visit(a.inputs_, false));
  LOOM_TRY(visit(a.outputs_, true));
  return a;
}

LabelKind Annotation::kind_of(const std::string& label) const {
  for (const auto& s : sites(label)) {
    const auto& specs = s.output ? outputs_ : inputs_;
    return specs[s.tensor].dims[s.dim].labels[s.position].kind;
  }
  LOOM_CHECK(false) << "label '" << label << "' is not in annotation " << to_string();
  return LabelKind::kFixed;
}

std::vector<Annotation::Site> Annotation::sites(const std::string& label) const {
  std::vector<Site> out;
  for (int side = 0; side < 2; ++side) {
    const auto& specs = side ? outputs_ : inputs_;
    for (size_t t = 0; t < specs.size(); ++t)
      for (size_t d = 0; d < specs[t].dims.size(); ++d)
        for (size_t p = 0; p < specs[t].dims[d].labels.size(); ++p)
          if (specs[t].dims[d].labels[p].name == label) out.push_back({side == 1, t, d, p});
  }
  return out;
}

std::string Annotation::to_string() const {
  auto side = [](const std::vector<TensorSpec>& specs) {
    std::vector<std::string> parts;
    for (const auto& t : specs) parts.push_back(t.to_string());
    return join(parts, ", ");
  };
  std::string out = side(outputs_);
  return side(inputs_) + " -> " + out;
}

}  // namespace loom::graph
