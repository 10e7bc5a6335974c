#include "backends/vulkan/kernels/gemm_epilogue.hpp"

#include "backends/vulkan/kernels/index_codegen.hpp"

namespace mg::kernels {

std::string matmul_store_function(const Graph& graph, ValueId matmul,
                                  const MatmulEpilogue* epilogue, Launch& launch,
                                  ValueId moved_to) {
  const Shape& shape = graph.type(matmul).shape;
  const size_t rank = shape.size();
  const std::string offset =
      "(z * " + glsl_uint(shape[rank - 2]) + " + m) * " + glsl_uint(shape[rank - 1]) + " + n";
  // The reshapes between the result and the transpose keep each element's flat index.
  const bool moved = moved_to != kNoValue;
  const std::string moved_index =
      moved ? transpose_index_function(graph, moved_to, "moved_index", true) : std::string();
  const std::string stored_at = moved ? "moved_index(" + offset + ")" : offset;
  const std::string signature = "void store_c(uint z, uint m, uint n, float value) {\n";
  if (!epilogue) {
    launch.operands.push_back({"c", moved ? moved_to : matmul, true});
    const std::string stored =
        graph.type(matmul).dtype == DType::f16 ? "float16_t(value)" : "value";
    return moved_index + signature + "  c[" + stored_at + "] = " + stored + ";\n}\n";
  }

  const PointwiseDag& dag = epilogue->dag;
  const Shape batch_shape(shape.begin(), shape.end() - 2);
  // Coordinates of the output element, outermost first: the batch axes of z, then m and n.
  std::vector<std::string> coordinates;
  for (size_t axis = 0; axis < batch_shape.size(); ++axis)
    coordinates.push_back("batch" + std::to_string(axis));
  coordinates.push_back("m");
  coordinates.push_back("n");

  launch.operands.push_back({"c", moved ? moved_to : dag.output, true});
  std::vector<std::string> input_expressions;
  for (size_t k = 0; k < dag.inputs.size(); ++k) {
    const Node& input = graph.node(dag.inputs[k]);
    if (k == epilogue->product_input) {
      input_expressions.push_back("value");
    } else if (input.is_uniform_constant()) {
      input_expressions.push_back(glsl_float(input.attrs.get_float("value")));
    } else {
      const std::string name = "epilogue" + std::to_string(k);
      launch.operands.push_back({name, dag.inputs[k], false});
      // Inputs broadcast from the right: their axes are the output's last ones.
      const Shape& input_shape = input.type.shape;
      const std::vector<std::string> input_coordinates(coordinates.end() - input_shape.size(),
                                                       coordinates.end());
      const std::string load = name + "[" + flat_index_glsl(input_shape, input_coordinates) + "]";
      input_expressions.push_back(input.type.dtype == DType::f32 ? load : "float(" + load + ")");
    }
  }
  // Values of the DAG that the graph keeps or other nodes read, of the product's shape (f32).
  std::string extra_stores;
  for (size_t k = 0; k < dag.extra_outputs.size(); ++k) {
    const std::string name = "epilogue_extra" + std::to_string(k);
    launch.operands.push_back({name, dag.extra_outputs[k].value, true});
    extra_stores += "  " + name + "[" + offset +
                    "] = " + pointwise_value_glsl(dag.extra_outputs[k].statement) + ";\n";
  }
  const std::string result = pointwise_result_glsl(dag);
  const bool float_output = graph.type(dag.output).dtype == DType::f32;
  return std::string(pointwise_functions_glsl()) + moved_index + signature +
         (batch_shape.empty() ? "" : coordinates_glsl(batch_shape, "z", "batch")) +
         pointwise_statements_glsl(dag, input_expressions) + "  c[" + stored_at +
         "] = " + (float_output ? result : "int(" + result + ")") + ";\n" + extra_stores + "}\n";
}

uint32_t matmul_epilogue_bindings(const Graph& graph, const MatmulEpilogue& epilogue) {
  // a, b, the result and the extra outputs
  uint32_t bindings = 3 + static_cast<uint32_t>(epilogue.dag.extra_outputs.size());
  for (size_t k = 0; k < epilogue.dag.inputs.size(); ++k) {
    if (k != epilogue.product_input && !graph.node(epilogue.dag.inputs[k]).is_uniform_constant())
      ++bindings;
  }
  return bindings;
}

}  // namespace mg::kernels
