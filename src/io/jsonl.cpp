#include "io/jsonl.hpp"

#include <cerrno>
#include <cstring>

#include "meganeura/error.hpp"

namespace mg::io {

JsonlWriter::JsonlWriter(std::filesystem::path path) : path_(std::move(path)) {
  if (!path_.parent_path().empty()) {
    std::error_code error;
    std::filesystem::create_directories(path_.parent_path(), error);
    if (error) {
      throw Error("cannot create directory " + path_.parent_path().string() + " for log " +
                  path_.string() + ": " + error.message());
    }
  }
  file_ = std::fopen(path_.c_str(), "a");
  if (file_ == nullptr) {
    throw Error("cannot open log " + path_.string() + ": " + std::strerror(errno));
  }
}

JsonlWriter::~JsonlWriter() {
  std::fclose(file_);
}

void JsonlWriter::write(const nlohmann::json& record) {
  // dump() escapes control characters, so a record never spans two lines.
  const std::string line = record.dump() + "\n";
  if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fflush(file_) != 0) {
    throw Error("cannot write log " + path_.string() + ": " + std::strerror(errno));
  }
}

}  // namespace mg::io
