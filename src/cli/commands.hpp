#pragma once
#include <string>
#include <vector>

namespace mg::cli {

// Each command takes the words after its name and returns the process exit code.
int devices_command(const std::vector<std::string>& words);
int train_command(const std::vector<std::string>& words);
int infer_command(const std::vector<std::string>& words);
int inspect_command(const std::vector<std::string>& words);
int bench_command(const std::vector<std::string>& words);
int generate_command(const std::vector<std::string>& words);
int fashion_folder_command(const std::vector<std::string>& words);
int transcribe_command(const std::vector<std::string>& words);
int act_command(const std::vector<std::string>& words);
int sample_command(const std::vector<std::string>& words);
int runs_command(const std::vector<std::string>& words);
// `meganeura train --model MODEL_DIR`: train_command hands a model folder to it.
// `meganeura bench workloads`: bench_command hands it the words after "workloads".
int bench_workloads(const std::vector<std::string>& words);
int lm_train_command(const std::vector<std::string>& words);
// `meganeura train --model resnetNN|RESNET_DIR`: train_command hands ResNets to it.
int image_train_command(const std::vector<std::string>& words);
int whisper_train_command(const std::vector<std::string>& words);
int smolvla_train_command(const std::vector<std::string>& words);
int unet_train_command(const std::vector<std::string>& words);

}  // namespace mg::cli
