// The Meganeura side of bench/unet_parity_h200.py: loads a diffusers UNet2DConditionModel folder,
// runs the noise-MSE program with gradients on the inputs given (a safetensors file with
// "sample", "timestep", "encoder_hidden_states" and "noise", f32), and writes the noise
// prediction, the loss and every parameter's gradient norm as JSON.
//
// usage: unet_parity MODEL_DIR INPUTS.safetensors OUT_JSON strict|fast
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/model_folder.hpp"
#include "io/safetensors.hpp"
#include "meganeura/autodiff.hpp"
#include "meganeura/session.hpp"
#include "meganeura/train.hpp"
#include "runtime/loss_scaled_run.hpp"
#include "runtime/unet_runtime.hpp"

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: unet_parity MODEL_DIR INPUTS.safetensors OUT_JSON strict|fast\n");
    return 2;
  }
  try {
    const mg::io::ModelFolder folder = mg::io::ModelFolder::open(argv[1]);
    const mg::models::UNetConfig config =
        mg::models::unet_config_from_json(folder.config(), "config.json");
    const mg::io::SafetensorsFile inputs = mg::io::read_safetensors(argv[2], "inputs");
    const auto values = [&](const char* name) {
      const mg::io::TensorRecord* record = inputs.find(name);
      if (!record) throw mg::Error(std::string(argv[2]) + " has no " + name);
      std::vector<float> result(record->bytes.size() / 4);
      std::memcpy(result.data(), record->bytes.data(), record->bytes.size());
      return std::make_pair(record->shape, result);
    };
    const auto [sample_shape, sample] = values(mg::models::kUNetSample);
    const auto [context_shape, context] = values(mg::models::kUNetContext);
    mg::Graph graph = mg::models::unet_loss_graph(
        config, {sample_shape[0], sample_shape[2], sample_shape[3], context_shape[1]}, true);
    mg::SessionOptions options;
    options.precision = mg::parse_precision(argv[4]);
    // Fast precision's f16 operands need the loss scaled for small gradients to survive.
    const bool scaled = options.precision == mg::Precision::fast;
    const std::vector<std::string> gradient_outputs =
        mg::add_parameter_gradient_outputs(graph, graph.output(mg::models::kUNetLoss), scaled);
    options.initialise_parameters = false;
    mg::Session session(graph, options);
    mg::models::load_unet_weights(session, folder, config);
    session.set_input(mg::models::kUNetSample, sample);
    session.set_input(mg::models::kUNetTimestep, values(mg::models::kUNetTimestep).second);
    session.set_input(mg::models::kUNetContext, context);
    session.set_input(mg::models::kUNetNoise, values(mg::models::kUNetNoise).second);
    const double loss_scale = mg::run_gradients(session, gradient_outputs, scaled);
    nlohmann::json out = {{"noise_pred", session.output(mg::models::kUNetNoisePrediction)},
                          {"loss", session.scalar_output(mg::models::kUNetLoss)},
                          {"device", session.report().device},
                          {"coop_dispatches", session.report().coop_matrix_dispatches},
                          {"loss_scale", loss_scale}};
    for (const auto& [name, shape] : mg::models::unet_parameters(config)) {
      double squares = 0;
      for (float value : session.output("grad." + name)) squares += double(value) * value;
      out["gradient_norms"][name] = std::sqrt(squares) / loss_scale;
    }
    std::ofstream(argv[3]) << out.dump();
  } catch (const std::exception& error) {
    std::fprintf(stderr, "unet_parity: %s\n", error.what());
    return 1;
  }
  return 0;
}
