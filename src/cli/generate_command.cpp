#include <cstdio>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "cli/arguments.hpp"
#include "cli/commands.hpp"
#include "cli/training_run.hpp"
#include "io/json_limits.hpp"
#include "io/model_folder.hpp"
#include "io/tokenizer.hpp"
#include "runtime/llama_runtime.hpp"

namespace mg::cli {
namespace {

constexpr const char* kHelp = R"(usage: meganeura generate MODEL_DIR --prompt TEXT [options]

Generates text with a Llama-family model folder (LlamaForCausalLM as the Hugging Face Hub and
save_pretrained write it: config.json, model.safetensors or shards, tokenizer.json): the prompt
runs through a prefill program that fills the KV cache, then one decode program per token reads
and appends to it, both over one copy of the weights on the GPU. Tokens are printed as they
come; the prefill and decode speeds are printed at the end (on stderr).

  --prompt TEXT       the prompt (required)
  --chat              wrap the prompt in the chat template's special tokens (<|im_start|>user
                      ... <|im_end|> <|im_start|>assistant), for instruct models
  --max-tokens N      new tokens at most (default 64); generation also stops at the model's
                      end-of-sequence token
  --temperature X     0 is greedy decoding; above 0 samples (default: the folder's
                      generation_config.json when it samples, else 0)
  --top-k N           sample among the N most likely tokens only (0 = all; default as above)
  --top-p X           sample among the most likely tokens whose probabilities add up to X
                      (default as above, else 1)
  --seed N            sampling seed (default 0)
  --json              print one JSON object instead of streaming text: the prompt's token ids,
                      the generated token ids, the text and the speeds
  --device SEL        device index or part of its name (default: best available)
  --precision P       strict (default), fast (f16 operands on cooperative matrices)
                      or bf16 (bfloat16 operands there)
)";

// The sampling settings of generation_config.json, where it asks to sample.
models::SamplingOptions folder_sampling(const std::filesystem::path& folder) {
  models::SamplingOptions sampling;
  std::ifstream file(folder / "generation_config.json");
  if (!file) return sampling;
  const std::filesystem::path path = folder / "generation_config.json";
  const std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  const nlohmann::json config = io::parse_json(text, path.string());
  try {
    if (!config.is_object() || !config.value("do_sample", false)) return sampling;
    sampling.temperature = config.value("temperature", 1.0);
    sampling.top_k = config.value("top_k", int64_t{50});
    sampling.top_p = config.value("top_p", 1.0);
  } catch (const nlohmann::json::exception&) {
    throw Error(path.string() +
                ": do_sample, temperature, top_k and top_p must be a boolean and numbers");
  }
  return sampling;
}

std::vector<int32_t> chat_prompt(const io::Tokenizer& tokenizer, const std::string& prompt) {
  const std::optional<int32_t> start = tokenizer.token_id("<|im_start|>");
  const std::optional<int32_t> end = tokenizer.token_id("<|im_end|>");
  if (!start || !end) {
    throw Error(
        "--chat needs the chat tokens <|im_start|> and <|im_end|>, which this tokenizer "
        "lacks: leave --chat out");
  }
  return tokenizer.encode("<|im_start|>user\n" + prompt + "<|im_end|>\n<|im_start|>assistant\n");
}

}  // namespace

int generate_command(const std::vector<std::string>& words) {
  const Arguments arguments(
      "meganeura generate", words,
      {"prompt", "max-tokens", "temperature", "top-k", "top-p", "seed", "device", "precision"},
      {"help", "json", "chat"});
  if (arguments.has("help")) {
    std::fputs(kHelp, stdout);
    return 0;
  }
  if (arguments.positional().size() != 1) {
    throw Error("give one model folder: meganeura generate MODEL_DIR --prompt TEXT");
  }
  const std::optional<std::string> prompt = arguments.value("prompt");
  if (!prompt) throw Error("--prompt TEXT is required");
  const std::filesystem::path folder_path = arguments.positional()[0];
  const int64_t max_tokens = arguments.integer("max-tokens", 64);
  if (max_tokens <= 0) throw Error("--max-tokens must be positive");
  models::SamplingOptions sampling = folder_sampling(folder_path);
  sampling.temperature = arguments.real("temperature", sampling.temperature);
  sampling.top_k = arguments.integer("top-k", sampling.top_k);
  sampling.top_p = arguments.real("top-p", sampling.top_p);
  sampling.seed = static_cast<uint64_t>(arguments.integer("seed", 0));
  models::check_sampling(sampling);

  const models::LlamaConfig config = models::load_llama_config(folder_path);
  const io::ModelFolder folder = io::ModelFolder::open(folder_path);
  models::check_llama_weights(folder, config);
  const io::Tokenizer tokenizer = io::Tokenizer::load(folder_path / "tokenizer.json");
  const std::vector<int32_t> prompt_ids =
      arguments.has("chat") ? chat_prompt(tokenizer, *prompt) : tokenizer.encode(*prompt);
  if (prompt_ids.empty()) throw Error("the prompt encodes to no tokens: give some text");
  const int64_t cache_length = static_cast<int64_t>(prompt_ids.size()) + max_tokens;
  if (cache_length > config.max_positions) {
    throw Error("the prompt's " + std::to_string(prompt_ids.size()) + " tokens and --max-tokens " +
                std::to_string(max_tokens) + " exceed the model's " +
                std::to_string(config.max_positions) +
                " positions: shorten the prompt or lower --max-tokens");
  }

  SessionOptions options;
  options.shared_device = open_shared_device(arguments.text("device", ""));
  options.shared_tensors = make_shared_tensors(options.shared_device);
  // Every parameter is written from the folder (or the checkpoint) before the first run.
  options.initialise_parameters = false;
  options.precision = parse_precision(arguments.text("precision", "strict"));
  models::LlamaGenerator generator(config, options, cache_length);
  models::load_llama_weights(generator.decode_session(), folder, config);
  const BuildReport& report =
      generator.prefill_session(static_cast<int64_t>(prompt_ids.size())).report();
  std::fprintf(stderr, "device: %s\n", report.device.c_str());
  print_precision(options.precision, report);

  const bool json = arguments.has("json");
  io::TokenStreamDecoder stream(tokenizer);
  const models::Generation generation =
      generator.generate(prompt_ids, max_tokens, sampling, [&](int32_t token) {
        if (json) return;
        std::fputs(stream.push(token).c_str(), stdout);
        std::fflush(stdout);
      });
  const double prefill_rate = static_cast<double>(prompt_ids.size()) / generation.prefill_seconds;
  const double decode_rate =
      generation.decode_steps > 0
          ? static_cast<double>(generation.decode_steps) / generation.decode_seconds
          : 0.0;
  if (json) {
    const nlohmann::json result = {{"prompt_ids", prompt_ids},
                                   {"generated_ids", generation.tokens},
                                   {"text", tokenizer.decode(generation.tokens, true)},
                                   {"ended_by_eos", generation.ended_by_eos},
                                   {"prefill_tokens_per_second", prefill_rate},
                                   {"decode_tokens_per_second", decode_rate}};
    std::printf("%s\n", result.dump().c_str());
  } else {
    std::fputs(stream.finish().c_str(), stdout);
    std::fputc('\n', stdout);
  }
  std::fprintf(stderr,
               "prefill: %zu tokens in %.1f ms (%.0f tokens/s); decode: %lld tokens in %.1f ms "
               "(%.1f tokens/s)\n",
               prompt_ids.size(), 1000 * generation.prefill_seconds, prefill_rate,
               static_cast<long long>(generation.decode_steps), 1000 * generation.decode_seconds,
               decode_rate);
  return 0;
}

}  // namespace mg::cli
