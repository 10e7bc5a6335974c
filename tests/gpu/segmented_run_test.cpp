// Segmented runs (Session::set_segments): a run submitted in pieces, each copying out the
// outputs final by its end, gives the values of the f64 reference, segment by segment, also with
// the input read in place from a buffer of the app's and an output copied into one.
#include <cmath>
#include <cstring>
#include <random>
#include <string>

#include "harness.hpp"
#include "runtime/shared_device.hpp"

namespace mg {
namespace {

constexpr size_t kRows = 4, kWidth = 8;

std::vector<float> drawn(std::mt19937_64& generator, size_t count) {
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> values(count);
  for (float& value : values) value = uniform(generator);
  return values;
}

// rows [kRows, kWidth] times w [kWidth, kWidth], in f64.
std::vector<double> product(const std::vector<double>& rows, const std::vector<float>& w) {
  std::vector<double> result(kRows * kWidth, 0.0);
  for (size_t i = 0; i < kRows; ++i)
    for (size_t j = 0; j < kWidth; ++j)
      for (size_t k = 0; k < kWidth; ++k)
        result[i * kWidth + j] += rows[i * kWidth + k] * w[k * kWidth + j];
  return result;
}

std::vector<double> tanh_of(std::vector<double> values) {
  for (double& value : values) value = std::tanh(value);
  return values;
}

void expect_close(const std::vector<float>& actual, const std::vector<double>& expected) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < actual.size(); ++i)
    EXPECT_NEAR(actual[i], expected[i], 1e-5 * (1.0 + std::abs(expected[i]))) << i;
}

// a = x w1, b = tanh(a) w2, c = tanh(b) w3: each output is final before the next one's product.
struct Chain {
  Graph graph;
  std::vector<float> w1, w2, w3;

  Chain() {
    const Tensor x = input(graph, "x", {kRows, kWidth});
    const Tensor w[3] = {parameter(graph, "w1", {kWidth, kWidth}, Init::zeros()),
                         parameter(graph, "w2", {kWidth, kWidth}, Init::zeros()),
                         parameter(graph, "w3", {kWidth, kWidth}, Init::zeros())};
    const Tensor a = matmul(x, w[0]);
    const Tensor b = matmul(tanh(a), w[1]);
    graph.set_output("a", a.id());
    graph.set_output("b", b.id());
    graph.set_output("c", matmul(tanh(b), w[2]).id());
    std::mt19937_64 generator(5);
    w1 = drawn(generator, kWidth * kWidth);
    w2 = drawn(generator, kWidth * kWidth);
    w3 = drawn(generator, kWidth * kWidth);
  }

  void write_weights(Session& session) const {
    session.write("w1", w1);
    session.write("w2", w2);
    session.write("w3", w3);
  }

  std::vector<std::vector<double>> expected(const std::vector<float>& x) const {
    const std::vector<double> a = product({x.begin(), x.end()}, w1);
    const std::vector<double> b = product(tanh_of(a), w2);
    return {a, b, product(tanh_of(b), w3)};
  }
};

TEST(SegmentedRun, SegmentsCopyOutEachOutputOnceItIsFinal) {
  const Chain chain;
  SessionOptions options;
  options.validation = true;
  Session session(chain.graph, options);
  chain.write_weights(session);
  const std::optional<size_t> a = session.output_ready_after("a");
  const std::optional<size_t> b = session.output_ready_after("b");
  const std::optional<size_t> c = session.output_ready_after("c");
  ASSERT_TRUE(a && b && c);
  EXPECT_LT(*a, *b);
  EXPECT_LT(*b, *c);
  EXPECT_EQ(*c + 1, session.report().dispatches);
  const std::vector<size_t> ends = {*a, *b};
  ASSERT_EQ(session.set_segments(ends), 3u);
  EXPECT_EQ(session.output_segment("a"), 0u);
  EXPECT_EQ(session.output_segment("b"), 1u);
  EXPECT_EQ(session.output_segment("c"), 2u);

  std::mt19937_64 generator(9);
  for (int run = 0; run < 2; ++run) {
    SCOPED_TRACE(run);
    const std::vector<float> x = drawn(generator, kRows * kWidth);
    const std::vector<std::vector<double>> expected = chain.expected(x);
    session.set_input("x", x);
    EXPECT_THROW(session.submit_segment(1), Error);
    session.submit_segment(0);
    session.submit_segment(1);
    EXPECT_THROW(session.wait_segment(2), Error);
    EXPECT_THROW(session.start_run(), Error);
    session.wait_segment(0);
    expect_close(session.output("a"), expected[0]);
    EXPECT_THROW(session.output("b"), Error);
    session.submit_segment(2);
    session.wait_segment(1);
    expect_close(session.output("b"), expected[1]);
    EXPECT_THROW(session.output("c"), Error);
    session.wait_segment(2);
    expect_close(session.output("c"), expected[2]);
    expect_close(session.output("a"), expected[0]);
  }

  // finish_run completes a segmented run that was only started; whole runs follow.
  const std::vector<float> x = drawn(generator, kRows * kWidth);
  session.set_input("x", x);
  session.submit_segment(0);
  session.finish_run();
  expect_close(session.output("c"), chain.expected(x)[2]);
  const std::vector<float> next = drawn(generator, kRows * kWidth);
  session.set_input("x", next);
  session.run();
  expect_close(session.output("b"), chain.expected(next)[1]);
  EXPECT_EQ(session.set_segments({}), 0u);
  EXPECT_EQ(session.validation_messages(), 0u);
}

TEST(SegmentedRun, InputBoundInPlaceAndOutputCopiedIntoABuffer) {
  const Chain chain;
  const std::shared_ptr<SharedDevice> shared = open_shared_device("", true);
  gpu::Device& device = gpu_device(*shared);
  const gpu::BufferId app_input =
      device.create_buffer(kRows * kWidth * 4, gpu::BufferUse::upload, "app input");
  const gpu::BufferId app_output =
      device.create_buffer(kRows * kWidth * 4, gpu::BufferUse::download, "app output");
  {
    SessionOptions options;
    options.shared_device = shared;
    Session session(chain.graph, options);
    chain.write_weights(session);
    session.bind_input("x", app_input, 0, Session::Binding::in_place);
    session.bind_output("c", app_output, 0);
    const std::vector<size_t> ends = {*session.output_ready_after("a"),
                                      *session.output_ready_after("b")};
    ASSERT_EQ(session.set_segments(ends), 3u);
    std::mt19937_64 generator(11);
    const std::vector<float> x = drawn(generator, kRows * kWidth);
    std::memcpy(device.mapped(app_input), x.data(), x.size() * 4);
    const std::vector<std::vector<double>> expected = chain.expected(x);
    session.submit_segment(0);
    EXPECT_THROW(session.bind_input("x", app_input, 0), Error);
    EXPECT_THROW(session.set_chunk_budget(1.0), Error);
    try {
      session.record_run(nullptr);
      ADD_FAILURE() << "record_run during a segmented run";
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find("segmented run"), std::string::npos) << error.what();
    }
    session.wait_segment(0);
    expect_close(session.output("a"), expected[0]);
    session.submit_segment(1);
    session.submit_segment(2);
    session.wait_segment(2);
    expect_close(session.output("b"), expected[1]);
    EXPECT_THROW(session.output("c"), Error);  // bound to the app's buffer
    const float* c = static_cast<const float*>(device.mapped(app_output));
    expect_close(std::vector<float>(c, c + kRows * kWidth), expected[2]);
    EXPECT_EQ(session.validation_messages(), 0u);
  }
  device.destroy_buffer(app_input);
  device.destroy_buffer(app_output);
}

TEST(SegmentedRun, RefusesSegmentsThatDoNotAscend) {
  const Chain chain;
  Session session(chain.graph);
  const std::vector<size_t> descending = {2, 1};
  EXPECT_THROW(session.set_segments(descending), Error);
  const std::vector<size_t> past_the_end = {session.report().dispatches + 3};
  EXPECT_THROW(session.set_segments(past_the_end), Error);
  EXPECT_THROW(session.submit_segment(0), Error);  // no segments set
}

}  // namespace
}  // namespace mg
