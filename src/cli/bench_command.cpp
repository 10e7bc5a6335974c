#include <algorithm>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>

#include "cli/arguments.hpp"
#include "cli/commands.hpp"
#include "meganeura/ops.hpp"
#include "meganeura/session.hpp"

namespace mg::cli {
namespace {

constexpr const char* kHelp = R"(usage: meganeura bench kernels [--filter TEXT] [--runs N] [--small]

Times each kernel family on the chosen device with GPU timestamps: warm-up runs, then the
median of --runs runs (default 20) of one program per case. Prints one JSON object per case
(name, ms, GFLOP/s or GB/s) and a table at the end. bench/kernels_pytorch.py times the same
cases in PyTorch.

  --filter TEXT  only cases whose name contains TEXT
  --runs N       timed runs per case (default 20)
  --small        shrink every case (for CPU devices such as Lavapipe)
  --device SEL   device index or part of its name
)";

struct BenchCase {
  std::string name;
  std::vector<Shape> inputs;
  std::function<Tensor(std::vector<Tensor>&)> build;
  double flops = 0;  // for GFLOP/s; 0 = memory-bound case measured in GB/s
  double bytes = 0;
};

std::vector<BenchCase> bench_cases(bool small) {
  const int64_t s = small ? 8 : 1;  // divides the large extents
  std::vector<BenchCase> cases;
  auto gemm = [&](const std::string& name, int64_t m, int64_t n, int64_t k, bool ta, bool tb) {
    cases.push_back({name,
                     {ta ? Shape{k, m} : Shape{m, k}, tb ? Shape{n, k} : Shape{k, n}},
                     [=](std::vector<Tensor>& x) { return matmul(x[0], x[1], ta, tb); },
                     2.0 * m * n * k,
                     4.0 * (m * k + k * n + m * n)});
  };
  gemm("gemm 4096^3", 4096 / s, 4096 / s, 4096 / s, false, false);
  gemm("smollm q_proj 128x576x576", 128, 576, 576, false, true);
  gemm("smollm up 128x1536x576", 128, 1536, 576, false, true);
  gemm("smollm down 128x576x1536", 128, 576, 1536, false, true);
  gemm("smollm lm_head 128x49152x576", 128, 49152 / s, 576, false, true);
  gemm("smollm up dW 1536x576x128", 1536, 576, 128, true, false);
  gemm("smollm up dX 128x576x1536", 128, 576, 1536, false, false);
  const int64_t elements = (64ll << 20) / s / s;
  cases.push_back({"pointwise add 64M",
                   {{elements}, {elements}},
                   [](std::vector<Tensor>& x) { return x[0] + x[1]; },
                   0,
                   12.0 * elements});
  cases.push_back({"pointwise gelu 64M",
                   {{elements}},
                   [](std::vector<Tensor>& x) { return gelu(x[0]); },
                   0,
                   8.0 * elements});
  const int64_t rows = 16384 / s, width = 4096 / s;
  cases.push_back({"row sum 16384x4096",
                   {{rows, width}},
                   [](std::vector<Tensor>& x) { return sum(x[0], {1}); },
                   0,
                   4.0 * rows * width});
  cases.push_back({"softmax 16384x4096",
                   {{rows, width}},
                   [](std::vector<Tensor>& x) { return softmax(x[0], 1); },
                   0,
                   8.0 * rows * width});
  auto conv = [&](const std::string& name, int64_t c, int64_t o, int64_t hw, int64_t kernel,
                  int64_t stride) {
    const int64_t side = hw / s, padding = kernel / 2,
                  out = (side + 2 * padding - kernel) / stride + 1;
    Conv2dOptions options;
    options.stride = {stride, stride};
    options.padding = {padding, padding};
    cases.push_back(
        {name,
         {{4, c, side, side}, {o, c, kernel, kernel}},
         [=](std::vector<Tensor>& x) { return conv2d(x[0], x[1], std::nullopt, options); },
         2.0 * 4 * o * out * out * c * kernel * kernel,
         0});
  };
  conv("resnet conv 7x7/2 3->64 224", 3, 64, 224, 7, 2);
  conv("resnet conv 3x3 64->64 56", 64, 64, 56, 3, 1);
  conv("resnet conv 1x1 256->64 56", 256, 64, 56, 1, 1);
  conv("resnet conv 3x3/2 128->128 56", 128, 128, 56, 3, 2);
  const int64_t tokens = 1500 / s;
  cases.push_back(
      {"whisper attention 1500x6x64",
       {{1, 6, tokens, 64}, {1, 6, tokens, 64}, {1, 6, tokens, 64}},
       [](std::vector<Tensor>& x) { return scaled_dot_product_attention(x[0], x[1], x[2]); },
       4.0 * 6 * tokens * tokens * 64,
       0});
  return cases;
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

}  // namespace

int bench_command(const std::vector<std::string>& words) {
  const Arguments arguments("meganeura bench", words, {"filter", "runs", "device"},
                            {"small", "help"});
  if (arguments.has("help") || arguments.positional().empty()) {
    std::fputs(kHelp, stdout);
    return arguments.has("help") ? 0 : 2;
  }
  if (arguments.positional()[0] != "kernels") {
    throw Error("unknown benchmark '" + arguments.positional()[0] +
                "' (try: meganeura bench kernels)");
  }
  const int64_t runs = std::max<int64_t>(1, arguments.integer("runs", 20));
  const std::string filter = arguments.text("filter", "");
  std::vector<std::string> table;
  std::mt19937_64 generator(1);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (const BenchCase& bench : bench_cases(arguments.has("small"))) {
    if (bench.name.find(filter) == std::string::npos) continue;
    Graph graph;
    std::vector<Tensor> inputs;
    for (size_t i = 0; i < bench.inputs.size(); ++i) {
      inputs.push_back(input(graph, "x" + std::to_string(i), bench.inputs[i]));
    }
    graph.set_output("y", bench.build(inputs).id());
    SessionOptions options;
    options.device = arguments.text("device", "");
    options.profile = true;
    Session session(graph, options);
    for (size_t i = 0; i < bench.inputs.size(); ++i) {
      std::vector<float> values(static_cast<size_t>(element_count(bench.inputs[i])));
      for (float& value : values) value = uniform(generator);
      session.set_input("x" + std::to_string(i), values);
    }
    for (int warmup = 0; warmup < 3; ++warmup) session.run();
    std::vector<double> durations;
    for (int64_t run = 0; run < runs; ++run) {
      session.run();
      double total = 0;
      for (const DispatchProfile& dispatch : session.profile()) total += dispatch.duration_ms;
      durations.push_back(total);
    }
    const double ms = median(durations);
    nlohmann::json record = {{"framework", "meganeura"},
                             {"case", bench.name},
                             {"ms", ms},
                             {"dispatches", session.report().dispatches}};
    char row[160];
    if (bench.flops > 0) {
      record["gflops"] = bench.flops / ms / 1e6;
      std::snprintf(row, sizeof(row), "%-34s %10.4f ms %10.1f GFLOP/s", bench.name.c_str(), ms,
                    bench.flops / ms / 1e6);
    } else {
      record["gbps"] = bench.bytes / ms / 1e6;
      std::snprintf(row, sizeof(row), "%-34s %10.4f ms %10.1f GB/s", bench.name.c_str(), ms,
                    bench.bytes / ms / 1e6);
    }
    std::printf("%s\n", record.dump().c_str());
    std::fflush(stdout);
    table.push_back(row);
  }
  for (const std::string& row : table) std::printf("%s\n", row.c_str());
  return 0;
}

}  // namespace mg::cli
