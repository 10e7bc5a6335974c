#include "backends/vulkan/kernels/gemm_epilogue.hpp"

#include "backends/vulkan/kernels/index_codegen.hpp"

namespace mg::kernels {

std::string matmul_store_function(const Graph& graph, ValueId matmul,
                                  const MatmulEpilogue* epilogue, Launch& launch) {
  const Shape& shape = graph.type(matmul).shape;
  const size_t rank = shape.size();
  const std::string offset =
      "(z * " + glsl_uint(shape[rank - 2]) + " + m) * " + glsl_uint(shape[rank - 1]) + " + n";
  const std::string signature = "void store_c(uint z, uint m, uint n, float value) {\n";
  if (!epilogue) {
    launch.operands.push_back({"c", matmul, true});
    const std::string stored =
        graph.type(matmul).dtype == DType::f16 ? "float16_t(value)" : "value";
    return signature + "  c[" + offset + "] = " + stored + ";\n}\n";
  }

  const PointwiseDag& dag = epilogue->dag;
  const Shape batch_shape(shape.begin(), shape.end() - 2);
  // Coordinates of the output element, outermost first: the batch axes of z, then m and n.
  std::vector<std::string> coordinates;
  for (size_t axis = 0; axis < batch_shape.size(); ++axis)
    coordinates.push_back("batch" + std::to_string(axis));
  coordinates.push_back("m");
  coordinates.push_back("n");

  launch.operands.push_back({"c", dag.output, true});
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
  return std::string(pointwise_functions_glsl()) + signature +
         (batch_shape.empty() ? "" : coordinates_glsl(batch_shape, "z", "batch")) +
         pointwise_statements_glsl(dag, input_expressions) + "  c[" + offset +
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
