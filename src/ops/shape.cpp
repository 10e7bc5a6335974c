// Shape ops: reshape, transpose, slice, concat, broadcast_to, pad, and the row gather/scatter of
// embeddings. Axes in nodes are non-negative when built through the builder.
#include "ir/op_names.hpp"
#include "ops/apply.hpp"
#include "ops/shape_rules.hpp"

namespace mg {
namespace {

const TensorType& single_input(const Graph& graph, const Node& node) {
  if (node.inputs.size() != 1) op_error(graph, node, "takes one input");
  return graph.type(node.inputs[0]);
}

int64_t node_axis(const Node& node, int64_t rank) {
  const int64_t axis = node.attrs.get_int("axis");
  return axis < 0 ? axis + rank : axis;
}

// reshape(x) {shape: list, fully resolved (no -1)}: same elements, new shape.
OpDef reshape_op() {
  return {
      .name = op::reshape,
      .infer =
          [](const Graph& graph, const Node& node) {
            const TensorType& x = single_input(graph, node);
            const Shape& shape = node.attrs.get_ints("shape");
            for (int64_t extent : shape) {
              if (extent <= 0) op_error(graph, node, "extents must be positive");
            }
            if (element_count(shape) != x.elements()) {
              op_error(graph, node,
                       "cannot reshape " + std::to_string(x.elements()) + " elements into " +
                           shape_string(shape) + " (" + std::to_string(element_count(shape)) +
                           " elements)");
            }
            return TensorType{x.dtype, shape};
          },
      .reference =
          [](const Node& node, const std::vector<const HostTensor*>& in) {
            return HostTensor(node.type.shape, in[0]->data);
          },
      .vjp =
          [](Graph& graph, ValueId self, ValueId grad) {
            const Shape shape = graph.type(graph.node(self).inputs[0]).shape;
            return std::vector<ValueId>{graph.add(op::reshape, {grad}, {{"shape", shape}})};
          },
  };
}

// transpose(x) {permutation: list}: result axis i is input axis permutation[i].
OpDef transpose_op() {
  return {
      .name = op::transpose,
      .infer =
          [](const Graph& graph, const Node& node) {
            const TensorType& x = single_input(graph, node);
            const std::vector<int64_t>& permutation = node.attrs.get_ints("permutation");
            if (static_cast<int64_t>(permutation.size()) != x.rank() || x.rank() == 0) {
              op_error(
                  graph, node,
                  "permutation must list each of the " + std::to_string(x.rank()) + " axes once");
            }
            Shape shape;
            for (int64_t axis : normalize_axes(graph, node, permutation, x.rank())) {
              shape.push_back(x.shape[axis]);
            }
            return TensorType{x.dtype, shape};
          },
      .reference =
          [](const Node& node, const std::vector<const HostTensor*>& in) {
            const HostTensor& x = *in[0];
            const std::vector<int64_t>& permutation = node.attrs.get_ints("permutation");
            const int64_t rank = static_cast<int64_t>(x.shape.size());
            const std::vector<int64_t> x_strides = row_major_strides(x.shape);
            std::vector<int64_t> strides(x_strides.size());  // input stride of each result axis
            for (size_t i = 0; i < permutation.size(); ++i) {
              strides[i] = x_strides[permutation[i] < 0 ? permutation[i] + rank : permutation[i]];
            }
            HostTensor out(node.type.shape);
            for (int64_t k = 0; k < out.elements(); ++k) {
              out.data[k] = x.data[ravel(unravel(k, out.shape), strides)];
            }
            return out;
          },
      .vjp =
          [](Graph& graph, ValueId self, ValueId grad) {
            const std::vector<int64_t> permutation = graph.node(self).attrs.get_ints("permutation");
            const int64_t rank = static_cast<int64_t>(permutation.size());
            std::vector<int64_t> inverse(permutation.size());
            for (int64_t i = 0; i < rank; ++i) {
              inverse[permutation[i] < 0 ? permutation[i] + rank : permutation[i]] = i;
            }
            return std::vector<ValueId>{
                graph.add(op::transpose, {grad}, {{"permutation", inverse}})};
          },
  };
}

// slice(x) {axis, start, end}: elements start <= i < end along the axis (0 <= start < end <=
// extent).
OpDef slice_op() {
  return {
      .name = op::slice,
      .infer =
          [](const Graph& graph, const Node& node) {
            TensorType type = single_input(graph, node);
            const int64_t axis =
                normalize_axis(graph, node, node.attrs.get_int("axis"), type.rank());
            const int64_t start = node.attrs.get_int("start");
            const int64_t end = node.attrs.get_int("end");
            if (start < 0 || start >= end || end > type.shape[axis]) {
              op_error(graph, node,
                       "range [" + std::to_string(start) + ", " + std::to_string(end) +
                           ") is empty or outside axis " + std::to_string(axis) + " of extent " +
                           std::to_string(type.shape[axis]));
            }
            type.shape[axis] = end - start;
            return type;
          },
      .reference =
          [](const Node& node, const std::vector<const HostTensor*>& in) {
            const HostTensor& x = *in[0];
            const int64_t axis = node_axis(node, static_cast<int64_t>(x.shape.size()));
            const int64_t start = node.attrs.get_int("start");
            const AxisView from(x.shape, axis);
            HostTensor out(node.type.shape);
            const AxisView to(out.shape, axis);
            for (int64_t o = 0; o < to.outer; ++o) {
              for (int64_t e = 0; e < to.extent; ++e) {
                for (int64_t i = 0; i < to.inner; ++i) {
                  out.data[to.at(o, e, i)] = x.data[from.at(o, start + e, i)];
                }
              }
            }
            return out;
          },
      .vjp =
          [](Graph& graph, ValueId self, ValueId grad) {
            const Node node = graph.node(self);
            const Shape shape = graph.type(node.inputs[0]).shape;
            const int64_t axis = node_axis(node, static_cast<int64_t>(shape.size()));
            std::vector<int64_t> pads(2 * shape.size(), 0);
            pads[2 * axis] = node.attrs.get_int("start");
            pads[2 * axis + 1] = shape[axis] - node.attrs.get_int("end");
            return std::vector<ValueId>{
                graph.add(op::pad, {grad}, {{"pads", pads}, {"value", 0.0}})};
          },
  };
}

// concat(x0, x1, ...) {axis}: inputs of one dtype and rank that agree off the axis.
OpDef concat_op() {
  return {
      .name = op::concat,
      .infer =
          [](const Graph& graph, const Node& node) {
            if (node.inputs.empty()) op_error(graph, node, "needs at least one input");
            TensorType type = graph.type(node.inputs[0]);
            const int64_t axis =
                normalize_axis(graph, node, node.attrs.get_int("axis"), type.rank());
            for (size_t k = 1; k < node.inputs.size(); ++k) {
              const TensorType& part = graph.type(node.inputs[k]);
              Shape expected = type.shape;
              expected[axis] = part.rank() == type.rank() ? part.shape[axis] : 0;
              if (part.dtype != type.dtype || !(part.shape == expected)) {
                op_error(graph, node,
                         "input " + std::to_string(k) + " does not match input 0 off axis " +
                             std::to_string(axis));
              }
              type.shape[axis] += part.shape[axis];
            }
            return type;
          },
      .reference =
          [](const Node& node, const std::vector<const HostTensor*>& in) {
            HostTensor out(node.type.shape);
            const int64_t axis = node_axis(node, static_cast<int64_t>(out.shape.size()));
            const AxisView to(out.shape, axis);
            int64_t offset = 0;
            for (const HostTensor* part : in) {
              const AxisView from(part->shape, axis);
              for (int64_t o = 0; o < from.outer; ++o) {
                for (int64_t e = 0; e < from.extent; ++e) {
                  for (int64_t i = 0; i < from.inner; ++i) {
                    out.data[to.at(o, offset + e, i)] = part->data[from.at(o, e, i)];
                  }
                }
              }
              offset += from.extent;
            }
            return out;
          },
      .vjp =
          [](Graph& graph, ValueId self, ValueId grad) {
            const Node node = graph.node(self);
            const int64_t axis = node_axis(node, node.type.rank());
            std::vector<ValueId> grads;
            int64_t offset = 0;
            for (ValueId part : node.inputs) {
              const int64_t extent = graph.type(part).shape[axis];
              grads.push_back(
                  graph.add(op::slice, {grad},
                            {{"axis", axis}, {"start", offset}, {"end", offset + extent}}));
              offset += extent;
            }
            return grads;
          },
  };
}

// broadcast_to(x) {shape}: NumPy broadcast of x to exactly `shape`.
OpDef broadcast_to_op() {
  return {
      .name = op::broadcast_to,
      .infer =
          [](const Graph& graph, const Node& node) {
            const TensorType& x = single_input(graph, node);
            const Shape& shape = node.attrs.get_ints("shape");
            bool fits = static_cast<int64_t>(shape.size()) >= x.rank();
            for (int64_t extent : shape) fits = fits && extent > 0;
            for (int64_t i = 0; fits && i < x.rank(); ++i) {
              const int64_t extent = x.shape[x.rank() - 1 - i];
              fits = extent == 1 || extent == shape[shape.size() - 1 - i];
            }
            if (!fits) {
              op_error(graph, node,
                       "cannot broadcast " + shape_string(x.shape) + " to " + shape_string(shape));
            }
            return TensorType{x.dtype, shape};
          },
      .reference =
          [](const Node& node, const std::vector<const HostTensor*>& in) {
            HostTensor out(node.type.shape);
            for (int64_t k = 0; k < out.elements(); ++k) {
              out.data[k] = in[0]->data[broadcast_source_index(in[0]->shape, out.shape, k)];
            }
            return out;
          },
      .vjp =
          [](Graph& graph, ValueId self, ValueId grad) {
            const Shape shape = graph.type(graph.node(self).inputs[0]).shape;
            return std::vector<ValueId>{reduce_to_shape(graph, grad, shape)};
          },
  };
}

// pad(x) {pads: [before0, after0, before1, after1, ...] (non-negative), value: double}.
OpDef pad_op() {
  return {
      .name = op::pad,
      .infer =
          [](const Graph& graph, const Node& node) {
            TensorType type = single_input(graph, node);
            const std::vector<int64_t>& pads = node.attrs.get_ints("pads");
            if (static_cast<int64_t>(pads.size()) != 2 * type.rank()) {
              op_error(graph, node,
                       "pads needs a (before, after) pair for each of the " +
                           std::to_string(type.rank()) + " axes");
            }
            for (int64_t i = 0; i < type.rank(); ++i) {
              if (pads[2 * i] < 0 || pads[2 * i + 1] < 0) {
                op_error(graph, node, "pads must be non-negative");
              }
              type.shape[i] += pads[2 * i] + pads[2 * i + 1];
            }
            return type;
          },
      .reference =
          [](const Node& node, const std::vector<const HostTensor*>& in) {
            const HostTensor& x = *in[0];
            const std::vector<int64_t>& pads = node.attrs.get_ints("pads");
            HostTensor out(node.type.shape, node.attrs.get_float("value", 0.0));
            const std::vector<int64_t> strides = row_major_strides(out.shape);
            for (int64_t k = 0; k < x.elements(); ++k) {
              std::vector<int64_t> index = unravel(k, x.shape);
              for (size_t i = 0; i < index.size(); ++i) index[i] += pads[2 * i];
              out.data[ravel(index, strides)] = x.data[k];
            }
            return out;
          },
      .vjp =
          [](Graph& graph, ValueId self, ValueId grad) {
            const Node node = graph.node(self);
            const std::vector<int64_t>& pads = node.attrs.get_ints("pads");
            const Shape shape = graph.type(node.inputs[0]).shape;
            ValueId result = grad;
            for (int64_t axis = 0; axis < static_cast<int64_t>(shape.size()); ++axis) {
              const int64_t before = pads[2 * axis];
              if (before == 0 && pads[2 * axis + 1] == 0) continue;
              result =
                  graph.add(op::slice, {result},
                            {{"axis", axis}, {"start", before}, {"end", before + shape[axis]}});
            }
            return std::vector<ValueId>{result};
          },
  };
}

// The row index that `indices` holds at `position`, checked against a table of `rows` rows.
int64_t checked_row(std::string_view op, const HostTensor& indices, int64_t position,
                    int64_t rows) {
  const double index = indices.data[position];
  if (!(index >= 0 && index < static_cast<double>(rows))) {
    throw Error(std::string(op) + ": index " + std::to_string(static_cast<int64_t>(index)) +
                " at position " + std::to_string(position) +
                " is out of range for a table of V = " + std::to_string(rows) + " rows");
  }
  return static_cast<int64_t>(index);
}

void require_table_and_indices(const Graph& graph, const Node& node, const TensorType& table,
                               const TensorType& indices) {
  if (table.rank() != 2) op_error(graph, node, "the table must have rank 2 ([V, D])");
  if (indices.dtype != DType::i32) op_error(graph, node, "indices must be i32");
  // The kernels move floating-point rows; an integer table has none.
  if (table.dtype != DType::f32 && table.dtype != DType::f16 && table.dtype != DType::bf16) {
    op_error(graph, node, "the table must hold f32, f16 or bf16 values");
  }
}

// gather(table [V, D], indices i32 [S...]) -> [S..., D]: rows of the table.
OpDef gather_op() {
  return {
      .name = op::gather,
      .infer =
          [](const Graph& graph, const Node& node) {
            if (node.inputs.size() != 2) op_error(graph, node, "takes inputs (table, indices)");
            const TensorType& table = graph.type(node.inputs[0]);
            const TensorType& indices = graph.type(node.inputs[1]);
            require_table_and_indices(graph, node, table, indices);
            Shape shape = indices.shape;
            shape.push_back(table.shape[1]);
            return TensorType{table.dtype, shape};
          },
      .reference =
          [](const Node& node, const std::vector<const HostTensor*>& in) {
            const HostTensor& table = *in[0];
            const HostTensor& indices = *in[1];
            const int64_t width = table.shape[1];
            HostTensor out(node.type.shape);
            for (int64_t s = 0; s < indices.elements(); ++s) {
              const int64_t row = checked_row(op::gather, indices, s, table.shape[0]);
              for (int64_t d = 0; d < width; ++d) {
                out.data[s * width + d] = table.data[row * width + d];
              }
            }
            return out;
          },
      .vjp =
          [](Graph& graph, ValueId self, ValueId grad) {
            const Node node = graph.node(self);
            const ValueId zeros = graph.constant(0.0, graph.type(node.inputs[0]));
            return std::vector<ValueId>{graph.add(op::scatter_add, {zeros, node.inputs[1], grad}),
                                        kNoValue};
          },
  };
}

// scatter_add(target [V, D], indices i32 [S...], updates [S..., D]) -> [V, D]: target with
// each update row added at its index (repeated indices accumulate).
OpDef scatter_add_op() {
  return {
      .name = op::scatter_add,
      .infer =
          [](const Graph& graph, const Node& node) {
            if (node.inputs.size() != 3) {
              op_error(graph, node, "takes inputs (target, indices, updates)");
            }
            const TensorType& target = graph.type(node.inputs[0]);
            const TensorType& indices = graph.type(node.inputs[1]);
            require_table_and_indices(graph, node, target, indices);
            Shape expected = indices.shape;
            expected.push_back(target.shape[1]);
            const TensorType& updates = graph.type(node.inputs[2]);
            if (updates.dtype != target.dtype || !(updates.shape == expected)) {
              op_error(graph, node,
                       "updates must be " + type_string(TensorType{target.dtype, expected}));
            }
            return target;
          },
      .reference =
          [](const Node&, const std::vector<const HostTensor*>& in) {
            HostTensor out = *in[0];
            const HostTensor& indices = *in[1];
            const HostTensor& updates = *in[2];
            const int64_t width = out.shape[1];
            for (int64_t s = 0; s < indices.elements(); ++s) {
              const int64_t row = checked_row(op::scatter_add, indices, s, out.shape[0]);
              for (int64_t d = 0; d < width; ++d) {
                out.data[row * width + d] += updates.data[s * width + d];
              }
            }
            return out;
          },
      .vjp =
          [](Graph& graph, ValueId self, ValueId grad) {
            const ValueId indices = graph.node(self).inputs[1];
            return std::vector<ValueId>{grad, kNoValue, graph.add(op::gather, {grad, indices})};
          },
  };
}

}  // namespace

void register_shape_ops(std::vector<OpDef>& registry) {
  registry.push_back(reshape_op());
  registry.push_back(transpose_op());
  registry.push_back(slice_op());
  registry.push_back(concat_op());
  registry.push_back(broadcast_to_op());
  registry.push_back(pad_op());
  registry.push_back(gather_op());
  registry.push_back(scatter_add_op());
}

// ---- builders -------------------------------------------------------------------------------

Tensor reshape(Tensor x, Shape shape) {
  int64_t known = 1;
  int64_t inferred_axis = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1 && inferred_axis < 0) {
      inferred_axis = static_cast<int64_t>(i);
    } else if (shape[i] <= 0) {
      builder_error(op::reshape, {x}, "extents must be positive, with at most one -1",
                    {{"shape", shape}});
    } else {
      known *= shape[i];
    }
  }
  if (inferred_axis >= 0) {
    if (x.type().elements() % known != 0) {
      builder_error(op::reshape, {x},
                    "cannot reshape " + std::to_string(x.type().elements()) + " elements into " +
                        shape_string(shape),
                    {{"shape", shape}});
    }
    shape[inferred_axis] = x.type().elements() / known;
  }
  return apply(op::reshape, {x}, {{"shape", shape}});
}

Tensor transpose(Tensor x, std::vector<int64_t> permutation) {
  const Node pending = pending_node(op::transpose, {x}, {{"permutation", permutation}});
  if (static_cast<int64_t>(permutation.size()) == x.rank()) {
    permutation = normalize_axes(x.graph(), pending, permutation, x.rank());
  }
  return apply(op::transpose, {x}, {{"permutation", permutation}});
}

Tensor transpose(Tensor x, int64_t axis0, int64_t axis1) {
  std::vector<int64_t> permutation;
  for (int64_t axis = 0; axis < x.rank(); ++axis) permutation.push_back(axis);
  std::swap(permutation[builder_axis(op::transpose, x, axis0)],
            permutation[builder_axis(op::transpose, x, axis1)]);
  return apply(op::transpose, {x}, {{"permutation", permutation}});
}

Tensor slice(Tensor x, int64_t axis, int64_t start, int64_t end) {
  return apply(op::slice, {x},
               {{"axis", builder_axis(op::slice, x, axis)}, {"start", start}, {"end", end}});
}

Tensor concat(const std::vector<Tensor>& parts, int64_t axis) {
  if (parts.empty()) throw Error("concat: needs at least one input");
  return apply(op::concat, parts, {{"axis", builder_axis(op::concat, parts.front(), axis)}});
}

std::vector<Tensor> split(Tensor x, const std::vector<int64_t>& sizes, int64_t axis) {
  axis = builder_axis("split", x, axis);
  int64_t total = 0;
  bool positive = true;
  for (int64_t size : sizes) {
    total += size;
    positive = positive && size > 0;
  }
  if (!positive || total != x.dim(axis)) {
    builder_error("split", {x},
                  "sizes " + shape_string(sizes) + " must be positive and add up to " +
                      std::to_string(x.dim(axis)));
  }
  std::vector<Tensor> parts;
  int64_t offset = 0;
  for (int64_t size : sizes) {
    parts.push_back(slice(x, axis, offset, offset + size));
    offset += size;
  }
  return parts;
}

Tensor broadcast_to(Tensor x, Shape shape) {
  return apply(op::broadcast_to, {x}, {{"shape", std::move(shape)}});
}

Tensor pad(Tensor x, const std::vector<std::pair<int64_t, int64_t>>& pads, double value) {
  std::vector<int64_t> flat;
  for (const auto& [before, after] : pads) {
    flat.push_back(before);
    flat.push_back(after);
  }
  return apply(op::pad, {x}, {{"pads", flat}, {"value", value}});
}

Tensor unsqueeze(Tensor x, int64_t axis) {
  Shape shape = x.shape();
  shape.insert(shape.begin() + builder_axis("unsqueeze", x, axis, 1), 1);
  return reshape(x, shape);
}

Tensor squeeze(Tensor x, int64_t axis) {
  axis = builder_axis("squeeze", x, axis);
  if (x.dim(axis) != 1) {
    builder_error(
        "squeeze", {x},
        "axis " + std::to_string(axis) + " has extent " + std::to_string(x.dim(axis)) + ", not 1");
  }
  Shape shape = x.shape();
  shape.erase(shape.begin() + axis);
  return reshape(x, shape);
}

Tensor flatten(Tensor x, int64_t start_axis) {
  start_axis = builder_axis("flatten", x, start_axis);
  Shape shape(x.shape().begin(), x.shape().begin() + start_axis);
  shape.push_back(element_count(Shape(x.shape().begin() + start_axis, x.shape().end())));
  return reshape(x, shape);
}

Tensor gather(Tensor table, Tensor indices) {
  return apply(op::gather, {table, indices});
}

Tensor scatter_add(Tensor target, Tensor indices, Tensor updates) {
  return apply(op::scatter_add, {target, indices, updates});
}

}  // namespace mg
