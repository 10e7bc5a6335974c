// `meganeura devices --bench-compile --plan-only`: the CPU side of a build, timed without a
// device, and the checksum that tells whether a change still builds the same program.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "cli_runner.hpp"

namespace {

using cli_test::Result;
using cli_test::run;

// The checksum printed at the end of the plan-only line.
std::string checksum_of(const Result& result) {
  const size_t at = result.output.find("checksum ");
  if (at == std::string::npos) return "";
  return result.output.substr(at + 9, 16);
}

// The error line of a refused command, or "" where it printed none.
std::string error_line(const Result& result) {
  const size_t error = result.output.find("error: ");
  if (error == std::string::npos) return "";
  return result.output.substr(error);
}

TEST(CliBenchCompile, PlanOnlyBuildsTheSameProgramInEveryProcess) {
  const std::string command = "devices --bench-compile --plan-only --program smollm2-135m";
  const Result first = run(command);
  ASSERT_EQ(first.status, 0) << first.output;
  EXPECT_NE(first.output.find("smollm2-135m graph (forward, gradients, optimizer)"),
            std::string::npos)
      << first.output;
  EXPECT_NE(first.output.find("fastest of 5: plan "), std::string::npos) << first.output;
  EXPECT_NE(first.output.find(" GiB bound and "), std::string::npos) << first.output;
  // The listing of devices needs a device; the plan-only mode opens none.
  EXPECT_EQ(first.output.find("llvmpipe"), std::string::npos) << first.output;
  const Result second = run(command);
  ASSERT_EQ(second.status, 0) << second.output;
  ASSERT_EQ(checksum_of(first).size(), 16u) << first.output;
  EXPECT_EQ(checksum_of(first), checksum_of(second)) << first.output << second.output;
  const Result cnn = run("devices --bench-compile --plan-only");
  ASSERT_EQ(cnn.status, 0) << cnn.output;
  EXPECT_NE(checksum_of(cnn), checksum_of(first)) << cnn.output;
}

// The whisper-tiny and sd-unet workloads' training steps plan too (the U-Net at a batch of its
// own), into programs of their own.
TEST(CliBenchCompile, PlanOnlyBuildsEveryWorkloadsTrainingStep) {
  const Result whisper = run("devices --bench-compile --plan-only --program whisper-tiny");
  ASSERT_EQ(whisper.status, 0) << whisper.output;
  EXPECT_NE(whisper.output.find("whisper-tiny graph (forward, gradients, optimizer)"),
            std::string::npos)
      << whisper.output;
  const Result unet = run("devices --bench-compile --plan-only --program sd-unet --batch 2");
  ASSERT_EQ(unet.status, 0) << unet.output;
  EXPECT_NE(unet.output.find("sd-unet graph (forward, gradients, optimizer)"), std::string::npos)
      << unet.output;
  ASSERT_EQ(checksum_of(whisper).size(), 16u) << whisper.output;
  EXPECT_NE(checksum_of(whisper), checksum_of(unet));
}

// SmolLM2's decode step plans as a program of its own, named for what it holds; its attention
// rotates the query itself (no launch of its own names the query's rotation).
TEST(CliBenchCompile, PlanOnlyBuildsSmolLM2sDecodeStep) {
  const Result decode =
      run("devices --bench-compile --plan-only --dispatches --program smollm2-135m-decode");
  ASSERT_EQ(decode.status, 0) << decode.output;
  EXPECT_NE(decode.output.find("smollm2-135m-decode graph (one token's step over a cache of 192)"),
            std::string::npos)
      << decode.output;
  EXPECT_NE(decode.output.find("scaled_dot_product_attention %"), std::string::npos)
      << decode.output;
  EXPECT_NE(decode.output.find(" + rope %"), std::string::npos) << decode.output;
}

// SmolVLA's action chunk (the workload's inference program) plans as a program of its own, named
// for what it holds.
TEST(CliBenchCompile, PlanOnlyBuildsSmolVLAsActionChunk) {
  const Result chunk = run("devices --bench-compile --plan-only --program smolvla-chunk");
  ASSERT_EQ(chunk.status, 0) << chunk.output;
  EXPECT_NE(chunk.output.find("smolvla-chunk graph (backbone, 10 flow steps)"), std::string::npos)
      << chunk.output;
  const Result training = run("devices --bench-compile --plan-only --program smolvla");
  ASSERT_EQ(training.status, 0) << training.output;
  ASSERT_EQ(checksum_of(chunk).size(), 16u) << chunk.output;
  EXPECT_NE(checksum_of(chunk), checksum_of(training));
}

// The sd-unet workload's evaluation (at its inference batch and another) and its sampler's
// guided step plan as programs of their own, named for what they hold, none the training step.
TEST(CliBenchCompile, PlanOnlyBuildsTheUNetsEvaluationAndSamplerStep) {
  std::set<std::string> checksums;
  for (const auto& [program, contents] :
       {std::pair<std::string, std::string>{"sd-unet", "forward, gradients, optimizer"},
        {"sd-unet-inference", "forward"},
        {"sd-unet-inference --batch 1", "forward"},
        {"sd-unet-sampler", "one guided sampler step"}}) {
    SCOPED_TRACE(program);
    const Result result = run("devices --bench-compile --plan-only --program " + program);
    ASSERT_EQ(result.status, 0) << result.output;
    const std::string name = program.substr(0, program.find(' '));
    EXPECT_NE(result.output.find(name + " graph (" + contents + ")"), std::string::npos)
        << result.output;
    ASSERT_EQ(checksum_of(result).size(), 16u) << result.output;
    checksums.insert(checksum_of(result));
  }
  EXPECT_EQ(checksums.size(), 4u);
}

// Every kernel of the workloads' fast and bf16 training steps, planned for an H200, compiles to
// validated SPIR-V (the cooperative-matrix kernels and the f16 paths, which Lavapipe does not
// run): ResNet-50 at batch 256 (the workgroup GEMM's blocks over 56 x 56 planes, Winograd in f16)
// and 4, the transformers (and SmolVLA's action chunk, whose cross-attention writes the heads
// after the queries), Whisper-tiny and the U-Net (its evaluation and sampler step in bf16 too).
TEST(CliBenchCompile, PlannedKernelsCompileToSpirv) {
  for (const char* program :
       {"resnet-50 --batch 256 --precision fast", "resnet-50 --precision bf16",
        "smollm2-135m --precision fast", "smolvla --precision bf16",
        "smolvla-chunk --precision fast", "whisper-tiny --precision fast",
        "sd-unet --precision fast", "sd-unet-inference --precision bf16",
        "sd-unet-sampler --precision bf16"}) {
    SCOPED_TRACE(program);
    const Result result =
        run(std::string("devices --bench-compile --plan-only --compile --program ") + program);
    ASSERT_EQ(result.status, 0) << result.output;
    EXPECT_NE(result.output.find("compiled "), std::string::npos) << result.output;
    EXPECT_NE(result.output.find(" kernels to SPIR-V in "), std::string::npos) << result.output;
  }
}

TEST(CliBenchCompile, PlanOnlyPrintsTheDispatchListOnRequest) {
  const Result plain = run("devices --bench-compile --plan-only");
  ASSERT_EQ(plain.status, 0) << plain.output;
  const Result listed = run("devices --bench-compile --plan-only --dispatches");
  ASSERT_EQ(listed.status, 0) << listed.output;
  // The same program, and one more line for each of its dispatches.
  EXPECT_EQ(checksum_of(listed), checksum_of(plain)) << listed.output;
  const size_t at = plain.output.find(" dispatches, ");
  ASSERT_NE(at, std::string::npos) << plain.output;
  const size_t number = plain.output.rfind(' ', at - 1) + 1;
  const long dispatches = std::stol(plain.output.substr(number, at - number));
  ASSERT_GT(dispatches, 10) << plain.output;
  const auto lines = [](const std::string& text) {
    return static_cast<long>(std::count(text.begin(), text.end(), '\n'));
  };
  EXPECT_GE(lines(listed.output) - lines(plain.output), dispatches) << listed.output;
  const Result alone = run("devices --dispatches");
  EXPECT_EQ(alone.status, 1) << alone.output;
  EXPECT_NE(alone.output.find("add --bench-compile --plan-only"), std::string::npos)
      << alone.output;
}

// --costs prints a line for each dispatch of a run, whose bytes sum to the total the plan-only
// line prints, then the bytes summed by kernel; without --plan-only it is refused.
TEST(CliBenchCompile, PlanOnlyPrintsEachDispatchsCostOnRequest) {
  const Result costs = run("devices --bench-compile --plan-only --costs --program resnet-50");
  ASSERT_EQ(costs.status, 0) << costs.output;
  const size_t bound = costs.output.find(" GiB bound and ");
  ASSERT_NE(bound, std::string::npos) << costs.output;
  const size_t number = costs.output.rfind(' ', bound - 1) + 1;
  const double total_megabytes =
      std::stod(costs.output.substr(number, bound - number)) * (1 << 30) * 1e-6;
  const size_t at = costs.output.find(" dispatches, ");
  const size_t count_at = costs.output.rfind(' ', at - 1) + 1;
  const long dispatches = std::stol(costs.output.substr(count_at, at - count_at));
  std::istringstream lines(costs.output.substr(costs.output.find("   #  kernel")));
  long listed = 0, kernels = 0;
  double megabytes = 0, by_kernel = 0;
  bool summary = false;
  for (std::string line; std::getline(lines, line);) {
    if (line.starts_with("by kernel:")) {
      summary = true;
      continue;
    }
    std::istringstream fields(line);
    std::string first, kernel;
    double mb = 0;
    if (summary) {
      if (fields >> kernel >> mb) {
        by_kernel += mb;
        ++kernels;
      }
    } else if (fields >> first >> kernel >> mb &&
               std::isdigit(static_cast<unsigned char>(first[0]))) {
      megabytes += mb;
      ++listed;
    }
  }
  EXPECT_EQ(listed, dispatches) << costs.output;
  EXPECT_GT(kernels, 3) << costs.output;
  // The total is printed to 0.1 GiB, each line to a kilobyte.
  EXPECT_NEAR(megabytes, total_megabytes, 0.06 * (1 << 30) * 1e-6) << costs.output;
  EXPECT_NEAR(by_kernel, megabytes, 1.0) << costs.output;
  const Result alone = run("devices --costs");
  EXPECT_EQ(alone.status, 1) << alone.output;
  EXPECT_NE(alone.output.find("add --bench-compile --plan-only"), std::string::npos)
      << alone.output;
}

// Each product's dispatch, fused with an epilogue or a transpose of its result or not, is
// labelled with the product's own op (a half_matmul as half_matmul) and counts its 2 M N K
// FLOPs, K read off A's shape in the planned graph (Whisper-tiny's fast step: half products with
// bias epilogues, transposed stores and split K). A half_matmul once labelled "matmul" was
// counted as its epilogue's elementwise work.
TEST(CliBenchCompile, PlanOnlyCountsEveryProductsFlopsUnderItsOwnLabel) {
  const Result both =
      run("devices --bench-compile --plan-only --costs --graph --program whisper-tiny --precision "
          "fast");
  ASSERT_EQ(both.status, 0) << both.output;
  struct Defined {
    std::string op;
    std::vector<int64_t> inputs, dims;
    int64_t splits = 1;
    bool transpose_a = false;
  };
  std::map<int64_t, Defined> graph;
  std::vector<std::tuple<std::string, int64_t, double>> products;  // op, %N, GFLOP
  std::istringstream lines(both.output);
  for (std::string line; std::getline(lines, line);) {
    if (line.starts_with("%")) {
      Defined node;
      const int64_t id = std::stol(line.substr(1));
      const size_t equals = line.find(" = ");
      const size_t open = line.find('(', equals);
      node.op = line.substr(equals + 3, open == std::string::npos ? 0 : open - equals - 3);
      if (open != std::string::npos) {
        const size_t close = line.find(')', open);
        std::istringstream operands(line.substr(open + 1, close - open - 1));
        for (std::string operand; std::getline(operands, operand, ',');)
          node.inputs.push_back(std::stol(operand.substr(operand.find('%') + 1)));
      }
      if (const size_t at = line.find("k_splits="); at != std::string::npos)
        node.splits = std::stol(line.substr(at + 9));
      node.transpose_a = line.find("transpose_a=1") != std::string::npos;
      const size_t bracket = line.rfind('[');
      std::istringstream dims(line.substr(bracket + 1, line.rfind(']') - bracket - 1));
      for (std::string dim; std::getline(dims, dim, ',');) node.dims.push_back(std::stol(dim));
      graph[id] = node;
      continue;
    }
    std::istringstream fields(line);
    std::string index, kernel, op, value;
    double megabytes = 0, gigaflops = 0;
    if (!(fields >> index >> kernel >> megabytes >> gigaflops >> op >> value) ||
        !std::isdigit(static_cast<unsigned char>(index[0])) || value.size() < 2 || value[0] != '%')
      continue;
    if (op == "matmul" || op == "half_matmul")
      products.emplace_back(op, std::stol(value.substr(1)), gigaflops);
  }
  size_t half_products = 0;
  ASSERT_GT(products.size(), 50u) << both.output;
  for (const auto& [op, id, gigaflops] : products) {
    ASSERT_TRUE(graph.count(id)) << op << " %" << id;
    const Defined& node = graph.at(id);
    EXPECT_EQ(node.op, op) << "%" << id;
    half_products += op == "half_matmul";
    const std::vector<int64_t>& a = graph.at(node.inputs.at(0)).dims;
    const double k = static_cast<double>(a.at(a.size() - (node.transpose_a ? 2 : 1)));
    double elements = 1;
    for (int64_t dim : node.dims) elements *= static_cast<double>(dim);
    // The printed GFLOP has four decimals.
    EXPECT_NEAR(gigaflops, 2 * elements / static_cast<double>(node.splits) * k * 1e-9, 6e-5)
        << op << " %" << id;
  }
  EXPECT_GT(half_products, 20u);
}

// --graph prints the planned graph after its dispatch list: a line for every node, so that each
// value a dispatch label names (%N) is found there.
TEST(CliBenchCompile, PlanOnlyPrintsThePlannedGraphOnRequest) {
  const Result both = run("devices --bench-compile --plan-only --dispatches --graph");
  ASSERT_EQ(both.status, 0) << both.output;
  std::set<std::string> defined, labelled;
  std::istringstream lines(both.output);
  for (std::string line; std::getline(lines, line);) {
    if (line.starts_with("%")) {
      defined.insert(line.substr(0, line.find(' ')));
      continue;
    }
    const size_t at = line.rfind(" %");
    if (at == std::string::npos || line.find("  ") == std::string::npos) continue;
    size_t end = at + 2;
    while (end < line.size() && std::isdigit(static_cast<unsigned char>(line[end]))) ++end;
    if (end > at + 2) labelled.insert(line.substr(at + 1, end - at - 1));
  }
  ASSERT_GT(defined.size(), 10u) << both.output;
  ASSERT_GT(labelled.size(), 10u) << both.output;
  for (const std::string& value : labelled) EXPECT_TRUE(defined.count(value)) << value;
  const Result alone = run("devices --graph");
  EXPECT_EQ(alone.status, 1) << alone.output;
  EXPECT_NE(alone.output.find("add --bench-compile --plan-only"), std::string::npos)
      << alone.output;
}

TEST(CliBenchCompile, UnknownProgramIsRefusedOnOneLine) {
  const Result result = run("devices --bench-compile --plan-only --program resnet");
  EXPECT_EQ(result.status, 1) << result.output;
  const std::string line = error_line(result);
  ASSERT_FALSE(line.empty()) << result.output;
  EXPECT_EQ(line.find('\n'), line.size() - 1) << result.output;
  EXPECT_NE(line.find("unknown --program \"resnet\": use cnn, smollm2-135m, "
                      "smollm2-135m-decode, smolvla, smolvla-chunk, resnet-50, whisper-tiny, "
                      "sd-unet, sd-unet-inference or sd-unet-sampler"),
            std::string::npos)
      << line;
}

// ResNet-50's training step, planned for the H200 in each precision and at two batches: four
// different programs; the fast one's dispatch list runs cooperative-matrix kernels, the strict
// one's none; the graph line names the precision.
TEST(CliBenchCompile, PlanOnlyPlansResNetInEitherPrecision) {
  const std::string command =
      "devices --bench-compile --plan-only --dispatches --program resnet-50";
  const Result strict = run(command);
  ASSERT_EQ(strict.status, 0) << strict.output;
  EXPECT_NE(strict.output.find("resnet-50 graph (forward, gradients, optimizer)"),
            std::string::npos)
      << strict.output;
  EXPECT_NE(strict.output.find("nodes, strict precision"), std::string::npos) << strict.output;
  EXPECT_EQ(strict.output.find("coopmat"), std::string::npos) << strict.output;
  const Result fast = run(command + " --precision fast");
  ASSERT_EQ(fast.status, 0) << fast.output;
  EXPECT_NE(fast.output.find("nodes, fast precision"), std::string::npos) << fast.output;
  EXPECT_NE(fast.output.find("gemm_coopmat"), std::string::npos) << fast.output;
  const Result large = run(command + " --precision fast --batch 256");
  ASSERT_EQ(large.status, 0) << large.output;
  const Result explicit_batch = run(command + " --batch 4");
  ASSERT_EQ(explicit_batch.status, 0) << explicit_batch.output;
  EXPECT_EQ(checksum_of(explicit_batch), checksum_of(strict)) << "batch 4 is the default";
  for (const Result* other : {&fast, &large}) {
    ASSERT_EQ(checksum_of(*other).size(), 16u) << other->output;
    EXPECT_NE(checksum_of(*other), checksum_of(strict));
  }
  EXPECT_NE(checksum_of(large), checksum_of(fast));
}

// The plan follows the environment's MEGANEURA_* switches, as a build on the device does: at
// batch 256 one of ResNet-50's fast products suits the workgroup GEMM, which its kill switch turns
// off.
TEST(CliBenchCompile, PlanOnlyFollowsTheEnvironmentsSwitches) {
  const std::string command =
      "devices --bench-compile --plan-only --dispatches --program resnet-50 --precision fast "
      "--batch 256";
  const Result plain = run(command);
  ASSERT_EQ(plain.status, 0) << plain.output;
  EXPECT_NE(plain.output.find("gemm_workgroup_coopmat"), std::string::npos) << plain.output;
  ::setenv("MEGANEURA_WORKGROUP_GEMM", "0", 1);
  const Result switched = run(command);
  ::unsetenv("MEGANEURA_WORKGROUP_GEMM");
  ASSERT_EQ(switched.status, 0) << switched.output;
  EXPECT_EQ(switched.output.find("gemm_workgroup_coopmat"), std::string::npos) << switched.output;
  EXPECT_NE(checksum_of(switched), checksum_of(plain));
}

TEST(CliBenchCompile, BatchPrecisionAndProgramMisuseIsRefusedOnOneLine) {
  for (const auto& [command, message] :
       {std::pair<std::string, std::string>{"devices --bench-compile --plan-only --batch 8",
                                            "error: --batch sets the resnet-50, sd-unet and "
                                            "sd-unet-inference programs' images; the "
                                            "cnn program has its workload's batch"},
        {"devices --bench-compile --plan-only --program whisper-tiny --batch 2",
         "error: --batch sets the resnet-50, sd-unet and sd-unet-inference programs' images; the "
         "whisper-tiny program has its workload's batch"},
        {"devices --bench-compile --plan-only --program sd-unet-sampler --batch 2",
         "the sd-unet-sampler program has its workload's batch"},
        {"devices --bench-compile --plan-only --program resnet-50 --precision half",
         "unknown precision \"half\": use strict, fast or bf16"},
        {"devices --program resnet-50", "error: --program, --batch and --precision choose"},
        {"devices --bench-compile --compile", "error: --compile compiles what a planned program"},
        {"devices --precision fast", "add --bench-compile"}}) {
    SCOPED_TRACE(command);
    const Result result = run(command);
    EXPECT_EQ(result.status, 1) << result.output;
    const std::string line = error_line(result);
    ASSERT_FALSE(line.empty()) << result.output;
    EXPECT_EQ(line.find('\n'), line.size() - 1) << result.output;
    EXPECT_NE(line.find(message), std::string::npos) << line;
  }
}

}  // namespace
