#include "data/robot_episodes.hpp"

#include <fstream>
#include <nlohmann/json.hpp>

#include "meganeura/error.hpp"

namespace mg::data {
namespace {

std::vector<float> numbers(const nlohmann::json& value, const std::string& where) {
  if (!value.is_array()) throw Error(where + " must be an array of numbers");
  std::vector<float> out;
  for (const nlohmann::json& item : value) {
    if (!item.is_number()) throw Error(where + " must be an array of numbers");
    out.push_back(item.get<float>());
  }
  return out;
}

}  // namespace

std::vector<RobotRecord> read_robot_episodes(const std::filesystem::path& folder) {
  const std::filesystem::path path = folder / "episodes.jsonl";
  if (!std::filesystem::is_directory(folder))
    throw Error("no data folder at " + folder.string() + ": give a folder holding episodes.jsonl");
  std::ifstream file(path);
  if (!file) throw Error("data folder " + folder.string() + " has no episodes.jsonl");
  std::vector<RobotRecord> records;
  std::string line;
  int64_t number = 0;
  while (std::getline(file, line)) {
    ++number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path.string() + " line " + std::to_string(number);
    const nlohmann::json json = nlohmann::json::parse(line, nullptr, false);
    if (!json.is_object()) throw Error(where + " is not a JSON object");
    for (const char* key : {"images", "state", "instruction", "actions"})
      if (!json.contains(key)) throw Error(where + " has no \"" + key + "\"");
    RobotRecord record;
    record.episode = json.value("episode", int64_t{0});
    if (!json["images"].is_array() || json["images"].empty())
      throw Error(where + ": \"images\" must list at least one image file");
    for (const nlohmann::json& image : json["images"]) {
      if (!image.is_string()) throw Error(where + ": \"images\" must hold file names");
      record.images.push_back(io::read_image(folder / image.get<std::string>()));
    }
    record.state = numbers(json["state"], where + ": \"state\"");
    if (!json["instruction"].is_string()) throw Error(where + ": \"instruction\" must be a string");
    record.instruction = json["instruction"].get<std::string>();
    if (!json["actions"].is_array() || json["actions"].empty())
      throw Error(where + ": \"actions\" must be a non-empty array of action rows");
    for (const nlohmann::json& row : json["actions"]) {
      const std::vector<float> values = numbers(row, where + ": each row of \"actions\"");
      if (record.action_rows > 0 && static_cast<int64_t>(values.size()) != record.action_width)
        throw Error(where + ": the rows of \"actions\" differ in width");
      record.action_width = static_cast<int64_t>(values.size());
      record.actions.insert(record.actions.end(), values.begin(), values.end());
      ++record.action_rows;
    }
    records.push_back(std::move(record));
  }
  if (records.empty()) throw Error(path.string() + " holds no records");
  return records;
}

}  // namespace mg::data
