#include <algorithm>
#include <cstdio>

#include "meganeura/graph.hpp"

namespace mg {
namespace {

std::string format_value(const AttrValue& value) {
  if (const auto* integer = std::get_if<int64_t>(&value)) return std::to_string(*integer);
  if (const auto* real = std::get_if<double>(&value)) {
    char buffer[32];
    std::snprintf(buffer, sizeof(buffer), "%g", *real);
    return buffer;
  }
  if (const auto* list = std::get_if<std::vector<int64_t>>(&value)) return shape_string(*list);
  return "\"" + std::get<std::string>(value) + "\"";
}

[[noreturn]] void attribute_error(std::string_view name, const char* problem) {
  throw Error("attribute '" + std::string(name) + "' " + problem);
}

}  // namespace

Attrs::Attrs(std::initializer_list<std::pair<std::string, AttrValue>> items) {
  for (const auto& [name, value] : items) set(name, value);
}

Attrs& Attrs::set(std::string name, AttrValue value) {
  auto it =
      std::lower_bound(items_.begin(), items_.end(), name,
                       [](const auto& item, const std::string& key) { return item.first < key; });
  if (it != items_.end() && it->first == name) {
    it->second = std::move(value);
  } else {
    items_.insert(it, {std::move(name), std::move(value)});
  }
  return *this;
}

const AttrValue* Attrs::find(std::string_view name) const {
  for (const auto& [key, value] : items_) {
    if (key == name) return &value;
  }
  return nullptr;
}

bool Attrs::has(std::string_view name) const {
  return find(name) != nullptr;
}

int64_t Attrs::get_int(std::string_view name) const {
  const AttrValue* value = find(name);
  if (!value) attribute_error(name, "is missing");
  if (const auto* integer = std::get_if<int64_t>(value)) return *integer;
  attribute_error(name, "is not an integer");
}

int64_t Attrs::get_int(std::string_view name, int64_t fallback) const {
  return has(name) ? get_int(name) : fallback;
}

double Attrs::get_float(std::string_view name) const {
  const AttrValue* value = find(name);
  if (!value) attribute_error(name, "is missing");
  if (const auto* real = std::get_if<double>(value)) return *real;
  if (const auto* integer = std::get_if<int64_t>(value)) return static_cast<double>(*integer);
  attribute_error(name, "is not a number");
}

double Attrs::get_float(std::string_view name, double fallback) const {
  return has(name) ? get_float(name) : fallback;
}

const std::vector<int64_t>& Attrs::get_ints(std::string_view name) const {
  const AttrValue* value = find(name);
  if (!value) attribute_error(name, "is missing");
  if (const auto* list = std::get_if<std::vector<int64_t>>(value)) return *list;
  attribute_error(name, "is not a list of integers");
}

std::vector<int64_t> Attrs::get_ints(std::string_view name, std::vector<int64_t> fallback) const {
  return has(name) ? get_ints(name) : fallback;
}

const std::string& Attrs::get_string(std::string_view name) const {
  const AttrValue* value = find(name);
  if (!value) attribute_error(name, "is missing");
  if (const auto* text = std::get_if<std::string>(value)) return *text;
  attribute_error(name, "is not a string");
}

std::string Attrs::get_string(std::string_view name, std::string fallback) const {
  return has(name) ? get_string(name) : fallback;
}

std::string Attrs::to_string() const {
  std::string text;
  for (const auto& [name, value] : items_) {
    if (!text.empty()) text += ", ";
    text += name + "=" + format_value(value);
  }
  return text;
}

}  // namespace mg
