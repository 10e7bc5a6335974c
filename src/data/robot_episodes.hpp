#pragma once
// A simple data set of robot demonstrations for vision-language-action policies (SmolVLA):
// a folder holding episodes.jsonl, one JSON object a line, each one training record:
//   {"episode": 3, "images": ["frames/000012.png"], "state": [0.1, -0.4],
//    "instruction": "move to the red dot", "actions": [[0.2, 0.0], [0.2, 0.1], ...]}
// "images" are paths relative to the folder, one per camera; "actions" is the chunk of future
// actions to learn from this observation. Records of one episode share its number, so that a
// held-out split takes whole episodes. docs/SMOLVLA.md describes the format.
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "io/image.hpp"

namespace mg::data {

struct RobotRecord {
  int64_t episode = 0;
  std::vector<io::Image> images;
  std::vector<float> state;
  std::string instruction;
  std::vector<float> actions;  // rows x width, row-major
  int64_t action_rows = 0;
  int64_t action_width = 0;
};

// Reads every record and decodes its images. Throws mg::Error naming the file, the line and the
// field for a missing folder or file, a malformed line, an image that does not decode, or rows of
// actions of different widths.
std::vector<RobotRecord> read_robot_episodes(const std::filesystem::path& folder);

}  // namespace mg::data
