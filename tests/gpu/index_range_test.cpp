// Out-of-range indices and labels: a kernel reads zeros or a wrong row for them, so the session
// refuses them as they are set, naming the input, the op and the first bad value; PyTorch raises
// for the same inputs.
#include <random>

#include "harness.hpp"

namespace mg {
namespace {

void expect_refused(const std::function<void()>& action, const std::string& fragment) {
  try {
    action();
    ADD_FAILURE() << "expected an error mentioning '" << fragment << "'";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find(fragment), std::string::npos) << error.what();
  }
}

TEST(IndexRange, GatherIndicesOutsideTheTableAreRefused) {
  Graph graph;
  const Tensor table = input(graph, "table", {2, 3});
  const Tensor ids = input(graph, "ids", {2, 2}, DType::i32);
  // Through a reshape, as an embedding of a [batch, sequence] of token ids often is.
  graph.set_output("rows", gather(table, reshape(ids, {4})).id());
  SessionOptions options = testing::session_options();
  options.validation = true;
  Session session(graph, options);
  std::mt19937 random(3);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> values(6);
  for (float& value : values) value = uniform(random);
  session.set_input("table", values);
  expect_refused(
      [&] {
        session.set_input("ids", std::vector<int32_t>{0, 1, 7, 0});
      },
      "input 'ids' feeds gather over a table of 2 rows, but holds 7 at position 2");
  expect_refused(
      [&] {
        session.set_input("ids", std::vector<int32_t>{-1, 1, 1, 0});
      },
      "holds -1 at position 0, outside [0, 2)");
  session.set_input("ids", std::vector<int32_t>{1, 0, 1, 1});
  session.run();
  const std::vector<float> rows = session.output("rows");
  ASSERT_EQ(rows.size(), 12u);
  for (int d = 0; d < 3; ++d) {
    EXPECT_EQ(rows[d], values[3 + d]);
    EXPECT_EQ(rows[3 + d], values[d]);
  }
  EXPECT_EQ(session.validation_messages(), 0u);
}

TEST(IndexRange, LabelsOutsideTheClassesAreRefusedButTheIgnoredOneIsNot) {
  Graph graph;
  const Tensor logits = input(graph, "logits", {3, 4});
  const Tensor labels = input(graph, "labels", {3}, DType::i32);
  graph.set_output("loss", cross_entropy(logits, labels).id());
  SessionOptions options = testing::session_options();
  options.validation = true;
  Session session(graph, options);
  session.set_input("logits", std::vector<float>{0.1f, 0.2f, -0.3f, 0.4f, 0.5f, -0.6f, 0.7f, 0.8f,
                                                 -0.9f, 1.0f, 1.1f, -1.2f});
  expect_refused(
      [&] {
        session.set_input("labels", std::vector<int32_t>{0, 4, 1});
      },
      "input 'labels' feeds cross_entropy over 4 classes, but holds 4 at position 1, "
      "outside [0, 4) and not the ignored label -100");
  session.set_input("labels", std::vector<int32_t>{3, -100, 1});
  session.run();
  EXPECT_TRUE(std::isfinite(session.scalar_output("loss")));
  EXPECT_EQ(session.validation_messages(), 0u);
}

}  // namespace
}  // namespace mg
