#include "graph/builder.h"

namespace loom::graph {

GraphBuilder::GraphBuilder(const OpRegistry& registry, std::string name)
    : registry_(registry), graph_(std::move(name)) {}

void GraphBuilder::fail(Error e) {
  if (ok()) error_ = std::move(e);
}

TensorId GraphBuilder::add(FullTensor t) {
  if (!ok()) return TensorId();
  if (graph_.find_tensor(t.name)) {
    fail(Error::at(t.name, "tensor name '" + t.name + "' is used twice"));
    return TensorId();
  }
  for (int64_t d : t.shape)
    if (d <= 0) {
      fail(Error::at(t.name,
                     "tensor '" + t.name + "' has a non-positive size " + to_string(t.shape)));
      return TensorId();
    }
  return graph_.add_tensor(std::move(t));
}

TensorId GraphBuilder::input(const std::string& name, const Shape& shape, DType dtype,
                             int64_t value_bound) {
  FullTensor t;
  t.value_bound = value_bound;
  t.name = name;
  t.shape = shape;
  t.dtype = dtype;
  t.role = TensorRole::kInput;
  return add(std::move(t));
}

TensorId GraphBuilder::parameter(const std::string& name, const Shape& shape, ParamInit init,
                                 DType dtype) {
  FullTensor t;
  t.name = name;
  t.shape = shape;
  t.dtype = dtype;
  t.role = TensorRole::kParameter;
  t.init = init;
  return add(std::move(t));
}

std::vector<TensorId> GraphBuilder::op(const std::string& type, const std::string& name,
                                       const std::vector<TensorId>& inputs, Attrs attrs) {
  if (!ok()) return {};
  auto where = [&](const Error& e) {
    return Error::at(name, "op '" + name + "' (" + type + "): " + e.message);
  };
  auto annotation = registry_.annotation_of(type, attrs);
  if (!annotation.ok()) {
    fail(where(annotation.error()));
    return {};
  }
  std::vector<Shape> in_shapes;
  std::vector<DType> in_dtypes;
  Op op;
  for (TensorId id : inputs) {
    if (!id.valid()) {
      fail(Error::at(name, "op '" + name + "' (" + type + ") reads an invalid tensor"));
      return {};
    }
    const FullTensor& t = graph_.tensor(id);
    in_shapes.push_back(t.shape);
    in_dtypes.push_back(t.dtype);
    op.inputs.push_back(SubTensor::full(t));
  }
  auto shapes = registry_.infer_shapes(type, in_shapes, attrs);
  if (!shapes.ok()) {
    fail(where(shapes.error()));
    return {};
  }
  std::vector<DType> dtypes = registry_.infer_dtypes(type, in_dtypes, attrs);
  std::vector<TensorId> outs;
  for (size_t i = 0; i < shapes->size(); ++i) {
    FullTensor t;
    t.name = shapes->size() == 1 ? name : name + "." + std::to_string(i);
    t.shape = (*shapes)[i];
    t.dtype = dtypes[i];
    t.role = TensorRole::kActivation;
    TensorId id = add(std::move(t));
    if (!ok()) return {};
    outs.push_back(id);
    op.outputs.push_back(SubTensor::full(graph_.tensor(id)));
  }
  auto def = std::make_shared<OpDef>();
  def->type = type;
  def->name = name;
  def->attrs = std::move(attrs);
  def->annotation = std::move(annotation).value();
  def->layer = layer_;
  if (const OpSchema* schema = registry_.find(type)) carry_traits(*schema, *def);
  op.def = std::move(def);
  graph_.add_op(std::move(op));
  return outs;
}

TensorId GraphBuilder::op1(const std::string& type, const std::string& name,
                           const std::vector<TensorId>& inputs, Attrs attrs) {
  auto outs = op(type, name, inputs, std::move(attrs));
  if (!ok()) return TensorId();
  if (outs.size() != 1) {
    fail(Error::at(name, "op '" + name + "' (" + type + ") has " + std::to_string(outs.size()) +
                             " outputs, expected one"));
    return TensorId();
  }
  return outs[0];
}

void GraphBuilder::set_loss(TensorId loss) {
  if (!ok()) return;
  const FullTensor& t = graph_.tensor(loss);
  if (!t.shape.empty()) {
    fail(
        Error::at(t.name, "the loss '" + t.name + "' must be a scalar, got " + to_string(t.shape)));
    return;
  }
  graph_.set_loss(loss);
}

Result<Graph> GraphBuilder::finish() {
  if (!ok()) return error_;
  if (!graph_.loss().valid())
    return Error::at(graph_.name(), "graph '" + graph_.name() + "' has no loss");
  // The loss tensor keeps its own role so the runtime and the planner can find it.
  Graph g = std::move(graph_);
  return g;
}

}  // namespace loom::graph
