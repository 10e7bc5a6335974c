#include <chrono>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>

#include "backends/vulkan/kernels/lowering.hpp"
#include "cli/arguments.hpp"
#include "cli/commands.hpp"
#include "cli/roofline_report.hpp"
#include "ir/op_names.hpp"
#include "meganeura/session.hpp"
#include "meganeura/train.hpp"
#include "models/classifier.hpp"
#include "ops/op.hpp"

namespace mg::cli {
namespace {

constexpr const char* kHelp = R"(usage: meganeura inspect [options]

Prints the graph of a built-in model and, with --plan, builds it on the device and prints the
memory plan (logical vs physical bytes, peak, arenas) and dispatch counts before and after the
passes; with --dispatches, every dispatch in execution order (the labels that --trace files
and `bench kernels --profile` show, the kernel, its grid and the barriers), the setup's first
where there is one (dispatches over the weights alone, which run once and after a parameter is
written, not in every run).

  --model cnn|mlp     which classifier (default cnn)
  --mode train|infer  training graph (gradients, optimizer) or inference graph (default train)
  --batch N           batch size (default 64)
  --plan              build on the device and print the memory plan
  --dispatches        build on the device and list its dispatches
  --graph             print every node of the graph
  --ops               list every op and whether it has a GPU kernel
  --device SEL        device index or part of its name
  --precision P       strict (default), fast or bf16: the program --plan builds
  --roofline          build, run and profile the program, and print each dispatch's FLOPs and
                      bytes (from shapes), its time, its floor at the device's peaks (measured
                      once per device and cached beside the kernel cache) and the share of the
                      roof it reaches, and an energy estimate (docs/ROOFLINE.md)
  --json              with --roofline: one JSON object instead of the table
  --repeat-seconds S  with --roofline: run the program for S seconds and print one JSON line
                      (runs, seconds, FLOPs and bytes a run): bench/energy_h200.sh samples the
                      board's power meanwhile
)";

// Every input of `graph` filled (labels 0, features a fixed pattern, the optimizer's scalars of
// its first step), for runs that only time the program.
void fill_inputs(Session& session, const Graph& graph) {
  const std::map<std::string, double> scalars = optimizer_inputs(OptimizerConfig{}, 0);
  for (ValueId id : graph.leaves(op::input)) {
    const Node& node = graph.node(id);
    const size_t count = static_cast<size_t>(node.type.elements());
    if (const auto scalar = scalars.find(node.name); scalar != scalars.end()) {
      session.set_input(node.name, std::vector<float>{static_cast<float>(scalar->second)});
    } else if (node.type.dtype == DType::i32) {
      session.set_input(node.name, std::vector<int32_t>(count, 0));
    } else {
      std::vector<float> values(count);
      for (size_t i = 0; i < count; ++i) values[i] = static_cast<float>(i % 11) * 0.1f - 0.5f;
      session.set_input(node.name, values);
    }
  }
}

int print_roofline(const Graph& graph, const Arguments& arguments) {
  SessionOptions options;
  options.device = arguments.text("device", "");
  options.precision = parse_precision(arguments.text("precision", "strict"));
  options.profile = true;
  const double repeat_seconds = arguments.real("repeat-seconds", 0, 0, 3600);
  Session session(graph, options);
  const DevicePeaks peaks = device_peaks(options, session.report().device);
  fill_inputs(session, graph);
  for (int warm = 0; warm < 3; ++warm) session.run();
  const std::vector<DispatchProfile> profile = session.profile();
  const Roofline result = roofline(session.report(), &profile, peaks);
  if (repeat_seconds > 0) {
    const auto start = std::chrono::steady_clock::now();
    int64_t runs = 0;
    double seconds = 0;
    while (seconds < repeat_seconds) {
      session.run();
      ++runs;
      seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    std::printf("%s\n",
                nlohmann::json{{"device", peaks.device},
                               {"runs", runs},
                               {"seconds", seconds},
                               {"flops_per_run", result.flops},
                               {"bytes_per_run", result.bytes},
                               {"energy_model_path", energy_model_path(peaks.device).string()}}
                    .dump()
                    .c_str());
    return 0;
  }
  if (arguments.has("json")) {
    std::printf("%s\n", roofline_json(result, result.measured_ms / 1e3).dump().c_str());
  } else {
    std::fputs(roofline_table(result).c_str(), stdout);
  }
  return 0;
}

}  // namespace

int inspect_command(const std::vector<std::string>& words) {
  const Arguments arguments("meganeura inspect", words,
                            {"model", "mode", "batch", "device", "precision", "repeat-seconds"},
                            {"plan", "dispatches", "graph", "ops", "help", "roofline", "json"});
  if (arguments.has("help")) {
    std::fputs(kHelp, stdout);
    return 0;
  }
  arguments.expect_at_most_positional(0);
  if (arguments.has("ops")) {
    const std::vector<std::string> lowered = kernels::lowered_ops();
    for (const std::string& name : op_names()) {
      const bool leaf =
          name == op::input || name == op::parameter || name == op::state || name == op::constant;
      const bool has_kernel = leaf || is_view_op(name) ||
                              std::find(lowered.begin(), lowered.end(), name) != lowered.end();
      std::printf("%-32s %s\n", name.c_str(), leaf ? "leaf" : has_kernel ? "gpu" : "no gpu kernel");
    }
    return 0;
  }
  models::ClassifierConfig model;
  model.architecture = arguments.text("model", "cnn");
  model = models::ClassifierConfig::from_json(model.to_json());
  const int64_t batch = arguments.integer("batch", 64);
  if (batch <= 0) throw Error("--batch must be positive");
  const std::string mode = arguments.text("mode", "train");
  if (mode != "train" && mode != "infer") throw Error("--mode must be train or infer");
  const Graph graph = mode == "train"
                          ? models::build_classifier_training(model, batch, OptimizerConfig{})
                          : models::build_classifier(model, batch);
  verify(graph);
  if (arguments.has("roofline")) return print_roofline(graph, arguments);
  std::printf("%s %s graph, batch %lld: %zu nodes\n", model.architecture.c_str(), mode.c_str(),
              static_cast<long long>(batch), graph.size());
  if (arguments.has("graph")) std::fputs(graph.to_string().c_str(), stdout);
  if (arguments.has("plan") || arguments.has("dispatches")) {
    SessionOptions options;
    options.device = arguments.text("device", "");
    options.precision = parse_precision(arguments.text("precision", "strict"));
    const Session session(graph, options);
    std::printf("device: %s\n", session.report().device.c_str());
    if (arguments.has("plan")) std::fputs(session.report().memory_plan.c_str(), stdout);
    if (arguments.has("dispatches")) std::fputs(session.report().dispatch_list.c_str(), stdout);
    if (options.precision != Precision::strict) {
      std::printf("dispatches on cooperative matrices: %zu of %zu\n",
                  session.report().coop_matrix_dispatches, session.report().dispatches);
    }
  }
  return 0;
}

}  // namespace mg::cli
