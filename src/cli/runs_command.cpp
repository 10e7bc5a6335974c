// `meganeura runs DIR`: the training runs under DIR (DIR itself and its direct subfolders), from
// their run records: status (a run whose process died without one reads "killed"), last step,
// checkpoint and the cause of an unsuccessful end.
#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "cli/arguments.hpp"
#include "cli/commands.hpp"
#include "cli/run_record.hpp"

namespace mg::cli {
namespace {

constexpr const char* kHelp = R"(usage: meganeura runs DIR [--json]

Lists the training runs in DIR and its subfolders (each a --out folder of 'meganeura train'),
one a line: folder, status, last step, checkpoint (and its step), start time, and for a run that
did not complete the cause. Status is completed, interrupted, out_of_memory, device_lost,
non_finite, data_error, checkpoint_error, shader_compile, failed, running, or killed (the process
ended without recording an end: SIGKILL, a crash or power loss).

  --json    print each run's record as one JSON line instead
)";

std::string text_of(const nlohmann::json& value) {
  if (value.is_null()) return "-";
  return value.is_string() ? value.get<std::string>() : value.dump();
}

}  // namespace

int runs_command(const std::vector<std::string>& words) {
  const Arguments arguments("meganeura runs", words, {}, {"help", "json"});
  if (arguments.has("help")) {
    std::fputs(kHelp, stdout);
    return 0;
  }
  arguments.expect_at_most_positional(1);
  if (arguments.positional().empty()) throw Error("missing DIR (usage: meganeura runs DIR)");
  const std::filesystem::path root = arguments.positional()[0];
  std::error_code error;
  if (!std::filesystem::is_directory(root, error)) {
    throw Error("no folder at " + root.string() + " (give the folder of --out, or its parent)");
  }
  std::vector<std::filesystem::path> folders = {root};
  for (const auto& entry : std::filesystem::directory_iterator(root, error)) {
    if (entry.is_directory(error)) folders.push_back(entry.path());
  }
  std::sort(folders.begin() + 1, folders.end());
  int listed = 0;
  for (const std::filesystem::path& folder : folders) {
    const std::optional<nlohmann::json> record = read_run_record(folder);
    if (!record) continue;
    ++listed;
    if (arguments.has("json")) {
      nlohmann::json line = *record;
      line["folder"] = folder.string();
      std::printf("%s\n", line.dump().c_str());
      continue;
    }
    const nlohmann::json checkpoint = record->value("checkpoint", nlohmann::json());
    const std::string checkpoint_text =
        checkpoint.is_object() ? text_of(checkpoint.value("path", nlohmann::json())) + " (step " +
                                     text_of(checkpoint.value("step", nlohmann::json())) + ")"
                               : "-";
    std::printf("%s  %s  step %s  checkpoint %s  started %s%s%s\n", folder.c_str(),
                text_of(record->value("status", nlohmann::json())).c_str(),
                text_of(record->value("last_step", nlohmann::json())).c_str(),
                checkpoint_text.c_str(),
                text_of(record->value("started", nlohmann::json())).c_str(),
                record->contains("message") ? "  cause: " : "",
                record->contains("message") ? text_of((*record)["message"]).c_str() : "");
  }
  if (listed == 0) std::fprintf(stderr, "no runs in %s\n", root.c_str());
  return 0;
}

}  // namespace mg::cli
