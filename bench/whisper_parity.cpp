// The Meganeura side of bench/whisper_parity_h200.py: loads a WhisperForConditionalGeneration
// folder, runs the teacher-forced loss program with gradients on one clip's log-mel features and
// decoder tokens, and writes the logits, the loss and every trained tensor's gradient norm as
// JSON, for the script to compare with transformers.
//
// usage: whisper_parity MODEL_DIR FEATURES_F32 TOKENS_JSON OUT_JSON strict|fast
// FEATURES_F32: raw little-endian floats [mels, frames]; TOKENS_JSON: {"decoder_input_ids": [...],
// "labels": [...]} of one clip.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/model_folder.hpp"
#include "meganeura/autodiff.hpp"
#include "meganeura/error.hpp"
#include "meganeura/session.hpp"
#include "meganeura/train.hpp"
#include "runtime/loss_scaled_run.hpp"
#include "runtime/whisper_runtime.hpp"

namespace wio = mg::models::whisper_io;

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr,
                 "usage: whisper_parity MODEL_DIR FEATURES_F32 TOKENS_JSON OUT_JSON strict|fast\n");
    return 2;
  }
  try {
    const mg::models::WhisperConfig config = mg::models::load_whisper_config(argv[1]);
    const mg::io::ModelFolder folder = mg::io::ModelFolder::open(argv[1]);
    std::ifstream features_file(argv[2], std::ios::binary);
    std::vector<float> features(config.num_mel_bins * config.input_frames());
    features_file.read(reinterpret_cast<char*>(features.data()),
                       static_cast<std::streamsize>(features.size() * sizeof(float)));
    if (!features_file) throw mg::Error(std::string(argv[2]) + " holds too few features");
    std::ifstream tokens_file(argv[3]);
    const nlohmann::json tokens = nlohmann::json::parse(tokens_file);
    const auto ids = tokens.at("decoder_input_ids").get<std::vector<int32_t>>();
    const auto labels = tokens.at("labels").get<std::vector<int32_t>>();
    const int64_t length = static_cast<int64_t>(ids.size());
    mg::Graph graph = mg::models::whisper_loss_graph(config, 1, length, true, true);
    mg::SessionOptions options;
    options.precision = mg::parse_precision(argv[5]);
    // Fast precision's f16 operands need the loss scaled for small gradients to survive.
    const bool scaled = options.precision == mg::Precision::fast;
    const std::vector<std::string> gradient_outputs =
        mg::add_parameter_gradient_outputs(graph, graph.output(wio::kLoss), scaled);
    options.initialise_parameters = false;
    mg::Session session(graph, options);
    mg::models::load_whisper_weights({&session}, folder, config);
    session.set_input(wio::kInputFeatures, features);
    session.set_input(wio::kDecoderInputIds, ids);
    session.set_input(wio::kLabels, labels);
    const double loss_scale = mg::run_gradients(session, gradient_outputs, scaled);
    nlohmann::json out = {{"logits", session.output(wio::kLogits)},
                          {"loss", session.scalar_output(wio::kLoss)},
                          {"device", session.report().device},
                          {"coop_dispatches", session.report().coop_matrix_dispatches},
                          {"loss_scale", loss_scale}};
    for (const auto& [name, shape] : mg::models::whisper_parameters(config)) {
      if (name == mg::models::kEncoderPositions) continue;  // not trained
      double squares = 0;
      for (float value : session.output("grad." + name)) squares += double(value) * value;
      out["gradient_norms"][name] = std::sqrt(squares) / loss_scale;
    }
    std::ofstream(argv[4]) << out.dump();
  } catch (const std::exception& error) {
    std::fprintf(stderr, "whisper_parity: %s\n", error.what());
    return 1;
  }
  return 0;
}
