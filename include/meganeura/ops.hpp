#pragma once
// The graph-building API: a Tensor is a handle to a value of a Graph, and each function appends
// the op's node(s). Every function throws mg::Error naming the op and the shapes on misuse.
// Axes may be negative (counted from the end).
#include <optional>
#include <string>
#include <vector>

#include "meganeura/graph.hpp"

namespace mg {

class Tensor {
 public:
  Tensor() = default;
  Tensor(Graph* graph, ValueId id) : graph_(graph), id_(id) {}

  Graph& graph() const;
  ValueId id() const { return id_; }
  bool valid() const { return graph_ != nullptr && id_ != kNoValue; }
  const TensorType& type() const { return graph().type(id_); }
  const Shape& shape() const { return type().shape; }
  DType dtype() const { return type().dtype; }
  int64_t rank() const { return type().rank(); }
  int64_t dim(int64_t axis) const;  // negative axes count from the end

 private:
  Graph* graph_ = nullptr;
  ValueId id_ = kNoValue;
};

// ---- leaves -------------------------------------------------------------------------------
Tensor input(Graph& graph, std::string name, Shape shape, DType dtype = DType::f32);
// An f16 or bf16 parameter or input holds f16 or bfloat16 values (the runtime rounds what it is
// given); the optimizers take f32 parameters only (cast one to f16 or bf16 where the graph uses
// it).
Tensor parameter(Graph& graph, std::string name, Shape shape, Init init, DType dtype = DType::f32);
Tensor scalar(Graph& graph, double value, DType dtype = DType::f32);  // rank-0 constant
Tensor full(Graph& graph, Shape shape, double value, DType dtype = DType::f32);

// ---- elementwise (NumPy broadcasting for binary ops) ---------------------------------------
Tensor add(Tensor a, Tensor b);
Tensor sub(Tensor a, Tensor b);
Tensor mul(Tensor a, Tensor b);
Tensor div(Tensor a, Tensor b);
Tensor pow(Tensor a, Tensor b);
Tensor maximum(Tensor a, Tensor b);
Tensor minimum(Tensor a, Tensor b);
// Comparisons give 1 or 0 in the dtype of their inputs.
Tensor equal(Tensor a, Tensor b);
Tensor less(Tensor a, Tensor b);
Tensor less_equal(Tensor a, Tensor b);
Tensor greater(Tensor a, Tensor b);
Tensor greater_equal(Tensor a, Tensor b);
Tensor where(Tensor condition, Tensor if_true, Tensor if_false);  // condition != 0

Tensor neg(Tensor x);
Tensor abs(Tensor x);
Tensor exp(Tensor x);
Tensor log(Tensor x);
Tensor sqrt(Tensor x);
Tensor rsqrt(Tensor x);
Tensor recip(Tensor x);
Tensor square(Tensor x);
Tensor sin(Tensor x);
Tensor cos(Tensor x);
Tensor relu(Tensor x);
enum class GeluApproximation { none, tanh };  // none = exact erf form
Tensor gelu(Tensor x, GeluApproximation approximation = GeluApproximation::none);
Tensor silu(Tensor x);
Tensor sigmoid(Tensor x);
Tensor tanh(Tensor x);
Tensor cast(Tensor x, DType dtype);
Tensor stop_gradient(Tensor x);  // identity forward, no gradient flows back

Tensor operator+(Tensor a, Tensor b);
Tensor operator-(Tensor a, Tensor b);
Tensor operator*(Tensor a, Tensor b);
Tensor operator/(Tensor a, Tensor b);
Tensor operator-(Tensor x);
Tensor operator+(Tensor a, double b);
Tensor operator-(Tensor a, double b);
Tensor operator*(Tensor a, double b);
Tensor operator/(Tensor a, double b);
Tensor operator+(double a, Tensor b);
Tensor operator-(double a, Tensor b);
Tensor operator*(double a, Tensor b);
Tensor operator/(double a, Tensor b);

// ---- matrix products -----------------------------------------------------------------------
// a [..., M, K] x b [..., K, N] -> [..., M, N]; batch dimensions broadcast. Transposes swap
// the last two axes of an operand before the product.
Tensor matmul(Tensor a, Tensor b, bool transpose_a = false, bool transpose_b = false);
// x [..., in] with weight [out, in] (PyTorch layout) and optional bias [out].
Tensor linear(Tensor x, Tensor weight, std::optional<Tensor> bias = std::nullopt);

// ---- reductions ----------------------------------------------------------------------------
Tensor sum(Tensor x, std::vector<int64_t> axes, bool keepdims = false);
Tensor mean(Tensor x, std::vector<int64_t> axes, bool keepdims = false);
Tensor max(Tensor x, std::vector<int64_t> axes, bool keepdims = false);
Tensor sum_all(Tensor x);                                      // rank-0 result
Tensor mean_all(Tensor x);                                     // rank-0 result
Tensor argmax(Tensor x, int64_t axis, bool keepdims = false);  // i32 result
Tensor softmax(Tensor x, int64_t axis = -1);
Tensor log_softmax(Tensor x, int64_t axis = -1);

// ---- shape ---------------------------------------------------------------------------------
Tensor reshape(Tensor x, Shape shape);  // one extent may be -1
Tensor transpose(Tensor x, std::vector<int64_t> permutation);
Tensor transpose(Tensor x, int64_t axis0, int64_t axis1);          // swap two axes
Tensor slice(Tensor x, int64_t axis, int64_t start, int64_t end);  // [start, end)
Tensor concat(const std::vector<Tensor>& parts, int64_t axis);
std::vector<Tensor> split(Tensor x, const std::vector<int64_t>& sizes, int64_t axis);
Tensor broadcast_to(Tensor x, Shape shape);
// pads[i] = {before, after} for every axis i.
Tensor pad(Tensor x, const std::vector<std::pair<int64_t, int64_t>>& pads, double value = 0);
Tensor unsqueeze(Tensor x, int64_t axis);
Tensor squeeze(Tensor x, int64_t axis);
Tensor flatten(Tensor x, int64_t start_axis = 1);  // [N, ...] -> [N, prod(...)]
// Embedding lookup: table [V, D], indices (i32, any shape S) -> [S..., D].
Tensor gather(Tensor table, Tensor indices);
// target [V, D] plus updates [S..., D] added at rows indices [S...] (i32).
Tensor scatter_add(Tensor target, Tensor indices, Tensor updates);

// ---- convolution and pooling (NCHW) --------------------------------------------------------
struct Conv2dOptions {
  std::vector<int64_t> stride{1, 1};
  std::vector<int64_t> padding{0, 0};
  std::vector<int64_t> dilation{1, 1};
  int64_t groups = 1;
};
// x [N, C, H, W], weight [O, C/groups, KH, KW], bias [O].
Tensor conv2d(Tensor x, Tensor weight, std::optional<Tensor> bias = std::nullopt,
              const Conv2dOptions& options = {});
// x [N, C, L], weight [O, C/groups, K]; options use one element per vector.
Tensor conv1d(Tensor x, Tensor weight, std::optional<Tensor> bias = std::nullopt,
              int64_t stride = 1, int64_t padding = 0, int64_t dilation = 1, int64_t groups = 1);
struct ConvTranspose2dOptions {
  std::vector<int64_t> stride{1, 1};
  std::vector<int64_t> padding{0, 0};
  std::vector<int64_t> output_padding{0, 0};
  std::vector<int64_t> dilation{1, 1};
  int64_t groups = 1;
};
// x [N, C, H, W], weight [C, O/groups, KH, KW] (PyTorch layout), bias [O].
Tensor conv_transpose2d(Tensor x, Tensor weight, std::optional<Tensor> bias = std::nullopt,
                        const ConvTranspose2dOptions& options = {});
Tensor max_pool2d(Tensor x, std::vector<int64_t> kernel, std::vector<int64_t> stride = {},
                  std::vector<int64_t> padding = {0, 0});  // empty stride = kernel
Tensor avg_pool2d(Tensor x, std::vector<int64_t> kernel, std::vector<int64_t> stride = {},
                  std::vector<int64_t> padding = {0, 0});  // padding counts in the average
Tensor global_avg_pool2d(Tensor x);                        // [N, C, H, W] -> [N, C, 1, 1]
Tensor upsample_nearest2d(Tensor x, int64_t scale);
Tensor upsample_bilinear2d(Tensor x, int64_t out_height, int64_t out_width);  // align_corners=0

// ---- normalization -------------------------------------------------------------------------
// Over the last axis; weight and bias have the size of the last axis.
Tensor layer_norm(Tensor x, std::optional<Tensor> weight, std::optional<Tensor> bias,
                  double eps = 1e-5);
Tensor rms_norm(Tensor x, std::optional<Tensor> weight, double eps = 1e-6);
// x [N, C, ...]; weight and bias [C].
Tensor group_norm(Tensor x, int64_t groups, std::optional<Tensor> weight,
                  std::optional<Tensor> bias, double eps = 1e-5);
// x [N, C, ...]; weight, bias, running_mean, running_var [C]. In training the batch statistics
// normalise and the running statistics (state leaves) are updated through Graph::assign with
// PyTorch's rule (unbiased variance, `momentum` weight on the new value).
Tensor batch_norm(Tensor x, std::optional<Tensor> weight, std::optional<Tensor> bias,
                  Tensor running_mean, Tensor running_var, bool training, double momentum = 0.1,
                  double eps = 1e-5);

// ---- attention -----------------------------------------------------------------------------
struct AttentionOptions {
  bool causal = false;
  std::optional<double> scale;  // default 1/sqrt(head_dim)
  std::optional<Tensor> mask;   // additive, broadcastable to [B, Hq, Sq, Sk] (padding masks)
};
// q [B, Hq, Sq, D], k [B, Hkv, Sk, D], v [B, Hkv, Sk, Dv]; Hq a multiple of Hkv (grouped-query).
// Cross attention is Sq != Sk. Result [B, Hq, Sq, Dv].
Tensor scaled_dot_product_attention(Tensor q, Tensor k, Tensor v,
                                    const AttentionOptions& options = {});
// Rotary position embedding (Llama "rotate half" form) on x [B, H, S, D] at positions
// position_offset .. position_offset+S-1.
Tensor rope(Tensor x, double theta = 10000.0, int64_t position_offset = 0);
// The same at each sample's own positions: position_offset + positions[b, s], positions i32
// [B, S] (a padded prefix's positions skip its padding).
Tensor rope(Tensor x, Tensor positions, double theta = 10000.0, int64_t position_offset = 0);

// ---- losses (mean over the batch) ----------------------------------------------------------
// logits [N, C], labels i32 [N]; entries equal to ignore_index do not count.
Tensor cross_entropy(Tensor logits, Tensor labels, double label_smoothing = 0.0,
                     int64_t ignore_index = -100);
Tensor mse_loss(Tensor prediction, Tensor target);
Tensor bce_with_logits(Tensor logits, Tensor target);

}  // namespace mg
