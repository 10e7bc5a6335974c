// The Meganeura side of bench/llama_parity_h200.py: loads a LlamaForCausalLM folder, runs the
// causal-LM loss program with gradients on the token ids given, and writes the logits, the loss
// and every parameter's gradient norm as JSON, for the script to compare with transformers.
//
// usage: llama_parity MODEL_DIR IDS_JSON OUT_JSON strict|fast
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/model_folder.hpp"
#include "meganeura/autodiff.hpp"
#include "meganeura/session.hpp"
#include "meganeura/train.hpp"
#include "runtime/llama_runtime.hpp"
#include "runtime/loss_scaled_run.hpp"

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: llama_parity MODEL_DIR IDS_JSON OUT_JSON strict|fast\n");
    return 2;
  }
  try {
    const mg::io::ModelFolder folder = mg::io::ModelFolder::open(argv[1]);
    const mg::models::LlamaConfig config =
        mg::models::llama_config_from_json(folder.config(), "config.json");
    std::ifstream ids_file(argv[2]);
    const std::vector<int32_t> ids = nlohmann::json::parse(ids_file).get<std::vector<int32_t>>();
    const int64_t seq = static_cast<int64_t>(ids.size());
    mg::Graph graph = mg::models::llama_loss_graph(config, 1, seq, true);
    mg::SessionOptions options;
    options.precision = mg::parse_precision(argv[4]);
    // Fast precision's f16 operands need the loss scaled for small gradients to survive.
    const bool scaled = options.precision == mg::Precision::fast;
    const std::vector<std::string> gradient_outputs =
        mg::add_parameter_gradient_outputs(graph, graph.output(mg::models::kLoss), scaled);
    options.initialise_parameters = false;
    mg::Session session(graph, options);
    mg::models::load_llama_weights(session, folder, config);
    std::vector<int32_t> labels(ids.begin() + 1, ids.end());
    labels.push_back(static_cast<int32_t>(mg::models::kIgnoredLabel));
    session.set_input(mg::models::kInputIds, ids);
    session.set_input(mg::models::kLabels, labels);
    const double loss_scale = mg::run_gradients(session, gradient_outputs, scaled);
    nlohmann::json out = {{"logits", session.output(mg::models::kLogits)},
                          {"loss", session.scalar_output(mg::models::kLoss)},
                          {"device", session.report().device},
                          {"coop_dispatches", session.report().coop_matrix_dispatches},
                          {"loss_scale", loss_scale}};
    for (const auto& [name, shape] : mg::models::llama_parameters(config)) {
      double squares = 0;
      for (float value : session.output("grad." + name)) squares += double(value) * value;
      out["gradient_norms"][name] = std::sqrt(squares) / loss_scale;
    }
    std::ofstream(argv[3]) << out.dump();
  } catch (const std::exception& error) {
    std::fprintf(stderr, "llama_parity: %s\n", error.what());
    return 1;
  }
  return 0;
}
