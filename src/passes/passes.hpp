#pragma once
// Graph rewrites that keep every output and assignment unchanged. Each returns a new graph and
// fills `remap` (old value -> new value, kNoValue for removed values) when given. Those that take
// their graph by value return it as it is where they have nothing to rewrite: move it in.
#include <functional>
#include <vector>

#include "meganeura/graph.hpp"
#include "target/target.hpp"

namespace mg::passes {

// Drops nodes that no output or assignment depends on.
Graph eliminate_dead_code(Graph graph, std::vector<ValueId>* remap = nullptr);

// Merges nodes with the same op, inputs and attributes (and equal constants).
Graph eliminate_common_subexpressions(Graph graph, std::vector<ValueId>* remap = nullptr);

// Evaluates nodes whose inputs are all uniform constants (scalars broadcast to a shape) and
// replaces them by a uniform constant.
Graph fold_constants(const Graph& graph, std::vector<ValueId>* remap = nullptr);

// Split-K: a matmul or conv2d_grad_weight with few output tiles and a long K becomes one node
// computing partial results over K slices (attribute k_splits) and a sum over them, as many as
// `device` says the product runs fastest on (target::Target::gemm_k_splits), or the direct
// weight-gradient kernel's own splits. MEGANEURA_SPLIT_K_SLICES=N forces the slice count.
Graph split_k(Graph graph, const target::Target& device, std::vector<ValueId>* remap = nullptr);

// Half storage: f16 and bf16 tensors stay 16-bit in memory and every kernel but a few computes
// in f32, so each 16-bit input a kernel reads becomes a widening of it (widen_f16, widen_bf16) and
// each 16-bit result a rounding of the f32 result (round_to_f16, round_to_bf16; ops/half_gemm.hpp);
// casts become those ops; transposes move 16-bit values as they are, im2col f16 ones, and
// Winograd's tile and output transforms convert f16 values as they read and store. A 2-D matmul
// of f16 matrices into an f16 result that runs on cooperative matrices on `device` (the workgroup
// GEMM or the subgroup-scope one), or of bf16 matrices into a bf16 result on the workgroup GEMM,
// becomes a half_matmul reading the 16-bit operands and writing the 16-bit result; one of bf16
// matrices on the subgroup GEMM in bf16 precision a half_matmul into f32 and a rounding (see
// half_storage.cpp).
Graph half_storage(Graph graph, const target::Target& device,
                   std::vector<ValueId>* remap = nullptr);

// Half activations: large f32 values that an elementwise kernel or a product on cooperative
// matrices writes and only elementwise kernels, reductions, roundings to f16, Winograd's f16 tile
// transforms and moves (transposes, Winograd's output transform) read are stored in f16
// (round_to_f16 of the result, widen_f16 in each elementwise reader; products write f16
// results), so the kernels that convert in registers move half the bytes. With `storage` bf16
// they are stored in bfloat16 by the same rules (round_to_bf16, widen_bf16, products of
// bfloat16 operands writing bfloat16 results, Winograd's bfloat16 tile transforms). Outputs,
// assignments, values under 65,536 elements and elementwise values that one kernel reads (which
// fusion computes there) keep f32 (see half_activations.cpp).
Graph half_activations(Graph graph, const target::Target& device, DType storage = DType::f16,
                       std::vector<ValueId>* remap = nullptr);

// The workgroup GEMM: a 2-D matmul that suits it on `device` (target::Target::
// workgroup_gemm_suits) becomes round_to_f16 of both operands (round_to_bf16 in bf16
// precision) and a half_matmul (ops/half_gemm.hpp). Where products round their operands to f16
// or bfloat16 (fast or bf16 precision on cooperative matrices; MEGANEURA_WINOGRAD_F16=0 aside),
// Winograd's transforms store points in that format (f16_result, bf16_result) and the batched
// matmuls of two of them become half_matmuls, which the target runs on the workgroup GEMM where
// a block fits, else on the subgroup GEMM.
Graph workgroup_gemm(Graph graph, const target::Target& device,
                     std::vector<ValueId>* remap = nullptr);

// Half products: in fast precision, a 2-D matmul on the subgroup-scope cooperative-matrix GEMM
// (target::Target::subgroup_gemm_takes_product) with an operand that can be stored in f16 for
// nothing, in whole units of 8 halves along its contiguous extent, becomes a half_matmul of
// that operand's round_to_f16 (of each such operand) and the other as it is: a parameter or
// constant that no assignment updates (its rounding moves to the plan's setup), or an
// elementwise or normalisation result that only such products read in f16 (its rounding fuses
// into its kernel's store). The products round their operands as before (see
// half_products.cpp). With `format` bf16 (bf16 precision, whose GEMMs round to bfloat16) the
// operands are stored in bfloat16 (round_to_bf16) alike.
Graph half_products(Graph graph, const target::Target& device, DType format = DType::f16,
                    std::vector<ValueId>* remap = nullptr);

// Split attention: an attention forward, dQ, dK or dV with few owned blocks and many streamed
// rows becomes one node computing partial results over slices of the keys (attribute
// kv_splits; forward, dQ) or queries (q_splits; dK, dV), joined by an attention_combine
// (forward) or a sum, planned for the compute units of `device` (see split_attention.cpp).
// MEGANEURA_ATTENTION_SPLITS=N or F,Q,KV forces the slice counts. dK and dV of grouped-query
// attention may also split over parts of each group's query heads (attribute head_splits);
// MEGANEURA_ATTENTION_HEAD_SPLITS forces that.
Graph split_attention(Graph graph, const target::Target& device,
                      std::vector<ValueId>* remap = nullptr);

// dQ as a matmul: a non-causal attention_grad_q whose attention_grad_k of the same inputs
// follows it becomes attention_grad_scores (W = scale * dS, which the dK launch writes beside
// its result) times k, where W takes at most `max_score_bytes`; the attention_grad_k moves up to
// the rewritten node's place, before W (see attention_grad_q_gemm.cpp).
Graph attention_grad_q_gemm(Graph graph, uint64_t max_score_bytes,
                            std::vector<ValueId>* remap = nullptr);

// Attention heads padded to whole fragments: an attention node (forward, log-sum-exp and
// gradients) whose q, k or v rows are not a multiple of `multiple` wide reads them (and out and
// grad_out) padded with zeros to the next multiple, keeps the scale of its own head width, and
// its result is sliced back, so that the cooperative-matrix kernels take it
// (target::Target::attention_head_multiple; 1 leaves the graph as it is).
Graph pad_attention_heads(Graph graph, int64_t multiple, std::vector<ValueId>* remap = nullptr);

// Attention gradients in f16's range: each attention_grad_q / _k / _v also reads max |dO| (per
// batch and kv head, attribute has_grad_out_max), by which the cooperative-matrix backward
// scales dO as it loads it and its result as it stores it, so that its f16 operands (dO, dS)
// neither underflow nor overflow at any scale of the loss (see scale_attention_gradients.cpp);
// or, where `scales_itself` holds for the node (target::Target::attention_gradient_scales_itself),
// its kernels find the largest |dO| of the rows they read (attribute own_grad_out_scale).
using ScalesItself = std::function<bool(const Graph& graph, const Node& node)>;
Graph scale_attention_gradients(Graph graph, const ScalesItself& scales_itself = {},
                                std::vector<ValueId>* remap = nullptr);

// Convolutions without groups (conv2d and both gradients) as an im2col node and a batched matmul
// (strided data gradients: a matmul and a col2im node), where the columns take at most
// `max_column_bytes` (see im2col.cpp); 3x3 stride-1 weight gradients that suit Winograd on
// `device` become its two tile transforms, a batched matmul and its filter transform
// (ops/winograd.hpp), and those that the direct kernel runs on `device` stay. 1x1 stride-1
// unpadded convolutions become batched matmuls over the images, without columns: their weight
// gradients always, forwards and data gradients where `device` runs products on cooperative
// matrices.
Graph im2col_convolutions(Graph graph, const target::Target& device, uint64_t max_column_bytes,
                          std::vector<ValueId>* remap = nullptr);

// Training batch norms over at least `min_channel_elements` elements a channel become means,
// sums and pointwise ops (see decompose_batch_norm.cpp), sharing the running statistics'
// mean and variance and the bias and weight gradients' sums. With `one_pass_variance` the
// variance is the mean of squares less the squared mean, both read from x in one pass.
Graph decompose_batch_norm(Graph graph, int64_t min_channel_elements, bool one_pass_variance,
                           std::vector<ValueId>* remap = nullptr);

// Two-step sums: a sum or mean whose reduced axes lie on both sides of a kept axis and that has
// few outputs first reduces the reduced axes after that kept axis; a max of a few long
// contiguous rows takes the maxima of chunks of them first; an f32 cross_entropy over many logits
// becomes its per_row form and a sum (see split_reductions.cpp).
Graph split_reductions(Graph graph, std::vector<ValueId>* remap = nullptr);

// Nested sums over leading axes (split-K partials [S, N, ...] summed over S and then over a
// batch N, as the im2col pass's weight gradients are) become one sum over all those axes: one
// dispatch and one read of the partials instead of two. A winograd_weight_grad reading such a
// sum over one leading axis reads the partials instead and sums them itself.
Graph merge_leading_sums(Graph graph, std::vector<ValueId>* remap = nullptr);

// The default pipeline: fold, CSE, DCE. Returns the composed remap too.
Graph optimize(const Graph& graph, std::vector<ValueId>* remap = nullptr);

}  // namespace mg::passes
