// `meganeura act MODEL_DIR --image FILE... --state x,y,... --instruction TEXT`: one action chunk
// of a SmolVLA policy folder, printed as JSON with its latency.
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/arguments.hpp"
#include "cli/commands.hpp"
#include "meganeura/error.hpp"
#include "runtime/smolvla_runtime.hpp"

namespace mg::cli {
namespace {

constexpr const char* kHelp =
    R"(usage: meganeura act MODEL_DIR --image FILE [--image FILE...] --state x,y,...
                     --instruction TEXT [options]

Runs a SmolVLA policy folder (LeRobot's config.json with "type": "smolvla" and
model.safetensors; the SmolVLM backbone's config.json and tokenizer.json in MODEL_DIR/vlm):
the images (one per camera of the config's input_features, in its order; resized with
padding and mapped to [-1, 1] as SmolVLA does), the instruction and the robot state go through
the backbone once, then N Euler steps of the flow turn noise into a chunk of actions, all as one
recorded program. Prints one JSON object: "actions" (chunk_size rows of the action's width, in
the robot's units when the checkpoint holds normalisation statistics), "latency_ms" of each
chunk and the settings; a line with the latency goes to stderr.

  --image FILE         a camera image (PNG, JPEG, ...; RGB); repeat for each camera
  --state LIST         the robot state, comma-separated (observation.state's width)
  --instruction TEXT   the task in words
  --steps N            Euler steps of the flow (default: the config's num_steps)
  --repeat N           run N chunks (new noise each) and report each latency (default 1)
  --seed N             noise seed (default 0)
  --device SEL         device index or part of its name (default: best available)
  --precision P        strict (default), fast (f16 operands on cooperative matrices)
                       or bf16 (bfloat16 operands there)
)";

std::vector<float> parse_state(const std::string& text) {
  std::vector<float> values;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t end = std::min(text.find(',', start), text.size());
    const std::string item = text.substr(start, end - start);
    try {
      size_t used = 0;
      values.push_back(std::stof(item, &used));
      if (used != item.size()) throw std::invalid_argument(item);
    } catch (const std::exception&) {
      throw Error("--state \"" + text + "\" is not a comma-separated list of numbers");
    }
    start = end + 1;
  }
  return values;
}

}  // namespace

int act_command(const std::vector<std::string>& words) {
  // --image may repeat; the parser keeps one value per option, so images are taken out first.
  std::vector<std::string> images, rest;
  for (size_t i = 0; i < words.size(); ++i) {
    if (words[i] == "--image") {
      if (i + 1 == words.size()) throw Error("--image needs a file");
      images.push_back(words[++i]);
    } else if (words[i].starts_with("--image=")) {
      images.push_back(words[i].substr(8));
    } else {
      rest.push_back(words[i]);
    }
  }
  const Arguments arguments(
      "meganeura act", rest,
      {"state", "instruction", "steps", "repeat", "seed", "device", "precision"}, {"help"});
  if (arguments.has("help")) {
    std::fputs(kHelp, stdout);
    return 0;
  }
  if (arguments.positional().size() != 1)
    throw Error("give one MODEL_DIR (see meganeura act --help)");
  if (images.empty()) throw Error("give at least one --image FILE");
  if (!arguments.has("state")) throw Error("give the robot state: --state x,y,...");
  if (!arguments.has("instruction")) throw Error("give the task: --instruction TEXT");
  const models::SmolVLAFolder folder = models::open_smolvla_folder(arguments.positional()[0]);
  const int64_t steps = arguments.integer("steps", folder.config.num_steps);
  const int64_t repeat = arguments.integer("repeat", 1);
  if (steps <= 0 || repeat <= 0) throw Error("--steps and --repeat must be positive");
  std::vector<io::Image> decoded;
  for (const std::string& image : images) decoded.push_back(io::read_image(image));
  const std::vector<float> state = parse_state(*arguments.value("state"));

  SessionOptions options;
  options.device = arguments.text("device", "");
  options.precision = parse_precision(arguments.text("precision", "strict"));
  models::SmolVLAPolicy policy(folder, options, steps);
  const uint64_t seed = static_cast<uint64_t>(arguments.integer("seed", 0));
  nlohmann::json latencies = nlohmann::json::array();
  models::ActionChunk chunk;
  for (int64_t i = 0; i < repeat; ++i) {
    chunk = policy.act(decoded, state, *arguments.value("instruction"), seed + i);
    latencies.push_back(chunk.seconds * 1e3);
  }
  const models::SmolVLAConfig& config = folder.config;
  nlohmann::json rows = nlohmann::json::array();
  for (int64_t r = 0; r < config.chunk_size; ++r)
    rows.push_back(std::vector<float>(chunk.actions.begin() + r * config.action_dim,
                                      chunk.actions.begin() + (r + 1) * config.action_dim));
  const nlohmann::json out = {{"actions", rows},
                              {"chunk_size", config.chunk_size},
                              {"action_dim", config.action_dim},
                              {"steps", steps},
                              {"latency_ms", latencies}};
  std::puts(out.dump().c_str());
  std::fprintf(stderr, "chunk of %lld actions x %lld in %.1f ms (%lld flow steps)\n",
               static_cast<long long>(config.chunk_size), static_cast<long long>(config.action_dim),
               latencies.back().get<double>(), static_cast<long long>(steps));
  return 0;
}

}  // namespace mg::cli
