#pragma once
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

namespace mg::io {

// An append-only JSON-lines log (one object per line), e.g. runs/x/metrics.jsonl. Each line is
// flushed as it is written so a crash loses at most the line being written and `tail -f` works.
// Resuming a run appends to the existing log.
class JsonlWriter {
 public:
  // Creates parent directories. Throws mg::Error naming the file if it cannot be opened.
  explicit JsonlWriter(std::filesystem::path path);
  JsonlWriter(const JsonlWriter&) = delete;
  JsonlWriter& operator=(const JsonlWriter&) = delete;
  ~JsonlWriter();

  void write(const nlohmann::json& record);

  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  std::FILE* file_ = nullptr;
};

}  // namespace mg::io
