#include <cstdio>

#include "backends/vulkan/kernels/lowering.hpp"
#include "cli/arguments.hpp"
#include "cli/commands.hpp"
#include "ir/op_names.hpp"
#include "meganeura/session.hpp"
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
  --precision P       strict (default) or fast: the program --plan builds
)";

}  // namespace

int inspect_command(const std::vector<std::string>& words) {
  const Arguments arguments("meganeura inspect", words,
                            {"model", "mode", "batch", "device", "precision"},
                            {"plan", "dispatches", "graph", "ops", "help"});
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
    if (options.precision == Precision::fast) {
      std::printf("dispatches on cooperative matrices: %zu of %zu\n",
                  session.report().coop_matrix_dispatches, session.report().dispatches);
    }
  }
  return 0;
}

}  // namespace mg::cli
