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

}  // namespace mg::cli
