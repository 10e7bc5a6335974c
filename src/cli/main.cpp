// The `meganeura` command: train, deploy and inspect models on any Vulkan GPU.
#include <cstdio>
#include <string>
#include <vector>

#include "cli/commands.hpp"
#include "cli/crash_report.hpp"
#include "cli/run_record.hpp"
#include "meganeura/error.hpp"
#include "meganeura/switches.hpp"

namespace {

constexpr const char* kUsage = R"(usage: meganeura <command> [options]

commands:
  train     train a classifier on Fashion-MNIST, a ResNet on an image folder, or a model
            folder (language model, Whisper, SmolVLA, U-Net); write checkpoints, metrics, a plot
  infer     evaluate a checkpoint on the test set, or classify image files (a ResNet's top 5)
  generate  generate text with a Llama-family model folder (SmolLM2, TinyLlama, ...)
  fashion-folder
            write Fashion-MNIST as an image folder of PNGs (for 'train --model resnet18')
  transcribe
            speech to text with a Whisper model folder
  act       run a SmolVLA policy folder: images, state and an instruction to an action chunk
  sample    denoise noise into samples with a diffusers U-Net folder (DDIM or Euler)
  devices   list Vulkan devices and which one would be used
  inspect   print a model's graph, its memory plan and dispatch counts
  bench     time kernel families with GPU timestamps ('meganeura bench kernels')
  runs      list the training runs in a folder with their status, last step and checkpoint

Run 'meganeura <command> --help' for a command's options.
Environment: MEGANEURA_DEVICE (device choice), MEGANEURA_VALIDATE=1 (Vulkan validation),
MEGANEURA_CACHE_DIR / MEGANEURA_NO_CACHE=1 (kernel cache).
)";

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> words(argv + 1, argv + argc);
  if (words.empty() || words[0] == "--help" || words[0] == "-h" || words[0] == "help") {
    std::fputs(kUsage, words.empty() ? stderr : stdout);
    return words.empty() ? 2 : 0;
  }
  if (words[0] == "--version") {
    std::puts("meganeura 0.1.0");
    return 0;
  }
  const std::string command = words[0];
  words.erase(words.begin());
  mg::cli::report_crashes(command.c_str());
  try {
    // Every switch is checked once here, so that a bad value is refused by every command, not
    // only by those that open a device.
    mg::Switches::from_environment();
    if (command == "train") return mg::cli::train_command(words);
    if (command == "infer") return mg::cli::infer_command(words);
    if (command == "devices") return mg::cli::devices_command(words);
    if (command == "inspect") return mg::cli::inspect_command(words);
    if (command == "bench") return mg::cli::bench_command(words);
    if (command == "generate") return mg::cli::generate_command(words);
    if (command == "fashion-folder") return mg::cli::fashion_folder_command(words);
    if (command == "transcribe") return mg::cli::transcribe_command(words);
    if (command == "act") return mg::cli::act_command(words);
    if (command == "sample") return mg::cli::sample_command(words);
    if (command == "runs") return mg::cli::runs_command(words);
    std::fprintf(stderr, "meganeura: unknown command '%s'\n\n%s", command.c_str(), kUsage);
    return 2;
  } catch (const mg::Error& error) {
    std::fprintf(stderr, "meganeura %s: error: %s\n", command.c_str(), error.what());
    return mg::cli::exit_status_of(error);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "meganeura %s: internal error: %s\n", command.c_str(), error.what());
    return 3;
  }
}
