#include "io/jsonl.hpp"

#include <gtest/gtest.h>

#include <fstream>

#include "scratch_dir.hpp"

namespace mg::io {
namespace {

std::vector<nlohmann::json> read_lines(const std::filesystem::path& file) {
  std::ifstream in(file);
  std::vector<nlohmann::json> records;
  for (std::string line; std::getline(in, line);) records.push_back(nlohmann::json::parse(line));
  return records;
}

class JsonlTest : public testing::ScratchDirTest {};

TEST_F(JsonlTest, EachRecordIsOneFlushedLineAndReopeningAppends) {
  const auto file = path("runs/a/metrics.jsonl");
  {
    JsonlWriter log(file);
    log.write({{"step", 1}, {"loss", 2.25}, {"note", "multi\nline"}});
    // Flushed already: a reader sees the line while the writer is still open.
    ASSERT_EQ(read_lines(file).size(), 1u);
    log.write({{"step", 2}, {"loss", 1.5}});
  }
  JsonlWriter(file).write({{"step", 3}, {"loss", 1.0}});
  const auto records = read_lines(file);
  ASSERT_EQ(records.size(), 3u);
  EXPECT_EQ(records[0]["note"], "multi\nline");
  EXPECT_EQ(records[2]["step"], 3);
}

TEST_F(JsonlTest, UnwritableLocationIsNamed) {
  testing::write_text(path("blocker"), "a file, not a directory");
  testing::expect_error([&] { JsonlWriter(path("blocker/metrics.jsonl")); },
                        {path("blocker").string()});
}

}  // namespace
}  // namespace mg::io
