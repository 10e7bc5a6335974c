#pragma once
// The name of every op, as a graph stores it (Node::op) and the registry knows it
// (ops/registry.cpp). The compiler names ops through these constants, never through string
// literals: a misspelt op does not compile, and every use of an op can be found. An op added to
// a family file gets its constant here (the registry test checks that both lists agree).
#include <array>
#include <string_view>

namespace mg::op {

// Leaves (ops/leaf.cpp)
inline constexpr std::string_view input = "input";
inline constexpr std::string_view parameter = "parameter";
inline constexpr std::string_view state = "state";
inline constexpr std::string_view constant = "constant";

// Elementwise (ops/elementwise.cpp)
inline constexpr std::string_view add = "add";
inline constexpr std::string_view sub = "sub";
inline constexpr std::string_view mul = "mul";
inline constexpr std::string_view div = "div";
inline constexpr std::string_view pow = "pow";
inline constexpr std::string_view maximum = "maximum";
inline constexpr std::string_view minimum = "minimum";
inline constexpr std::string_view equal = "equal";
inline constexpr std::string_view less = "less";
inline constexpr std::string_view less_equal = "less_equal";
inline constexpr std::string_view greater = "greater";
inline constexpr std::string_view greater_equal = "greater_equal";
inline constexpr std::string_view where = "where";
inline constexpr std::string_view neg = "neg";
inline constexpr std::string_view abs = "abs";
inline constexpr std::string_view exp = "exp";
inline constexpr std::string_view log = "log";
inline constexpr std::string_view sqrt = "sqrt";
inline constexpr std::string_view rsqrt = "rsqrt";
inline constexpr std::string_view recip = "recip";
inline constexpr std::string_view square = "square";
inline constexpr std::string_view sin = "sin";
inline constexpr std::string_view cos = "cos";
inline constexpr std::string_view relu = "relu";
inline constexpr std::string_view silu = "silu";
inline constexpr std::string_view sigmoid = "sigmoid";
inline constexpr std::string_view tanh = "tanh";
inline constexpr std::string_view gelu = "gelu";
inline constexpr std::string_view gelu_grad = "gelu_grad";
inline constexpr std::string_view cast = "cast";
inline constexpr std::string_view stop_gradient = "stop_gradient";

// Matrix products (ops/matmul.cpp, ops/half_gemm.cpp)
inline constexpr std::string_view matmul = "matmul";
inline constexpr std::string_view half_matmul = "half_matmul";
inline constexpr std::string_view round_to_f16 = "round_to_f16";
inline constexpr std::string_view round_to_bf16 = "round_to_bf16";
inline constexpr std::string_view widen_f16 = "widen_f16";
inline constexpr std::string_view widen_bf16 = "widen_bf16";
inline constexpr std::string_view sum_to_f16 = "sum_to_f16";

// Reductions (ops/reduce.cpp)
inline constexpr std::string_view sum = "sum";
inline constexpr std::string_view mean = "mean";
inline constexpr std::string_view max = "max";
inline constexpr std::string_view max_grad = "max_grad";
inline constexpr std::string_view argmax = "argmax";
inline constexpr std::string_view softmax = "softmax";
inline constexpr std::string_view log_softmax = "log_softmax";

// Shape and layout (ops/shape.cpp)
inline constexpr std::string_view reshape = "reshape";
inline constexpr std::string_view transpose = "transpose";
inline constexpr std::string_view slice = "slice";
inline constexpr std::string_view concat = "concat";
inline constexpr std::string_view broadcast_to = "broadcast_to";
inline constexpr std::string_view pad = "pad";
inline constexpr std::string_view gather = "gather";
inline constexpr std::string_view scatter_add = "scatter_add";

// Convolutions (ops/conv.cpp, ops/winograd.cpp)
inline constexpr std::string_view conv2d = "conv2d";
inline constexpr std::string_view conv2d_grad_input = "conv2d_grad_input";
inline constexpr std::string_view conv2d_grad_weight = "conv2d_grad_weight";
inline constexpr std::string_view im2col = "im2col";
inline constexpr std::string_view col2im = "col2im";
inline constexpr std::string_view conv_transpose2d = "conv_transpose2d";
inline constexpr std::string_view winograd_tiles = "winograd_tiles";
inline constexpr std::string_view winograd_grad_tiles = "winograd_grad_tiles";
inline constexpr std::string_view winograd_weight_grad = "winograd_weight_grad";
inline constexpr std::string_view winograd_filter = "winograd_filter";
inline constexpr std::string_view winograd_output = "winograd_output";

// Pooling and resampling (ops/pool.cpp)
inline constexpr std::string_view max_pool2d = "max_pool2d";
inline constexpr std::string_view max_pool2d_grad = "max_pool2d_grad";
inline constexpr std::string_view avg_pool2d = "avg_pool2d";
inline constexpr std::string_view avg_pool2d_grad = "avg_pool2d_grad";
inline constexpr std::string_view upsample_nearest2d = "upsample_nearest2d";
inline constexpr std::string_view upsample_nearest2d_grad = "upsample_nearest2d_grad";
inline constexpr std::string_view upsample_bilinear2d = "upsample_bilinear2d";
inline constexpr std::string_view upsample_bilinear2d_grad = "upsample_bilinear2d_grad";

// Normalisation (ops/norm.cpp)
inline constexpr std::string_view layer_norm = "layer_norm";
inline constexpr std::string_view layer_norm_grad = "layer_norm_grad";
inline constexpr std::string_view rms_norm = "rms_norm";
inline constexpr std::string_view rms_norm_grad = "rms_norm_grad";
inline constexpr std::string_view group_norm = "group_norm";
inline constexpr std::string_view group_norm_grad = "group_norm_grad";
inline constexpr std::string_view batch_norm = "batch_norm";
inline constexpr std::string_view batch_norm_grad = "batch_norm_grad";

// Attention (ops/attention.cpp)
inline constexpr std::string_view scaled_dot_product_attention = "scaled_dot_product_attention";
inline constexpr std::string_view attention_combine = "attention_combine";
inline constexpr std::string_view attention_lse = "attention_lse";
inline constexpr std::string_view attention_grad_q = "attention_grad_q";
inline constexpr std::string_view attention_grad_k = "attention_grad_k";
inline constexpr std::string_view attention_grad_v = "attention_grad_v";
inline constexpr std::string_view attention_grad_scores = "attention_grad_scores";
inline constexpr std::string_view rope = "rope";

// Losses (ops/loss.cpp)
inline constexpr std::string_view cross_entropy = "cross_entropy";
inline constexpr std::string_view cross_entropy_grad = "cross_entropy_grad";

// Every constant above, in that order.
inline constexpr std::array<std::string_view, 94> kAll = {input,
                                                          parameter,
                                                          state,
                                                          constant,
                                                          add,
                                                          sub,
                                                          mul,
                                                          div,
                                                          pow,
                                                          maximum,
                                                          minimum,
                                                          equal,
                                                          less,
                                                          less_equal,
                                                          greater,
                                                          greater_equal,
                                                          where,
                                                          neg,
                                                          abs,
                                                          exp,
                                                          log,
                                                          sqrt,
                                                          rsqrt,
                                                          recip,
                                                          square,
                                                          sin,
                                                          cos,
                                                          relu,
                                                          silu,
                                                          sigmoid,
                                                          tanh,
                                                          gelu,
                                                          gelu_grad,
                                                          cast,
                                                          stop_gradient,
                                                          matmul,
                                                          half_matmul,
                                                          round_to_f16,
                                                          round_to_bf16,
                                                          widen_f16,
                                                          widen_bf16,
                                                          sum_to_f16,
                                                          sum,
                                                          mean,
                                                          max,
                                                          max_grad,
                                                          argmax,
                                                          softmax,
                                                          log_softmax,
                                                          reshape,
                                                          transpose,
                                                          slice,
                                                          concat,
                                                          broadcast_to,
                                                          pad,
                                                          gather,
                                                          scatter_add,
                                                          conv2d,
                                                          conv2d_grad_input,
                                                          conv2d_grad_weight,
                                                          im2col,
                                                          col2im,
                                                          conv_transpose2d,
                                                          winograd_tiles,
                                                          winograd_grad_tiles,
                                                          winograd_weight_grad,
                                                          winograd_filter,
                                                          winograd_output,
                                                          max_pool2d,
                                                          max_pool2d_grad,
                                                          avg_pool2d,
                                                          avg_pool2d_grad,
                                                          upsample_nearest2d,
                                                          upsample_nearest2d_grad,
                                                          upsample_bilinear2d,
                                                          upsample_bilinear2d_grad,
                                                          layer_norm,
                                                          layer_norm_grad,
                                                          rms_norm,
                                                          rms_norm_grad,
                                                          group_norm,
                                                          group_norm_grad,
                                                          batch_norm,
                                                          batch_norm_grad,
                                                          scaled_dot_product_attention,
                                                          attention_combine,
                                                          attention_lse,
                                                          attention_grad_q,
                                                          attention_grad_k,
                                                          attention_grad_v,
                                                          attention_grad_scores,
                                                          rope,
                                                          cross_entropy,
                                                          cross_entropy_grad};

}  // namespace mg::op
