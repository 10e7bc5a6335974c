#include "op_cases.hpp"

#include <array>
#include <cmath>
#include <map>
#include <random>
#include <string>
#include <utility>

#include "backends/vulkan/kernels/vulkan_target.hpp"
#include "ir/op_names.hpp"
#include "meganeura/autodiff.hpp"
#include "passes/passes.hpp"

namespace mg::conformance {

Tensor CaseGraph::in(std::string name, Shape shape, double low, double high) {
  inputs.push_back({name, shape, dtype_, low, high});
  return input(graph, std::move(name), std::move(shape), dtype_);
}

Tensor CaseGraph::in_f32(std::string name, Shape shape, double low, double high) {
  inputs.push_back({name, shape, DType::f32, low, high});
  return input(graph, std::move(name), std::move(shape));
}

Tensor CaseGraph::in_f16(std::string name, Shape shape, double low, double high) {
  inputs.push_back({name, shape, DType::f16, low, high});
  return input(graph, std::move(name), std::move(shape), DType::f16);
}

Tensor CaseGraph::whole(std::string name, Shape shape, int64_t low, int64_t high) {
  inputs.push_back(
      {name, shape, DType::f32, static_cast<double>(low), static_cast<double>(high), true});
  return input(graph, std::move(name), std::move(shape));
}

Tensor CaseGraph::indices(std::string name, Shape shape, int64_t rows) {
  inputs.push_back({name, shape, DType::i32, 0.0, static_cast<double>(rows)});
  return input(graph, std::move(name), std::move(shape), DType::i32);
}

void CaseGraph::out(Tensor value) {
  graph.set_output("y", value.id());
}

Environment draw_inputs(const CaseGraph& built, uint64_t seed) {
  std::mt19937_64 generator(seed);
  Environment environment;
  for (const CaseInput& spec : built.inputs) {
    HostTensor value(spec.shape);
    for (double& element : value.data) {
      const double drawn = std::uniform_real_distribution<double>(spec.low, spec.high)(generator);
      element = spec.dtype == DType::i32 || spec.whole
                    ? std::floor(drawn)
                    : static_cast<double>(static_cast<float>(drawn));
    }
    environment.leaves[spec.name] = value;
  }
  return environment;
}

namespace {

using Switched = std::map<std::string, std::string, std::less<>>;

// A GPU with the limits of the one the rules were tuned on, where the passes take the routes
// that write the ops they introduce (im2col, Winograd, split attention, ...), with `switches`
// forcing routes that these small shapes would not take.
vulkan::VulkanTarget tuned_gpu(const Switched& switches) {
  target::DeviceTraits device;
  device.max_shared_memory_bytes = 49152;
  device.max_workgroup_invocations = 1024;
  device.switches = Switches::from_environment(switches);
  return vulkan::VulkanTarget(device);
}

// y seeded by a random cotangent: the gradient of sum(y * seed) with respect to `wrt`.
Tensor gradient(CaseGraph& c, Tensor y, Tensor wrt) {
  const Tensor seed = c.in_f32("seed", y.shape());
  return Tensor(&c.graph, gradients(c.graph, y.id(), {wrt.id()}, seed.id()).at(wrt.id()));
}

// An op over the case's inputs by name (ops the passes write, and leaves of its case's dtype).
Tensor node(CaseGraph& c, std::string_view op, const std::vector<Tensor>& inputs,
            Attrs attrs = {}) {
  std::vector<ValueId> ids;
  for (const Tensor& tensor : inputs) ids.push_back(tensor.id());
  return Tensor(&c.graph, c.graph.add(op, ids, std::move(attrs)));
}

const Attrs kAttention{{"causal", int64_t{0}}, {"scale", 0.35}, {"has_mask", int64_t{0}}};

// q [1, 2, 9, 8] over k and v [1, 2, 13, 8]: the attention forward, and its gradients.
Tensor attention(CaseGraph& c, Tensor& q, Tensor& k, Tensor& v) {
  q = c.in("q", {1, 2, 9, 8});
  k = c.in("k", {1, 2, 13, 8});
  v = c.in("v", {1, 2, 13, 8});
  return scaled_dot_product_attention(q, k, v, {.scale = 0.35});
}

std::vector<OpCase> elementwise_cases() {
  const std::vector<DType> both{DType::f32, DType::f16};
  std::vector<OpCase> cases;
  // Binary ops over a broadcast second operand; whole numbers for the comparisons (ties).
  for (std::string_view op : {op::add, op::sub, op::mul, op::maximum, op::minimum}) {
    cases.push_back({op,
                     [op](CaseGraph& c) {
                       c.out(node(c, op, {c.in("a", {3, 5, 7}), c.in("b", {5, 1})}));
                     },
                     1e-5, both});
  }
  cases.push_back({op::div,
                   [](CaseGraph& c) {
                     c.out(node(c, op::div, {c.in("a", {3, 5, 7}), c.in("b", {5, 1}, 0.5, 2.0)}));
                   },
                   1e-5, both});
  cases.push_back(
      {op::pow,
       [](CaseGraph& c) {
         c.out(node(c, op::pow, {c.in("a", {3, 5, 7}, 0.5, 2.0), c.in("b", {5, 1}, -2.0, 2.0)}));
       },
       1e-5, both});
  // Comparisons of whole numbers 0..2, so that ties occur.
  for (std::string_view op :
       {op::equal, op::less, op::less_equal, op::greater, op::greater_equal}) {
    cases.push_back({op, [op](CaseGraph& c) {
                       c.out(node(c, op, {c.whole("a", {4, 9}, 0, 3), c.whole("b", {9}, 0, 3)}));
                     }});
  }
  cases.push_back(
      {op::where, [](CaseGraph& c) {
         const Tensor condition = c.in("condition", {4, 6});
         c.out(node(c, op::where,
                    {greater(condition, scalar(c.graph, 0.0)), c.in("a", {4, 6}), c.in("b", {6})}));
       }});
  // Unary ops over their domains.
  const std::vector<std::tuple<std::string_view, double, double>> unary{
      {op::neg, -1, 1},     {op::abs, -1, 1},    {op::exp, -2, 2},    {op::log, 0.1, 2},
      {op::sqrt, 0.1, 2},   {op::rsqrt, 0.1, 2}, {op::recip, 0.5, 2}, {op::square, -1, 1},
      {op::sin, -3, 3},     {op::cos, -3, 3},    {op::relu, -1, 1},   {op::silu, -3, 3},
      {op::sigmoid, -3, 3}, {op::tanh, -3, 3}};
  for (const auto& [op, low, high] : unary) {
    cases.push_back({op,
                     [op, low, high](CaseGraph& c) {
                       c.out(node(c, op, {c.in("x", {3, 37}, low, high)}));
                     },
                     1e-5, both});
  }
  for (const GeluApproximation approximation : {GeluApproximation::none, GeluApproximation::tanh}) {
    cases.push_back({op::gelu,
                     [approximation](CaseGraph& c) {
                       c.out(gelu(c.in("x", {3, 37}, -3, 3), approximation));
                     },
                     1e-5, both});
  }
  cases.push_back({op::gelu_grad, [](CaseGraph& c) {
                     const Tensor x = c.in_f32("x", {3, 37}, -3, 3);
                     c.out(gradient(c, gelu(x), x));
                   }});
  cases.push_back({op::cast, [](CaseGraph& c) {
                     c.out(cast(c.in_f32("x", {4, 9}, -10, 10), DType::i32));
                   }});
  cases.push_back({op::stop_gradient, [](CaseGraph& c) {
                     c.out(stop_gradient(c.in("x", {4, 9})));
                   }});
  return cases;
}

std::vector<OpCase> product_and_reduction_cases() {
  std::vector<OpCase> cases;
  cases.push_back({op::matmul,
                   [](CaseGraph& c) {
                     c.out(matmul(c.in("a", {2, 13, 21}), c.in("b", {17, 21}), false, true));
                   },
                   1e-5,
                   {DType::f32, DType::f16}});
  cases.push_back({op::half_matmul,
                   [](CaseGraph& c) {
                     c.out(node(c, op::half_matmul,
                                {c.in_f16("a", {32, 48}), c.in_f16("b", {48, 16})},
                                {{"f16_result", int64_t{1}}}));
                   },
                   3e-3,
                   {DType::f32},
                   true});
  cases.push_back({op::round_to_f16, [](CaseGraph& c) {
                     c.out(node(c, op::round_to_f16, {c.in_f32("x", {5, 36})}));
                   }});
  // 185 values: the kernel's last invocation rounds the one past the last whole vector of four.
  cases.push_back({op::round_to_bf16, [](CaseGraph& c) {
                     c.out(node(c, op::round_to_bf16, {c.in_f32("x", {5, 37})}));
                   }});
  cases.push_back({op::widen_f16, [](CaseGraph& c) {
                     c.out(node(c, op::widen_f16, {c.in_f16("x", {5, 36})}));
                   }});
  // A session takes no bfloat16 inputs: the values come from a rounding, which fuses into the
  // widening (the rounding in registers).
  cases.push_back(
      {op::widen_bf16, [](CaseGraph& c) {
         c.out(node(c, op::widen_bf16, {node(c, op::round_to_bf16, {c.in_f32("x", {5, 37})})}));
       }});
  cases.push_back({op::sum_to_f16,
                   [](CaseGraph& c) {
                     c.out(node(c, op::sum_to_f16, {c.in_f32("partials", {3, 5, 36})}));
                   },
                   2e-3});
  cases.push_back({op::sum,
                   [](CaseGraph& c) {
                     c.out(sum(c.in("x", {3, 5, 7}), {0, 2}));
                   },
                   1e-5,
                   {DType::f32, DType::f16}});
  cases.push_back({op::mean, [](CaseGraph& c) { c.out(mean(c.in("x", {3, 5, 7}), {1}, true)); }});
  cases.push_back({op::max, [](CaseGraph& c) { c.out(max(c.in("x", {3, 5, 7}), {2})); }});
  cases.push_back({op::max_grad, [](CaseGraph& c) {
                     const Tensor x = c.in_f32("x", {3, 5, 7});
                     c.out(gradient(c, max(x, {2}), x));
                   }});
  cases.push_back({op::argmax, [](CaseGraph& c) { c.out(argmax(c.in("x", {3, 5, 7}), 1)); }});
  // Few long rows take the larger workgroups (a language model's next token).
  cases.push_back({op::argmax, [](CaseGraph& c) { c.out(argmax(c.in("x", {3, 9000}), 1)); }});
  cases.push_back({op::sum, [](CaseGraph& c) { c.out(sum(c.in("x", {2, 9000}), {1})); }});
  cases.push_back({op::softmax, [](CaseGraph& c) { c.out(softmax(c.in("x", {6, 33}, -3, 3))); }});
  cases.push_back({op::log_softmax, [](CaseGraph& c) {
                     c.out(log_softmax(c.in("x", {6, 33}, -3, 3), 0));
                   }});
  return cases;
}

std::vector<OpCase> layout_cases() {
  std::vector<OpCase> cases;
  cases.push_back({op::reshape, [](CaseGraph& c) { c.out(reshape(c.in("x", {4, 9}), {6, 6})); }});
  cases.push_back({op::transpose, [](CaseGraph& c) {
                     c.out(transpose(c.in("x", {3, 4, 5}), {2, 0, 1}));
                   }});
  cases.push_back({op::slice, [](CaseGraph& c) { c.out(slice(c.in("x", {4, 9}), 1, 2, 7)); }});
  cases.push_back({op::concat, [](CaseGraph& c) {
                     c.out(concat({c.in("a", {4, 3}), c.in("b", {4, 5})}, 1));
                   }});
  cases.push_back({op::broadcast_to, [](CaseGraph& c) {
                     c.out(broadcast_to(c.in("x", {4, 1}), {3, 4, 5}));
                   }});
  cases.push_back({op::pad, [](CaseGraph& c) {
                     c.out(pad(c.in("x", {3, 4}), {{1, 2}, {0, 3}}, 0.5));
                   }});
  cases.push_back({op::gather, [](CaseGraph& c) {
                     c.out(gather(c.in("table", {7, 5}), c.indices("rows", {2, 3}, 7)));
                   }});
  cases.push_back({op::scatter_add, [](CaseGraph& c) {
                     c.out(scatter_add(c.in("target", {7, 5}), c.indices("rows", {6}, 7),
                                       c.in("updates", {6, 5})));
                   }});
  return cases;
}

std::vector<OpCase> convolution_cases() {
  std::vector<OpCase> cases;
  cases.push_back({op::conv2d, [](CaseGraph& c) {
                     c.out(conv2d(c.in("x", {2, 3, 9, 7}), c.in("w", {4, 3, 3, 3}), std::nullopt,
                                  {.stride = {2, 1}, .padding = {1, 1}}));
                   }});
  cases.push_back({op::conv2d_grad_input, [](CaseGraph& c) {
                     const Tensor x = c.in("x", {2, 3, 9, 7});
                     c.out(gradient(c, conv2d(x, c.in("w", {4, 3, 3, 3})), x));
                   }});
  cases.push_back({op::conv2d_grad_weight, [](CaseGraph& c) {
                     const Tensor w = c.in("w", {4, 3, 3, 3});
                     c.out(gradient(c, conv2d(c.in("x", {2, 3, 9, 7}), w), w));
                   }});
  cases.push_back({op::conv_transpose2d, [](CaseGraph& c) {
                     c.out(conv_transpose2d(c.in("x", {2, 3, 5, 4}), c.in("w", {3, 4, 3, 3}),
                                            std::nullopt, {.stride = {2, 2}, .padding = {1, 1}}));
                   }});
  // The ops the im2col pass writes, on a GPU where it runs (Winograd off).
  const auto columns = [](CaseGraph& c, Tensor y) {
    c.out(y);
    c.graph = passes::im2col_convolutions(c.graph, tuned_gpu({{"MEGANEURA_WINOGRAD_CONV", "0"}}),
                                          uint64_t{1} << 30);
  };
  cases.push_back({op::im2col, [columns](CaseGraph& c) {
                     columns(c, conv2d(c.in("x", {2, 4, 9, 7}), c.in("w", {5, 4, 3, 3})));
                   }});
  cases.push_back(
      {op::col2im, [columns](CaseGraph& c) {
         const Tensor x = c.in("x", {2, 4, 9, 7});
         columns(
             c,
             gradient(c, conv2d(x, c.in("w", {5, 4, 3, 3}), std::nullopt, {.stride = {2, 2}}), x));
       }});
  // Winograd's transforms, forced on for shapes below the rule's minimums.
  const auto winograd_weight_gradient = [](CaseGraph& c) {
    const Tensor w = c.in("w", {4, 3, 3, 3});
    c.out(gradient(c, conv2d(c.in("x", {2, 3, 9, 7}), w, std::nullopt, {.padding = {1, 1}}), w));
    c.graph = passes::im2col_convolutions(
        c.graph, tuned_gpu({{"MEGANEURA_WINOGRAD_WEIGHT_GRAD", "1"}}), uint64_t{1} << 30);
  };
  for (std::string_view op :
       {op::winograd_tiles, op::winograd_grad_tiles, op::winograd_weight_grad})
    cases.push_back({op, winograd_weight_gradient});
  const auto winograd_forward = [](CaseGraph& c) {
    c.out(conv2d(c.in("x", {2, 3, 9, 7}), c.in("w", {4, 3, 3, 3}), std::nullopt,
                 {.padding = {1, 1}}));
    c.graph = passes::im2col_convolutions(c.graph, tuned_gpu({{"MEGANEURA_WINOGRAD_CONV", "1"}}),
                                          uint64_t{1} << 30);
  };
  for (std::string_view op : {op::winograd_filter, op::winograd_output})
    cases.push_back({op, winograd_forward});
  return cases;
}

std::vector<OpCase> pool_and_norm_cases() {
  std::vector<OpCase> cases;
  cases.push_back({op::max_pool2d, [](CaseGraph& c) {
                     c.out(max_pool2d(c.in("x", {2, 3, 9, 8}), {3, 3}, {2, 2}, {1, 1}));
                   }});
  cases.push_back({op::max_pool2d_grad, [](CaseGraph& c) {
                     const Tensor x = c.in("x", {2, 3, 9, 8});
                     c.out(gradient(c, max_pool2d(x, {3, 3}, {2, 2}, {1, 1}), x));
                   }});
  cases.push_back({op::avg_pool2d, [](CaseGraph& c) {
                     c.out(avg_pool2d(c.in("x", {2, 3, 9, 8}), {3, 3}, {2, 2}, {1, 1}));
                   }});
  cases.push_back({op::avg_pool2d_grad, [](CaseGraph& c) {
                     const Tensor x = c.in("x", {2, 3, 9, 8});
                     c.out(gradient(c, avg_pool2d(x, {3, 3}, {2, 2}, {1, 1}), x));
                   }});
  cases.push_back({op::upsample_nearest2d, [](CaseGraph& c) {
                     c.out(upsample_nearest2d(c.in("x", {2, 3, 4, 5}), 2));
                   }});
  cases.push_back({op::upsample_nearest2d_grad, [](CaseGraph& c) {
                     const Tensor x = c.in("x", {2, 3, 4, 5});
                     c.out(gradient(c, upsample_nearest2d(x, 2), x));
                   }});
  cases.push_back({op::upsample_bilinear2d, [](CaseGraph& c) {
                     c.out(upsample_bilinear2d(c.in("x", {2, 3, 4, 5}), 7, 9));
                   }});
  cases.push_back({op::upsample_bilinear2d_grad, [](CaseGraph& c) {
                     const Tensor x = c.in("x", {2, 3, 4, 5});
                     c.out(gradient(c, upsample_bilinear2d(x, 7, 9), x));
                   }});
  cases.push_back({op::layer_norm, [](CaseGraph& c) {
                     c.out(layer_norm(c.in("x", {5, 37}), c.in("w", {37}), c.in("b", {37})));
                   }});
  cases.push_back({op::layer_norm_grad, [](CaseGraph& c) {
                     const Tensor x = c.in("x", {5, 37});
                     c.out(gradient(c, layer_norm(x, c.in("w", {37}), std::nullopt), x));
                   }});
  cases.push_back({op::rms_norm, [](CaseGraph& c) {
                     c.out(rms_norm(c.in("x", {5, 37}), c.in("w", {37})));
                   }});
  cases.push_back({op::rms_norm_grad, [](CaseGraph& c) {
                     const Tensor x = c.in("x", {5, 37});
                     c.out(gradient(c, rms_norm(x, c.in("w", {37})), x));
                   }});
  cases.push_back({op::group_norm, [](CaseGraph& c) {
                     c.out(group_norm(c.in("x", {2, 6, 5, 3}), 3, c.in("w", {6}), c.in("b", {6})));
                   }});
  cases.push_back({op::group_norm_grad, [](CaseGraph& c) {
                     const Tensor x = c.in("x", {2, 6, 5, 3});
                     c.out(gradient(c, group_norm(x, 3, c.in("w", {6}), std::nullopt), x));
                   }});
  const auto batch_norm_of = [](CaseGraph& c, Tensor x) {
    return batch_norm(x, c.in("w", {6}), c.in("b", {6}), c.in("mean", {6}),
                      c.in("variance", {6}, 0.5, 2.0), false);
  };
  cases.push_back({op::batch_norm, [batch_norm_of](CaseGraph& c) {
                     c.out(batch_norm_of(c, c.in("x", {2, 6, 5, 3})));
                   }});
  cases.push_back({op::batch_norm_grad, [batch_norm_of](CaseGraph& c) {
                     const Tensor x = c.in("x", {2, 6, 5, 3});
                     c.out(gradient(c, batch_norm_of(c, x), x));
                   }});
  return cases;
}

std::vector<OpCase> attention_and_loss_cases() {
  std::vector<OpCase> cases;
  cases.push_back({op::scaled_dot_product_attention, [](CaseGraph& c) {
                     Tensor q, k, v;
                     c.out(attention(c, q, k, v));
                   }});
  // The attention_lse of a backward over a saved forward: its own launch.
  cases.push_back({op::attention_lse, [](CaseGraph& c) {
                     c.out(node(c, op::attention_lse,
                                {c.in("q", {1, 2, 9, 8}), c.in("k", {1, 2, 13, 8})}, kAttention));
                   }});
  for (const auto& [op, wrt] : {std::pair<std::string_view, int>{op::attention_grad_q, 0},
                                {op::attention_grad_k, 1},
                                {op::attention_grad_v, 2}}) {
    cases.push_back({op, [wrt](CaseGraph& c) {
                       Tensor q, k, v;
                       const Tensor y = attention(c, q, k, v);
                       c.out(gradient(c, y, std::array<Tensor, 3>{q, k, v}[wrt]));
                     }});
  }
  // The scores' gradient, which dQ as a matmul reads (passes/attention_grad_q_gemm.cpp).
  cases.push_back({op::attention_grad_scores, [](CaseGraph& c) {
                     Tensor q, k, v;
                     const Tensor y = attention(c, q, k, v);
                     c.out(gradient(c, y, q));
                     c.graph = passes::attention_grad_q_gemm(c.graph, uint64_t{1} << 30);
                   }});
  // The forward over two key slices, joined by attention_combine (forced split).
  cases.push_back({op::attention_combine, [](CaseGraph& c) {
                     const Tensor q = c.in("q", {1, 2, 9, 8});
                     const Tensor kv = c.in("kv", {1, 2, 150, 8});
                     c.out(scaled_dot_product_attention(q, kv, kv, {.causal = true}));
                     c.graph = passes::split_attention(
                         c.graph, tuned_gpu({{"MEGANEURA_ATTENTION_SPLITS", "2"}}));
                   }});
  cases.push_back({op::rope, [](CaseGraph& c) {
                     c.out(rope(c.in("x", {1, 2, 7, 8}), 10000.0, 3));
                   }});
  // Each sample at its own positions (a padded prefix's), up to thousands.
  cases.push_back(
      {op::rope, [](CaseGraph& c) {
         c.out(rope(c.in("x", {2, 3, 7, 8}), c.indices("positions", {2, 7}, 5000), 10000.0, 3));
       }});
  cases.push_back(
      {op::cross_entropy, [](CaseGraph& c) {
         c.out(cross_entropy(c.in("logits", {6, 11}, -3, 3), c.indices("labels", {6}, 11), 0.1));
       }});
  // The per_row form and its sum (passes/split_reductions.cpp), with ignored rows; the second
  // takes the long-row workgroup.
  for (const Shape& shape : {Shape{40, 2000}, Shape{9, 9000}}) {
    cases.push_back({op::cross_entropy, [shape](CaseGraph& c) {
                       // Labels in [0, 3) with ignore_index 1: about a third of the rows
                       // are ignored.
                       const Tensor labels = c.indices("labels", {shape[0]}, 3);
                       c.out(cross_entropy(c.in("logits", shape, -3, 3), labels, 0.1, 1));
                       c.graph = passes::split_reductions(c.graph);
                     }});
  }
  cases.push_back({op::cross_entropy_grad, [](CaseGraph& c) {
                     const Tensor logits = c.in_f32("logits", {6, 11}, -3, 3);
                     c.out(
                         gradient(c, cross_entropy(logits, c.indices("labels", {6}, 11)), logits));
                   }});
  return cases;
}

}  // namespace

const std::vector<OpCase>& op_cases() {
  static const std::vector<OpCase> cases = [] {
    std::vector<OpCase> all;
    for (std::vector<OpCase> family :
         {elementwise_cases(), product_and_reduction_cases(), layout_cases(), convolution_cases(),
          pool_and_norm_cases(), attention_and_loss_cases()}) {
      for (OpCase& c : family) all.push_back(std::move(c));
    }
    return all;
  }();
  return cases;
}

}  // namespace mg::conformance
