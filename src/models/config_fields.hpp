#pragma once
// Reading the fields of a model's config.json (transformers', diffusers' and LeRobot's), each
// error one line naming the file (`where`) and the key. Templates so that ordered JSON works too.
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/json_limits.hpp"
#include "meganeura/error.hpp"

namespace mg::models {

// The value of `key`, or nullptr where it is absent or null.
template <typename Json>
const Json* find_key(const Json& object, const char* key) {
  if (!object.is_object()) return nullptr;
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

template <typename Json>
int64_t required_int(const Json& config, const char* key, const std::string& where) {
  const Json* value = find_key(config, key);
  if (!value || !value->is_number_integer() || value->template get<int64_t>() <= 0) {
    throw Error(where + ": \"" + key + "\" must be a positive integer");
  }
  return value->template get<int64_t>();
}

template <typename Json>
double number_or(const Json& config, const char* key, double fallback, const std::string& where) {
  const Json* value = find_key(config, key);
  if (!value) return fallback;
  if (!value->is_number()) throw Error(where + ": \"" + key + "\" must be a number");
  return value->template get<double>();
}

template <typename Json>
bool bool_or(const Json& config, const char* key, bool fallback, const std::string& where) {
  const Json* value = find_key(config, key);
  if (!value) return fallback;
  if (!value->is_boolean()) throw Error(where + ": \"" + key + "\" must be true or false");
  return value->template get<bool>();
}

// A token id or a list of them (eos_token_id may be either); empty where absent.
template <typename Json>
std::vector<int32_t> token_ids(const Json& config, const char* key, const std::string& where) {
  const Json* value = find_key(config, key);
  if (!value) return {};
  std::vector<int32_t> ids;
  for (const Json& id : value->is_array() ? *value : Json::array({*value})) {
    if (!id.is_number_integer()) throw Error(where + ": \"" + key + "\" must hold token ids");
    ids.push_back(id.template get<int32_t>());
  }
  return ids;
}

// The config.json of model folder `folder`; `kind` names the folder expected ("a Whisper
// folder") in the error for a missing folder.
inline nlohmann::json read_config_json(const std::filesystem::path& folder,
                                       const std::string& kind) {
  if (!std::filesystem::is_directory(folder)) {
    throw Error("no model folder at " + folder.string() + ": give " + kind +
                " holding config.json and the weights");
  }
  const std::filesystem::path path = folder / "config.json";
  std::ifstream file(path);
  if (!file) throw Error("model folder " + folder.string() + " has no config.json");
  const std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  return io::parse_json(text, path.string());
}

}  // namespace mg::models
