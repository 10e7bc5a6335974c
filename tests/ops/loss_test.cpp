// Losses: hand-derived values, PyTorch fixtures, VJPs, misuse errors.
#include <cmath>

#include "gradient_check.hpp"
#include "op_expectations.hpp"

namespace mg {
namespace {

using testing::evaluate_op;
using testing::expect_error;
using testing::expect_gradients_match;
using testing::expect_values;

// Logits and labels of the PyTorch fixture: row 1 is ignored (label -100).
const HostTensor kLogits({3, 4},
                         {0.5, -1.25, 2.0, 0.0, 1.5, 0.25, -0.75, 3.0, -2.0, 0.5, 1.0, -0.5});
const HostTensor kLabels({3}, {2, -100, 0});

Tensor smoothed_cross_entropy(std::vector<Tensor>& x) {
  return cross_entropy(x[0], x[1], 0.1, -100);
}

TEST(Loss, CrossEntropyHandComputed) {
  // Row [0, ln 3] has probabilities [1/4, 3/4]; label 1 costs ln(4/3), and row [ln 3, 0] with
  // label 0 costs the same. The third row is ignored and the mean is over the other two.
  const double ln3 = std::log(3.0);
  const HostTensor logits({3, 2}, {0, ln3, ln3, 0, 7, -7});
  const HostTensor labels({3}, {1, 0, -100});
  const auto run = [&](double smoothing) {
    return evaluate_op(
        {logits, labels},
        [smoothing](std::vector<Tensor>& x) { return cross_entropy(x[0], x[1], smoothing); },
        {DType::f32, DType::i32});
  };
  const double nll = std::log(4.0 / 3.0);
  expect_values(run(0.0), {}, {nll});
  // Smoothing 0.2 with C = 2: 0.8 * nll + 0.2 * mean(-ln 1/4, -ln 3/4).
  expect_values(run(0.2), {}, {0.8 * nll + 0.1 * (std::log(4.0) + nll)});
}

TEST(Loss, CrossEntropyMatchesTorch) {
  // /usr/bin/python3 with torch 1.13, float64:
  //   logits = torch.tensor(<kLogits>, requires_grad=True); labels = torch.tensor([2, -100, 0])
  //   loss = F.cross_entropy(logits, labels, label_smoothing=0.1, ignore_index=-100)
  //   loss.backward()  -> loss.item(), logits.grad
  // and F.cross_entropy(logits, torch.tensor([3, 1, 0])) for the plain loss.
  expect_values(evaluate_op({kLogits, kLabels}, smoothed_cross_entropy, {DType::f32, DType::i32}),
                {}, {1.9796133349200824});
  expect_values(evaluate_op({kLogits, HostTensor({3}, {3, 1, 0})},
                            [](std::vector<Tensor>& x) { return cross_entropy(x[0], x[1]); },
                            {DType::f32, DType::i32}),
                {}, {2.995314409149671});

  Graph graph;
  const Tensor logits = input(graph, "logits", {3, 4});
  const Tensor labels = input(graph, "labels", {3}, DType::i32);
  const Tensor loss = cross_entropy(logits, labels, 0.1, -100);
  const ValueId grad = gradients(graph, loss.id(), {logits.id()}).at(logits.id());
  EXPECT_EQ(graph.node(grad).op, "cross_entropy_grad");
  Environment environment;
  environment.leaves["logits"] = kLogits;
  environment.leaves["labels"] = kLabels;
  expect_values(
      evaluate(graph, environment)[grad], {3, 4},
      {0.06734677501605413, 0.0013752889663402046, -0.10465158110880785, 0.03592951712641353, 0, 0,
       0, 0, -0.4492548686293239, 0.1488587329319861, 0.2535355751981867, 0.04686056049915106});
}

TEST(Loss, CrossEntropyOfAllIgnoredRowsIsZero) {
  expect_values(evaluate_op({kLogits, HostTensor({3}, {-1, -1, -1})},
                            [](std::vector<Tensor>& x) { return cross_entropy(x[0], x[1], 0, -1); },
                            {DType::f32, DType::i32}),
                {}, {0});
}

TEST(Loss, CrossEntropyGradients) {
  expect_gradients_match({.shapes = {{3, 4}, {3}},
                          .differentiable = {true, false},
                          .values = {{}, kLabels},
                          .dtypes = {DType::f32, DType::i32},
                          .low = -2,
                          .high = 2},
                         smoothed_cross_entropy);
  expect_gradients_match({.shapes = {{3, 4}, {3}},
                          .differentiable = {true, false},
                          .values = {{}, HostTensor({3}, {3, 1, 0})},
                          .dtypes = {DType::f32, DType::i32}},
                         [](std::vector<Tensor>& x) { return cross_entropy(x[0], x[1]); });
}

TEST(Loss, GradientsThroughFanOut) {
  // z feeds both the cross-entropy and a mean-squared term.
  expect_gradients_match({.shapes = {{3, 4}, {3}, {4, 4}},
                          .differentiable = {true, false, true},
                          .values = {{}, kLabels},
                          .dtypes = {DType::f32, DType::i32, DType::f32}},
                         [](std::vector<Tensor>& x) {
                           const Tensor z = matmul(x[0], x[2]);
                           return cross_entropy(z, x[1], 0.1) + mse_loss(z, x[0]);
                         });
}

TEST(Loss, MseAndBceHandComputed) {
  // ((1 - 0)^2 + (2 - 4)^2) / 2 = 2.5.
  expect_values(evaluate_op({HostTensor({2}, {1, 2}), HostTensor({2}, {0, 4})},
                            [](std::vector<Tensor>& x) { return mse_loss(x[0], x[1]); }),
                {}, {2.5});
  // x = 0, t = 1 costs ln 2; x = ln 3, t = 0 costs ln(1 + 3) = ln 4; the mean is 1.5 ln 2.
  expect_values(evaluate_op({HostTensor({2}, {0, std::log(3.0)}), HostTensor({2}, {1, 0})},
                            [](std::vector<Tensor>& x) { return bce_with_logits(x[0], x[1]); }),
                {}, {1.5 * std::log(2.0)});
}

TEST(Loss, BceMatchesTorch) {
  // /usr/bin/python3 with torch 1.13: F.binary_cross_entropy_with_logits(
  //   torch.tensor([-2.0, -0.5, 0.0, 0.75, 3.0], dtype=torch.float64),
  //   torch.tensor([0.0, 1.0, 0.25, 1.0, 0.5], dtype=torch.float64)).item()
  expect_values(evaluate_op({HostTensor({5}, {-2.0, -0.5, 0.0, 0.75, 3.0}),
                             HostTensor({5}, {0.0, 1.0, 0.25, 1.0, 0.5})},
                            [](std::vector<Tensor>& x) { return bce_with_logits(x[0], x[1]); }),
                {}, {0.7459221066943333}, 1e-15);
}

TEST(Loss, MseAndBceGradients) {
  expect_gradients_match({.shapes = {{2, 3}, {2, 3}}},
                         [](std::vector<Tensor>& x) { return mse_loss(x[0], x[1]); });
  expect_gradients_match(
      {.shapes = {{2, 3}, {2, 3}}, .low = 0.05, .high = 0.95},
      [](std::vector<Tensor>& x) { return bce_with_logits(x[0] * 6.0 - 3.0, x[1]); });
  // At x = 0 exactly the derivative is sigmoid(0) - t = 0.5 - t.
  Graph graph;
  const Tensor x = input(graph, "x", {2});
  const Tensor t = input(graph, "t", {2});
  const Tensor loss = bce_with_logits(x, t);
  const ValueId grad = gradients(graph, loss.id(), {x.id()}).at(x.id());
  Environment environment;
  environment.leaves["x"] = HostTensor({2}, {0, 0});
  environment.leaves["t"] = HostTensor({2}, {1, 0.25});
  expect_values(evaluate(graph, environment)[grad], {2}, {-0.25, 0.125});
}

TEST(Loss, MisuseNamesOpAndShapes) {
  Graph graph;
  const Tensor logits = input(graph, "logits", {3, 4});
  expect_error([&] { cross_entropy(logits, input(graph, "f", {3})); },
               {"cross_entropy(f32[3, 4], f32[3])", "labels must be i32 with shape [3]"});
  expect_error([&] { cross_entropy(logits, input(graph, "l", {2}, DType::i32)); },
               {"cross_entropy(f32[3, 4], i32[2])", "shape [3]"});
  expect_error([&] { cross_entropy(input(graph, "v", {4}), input(graph, "k", {4}, DType::i32)); },
               {"cross_entropy(f32[4], i32[4])", "[N, C]"});
  expect_error([&] { cross_entropy(logits, input(graph, "m", {3}, DType::i32), 1.5); },
               {"cross_entropy(", "label_smoothing"});
  expect_error(
      [] {
        evaluate_op({kLogits, HostTensor({3}, {2, 7, 0})},
                    [](std::vector<Tensor>& x) { return cross_entropy(x[0], x[1]); },
                    {DType::f32, DType::i32});
      },
      {"cross_entropy", "label 7", "[0, 4)"});
  const Tensor labels = input(graph, "labels", {3}, DType::i32);
  expect_error(
      [&] {
        graph.add("cross_entropy_grad", {logits.id(), labels.id(), logits.id()});
      },
      {"cross_entropy_grad(f32[3, 4], i32[3], f32[3, 4])", "grad must be a scalar"});
  expect_error(
      [&] {
        mse_loss(logits, input(graph, "p", {3, 3}));
      },
      {"mse_loss(f32[3, 4], f32[3, 3])", "one type"});
  expect_error([&] { bce_with_logits(logits, input(graph, "q", {4})); },
               {"bce_with_logits(f32[3, 4], f32[4])", "one type"});
}

}  // namespace
}  // namespace mg
