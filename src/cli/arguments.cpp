#include "cli/arguments.hpp"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>

#include "meganeura/error.hpp"

namespace mg::cli {

Arguments::Arguments(std::string command, const std::vector<std::string>& words,
                     const std::set<std::string>& options_with_values,
                     const std::set<std::string>& switches)
    : command_(std::move(command)) {
  for (size_t i = 0; i < words.size(); ++i) {
    const std::string& word = words[i];
    if (word == "-h" && switches.count("help")) {
      switches_.insert("help");
      continue;
    }
    if (word.size() > 1 && word[0] == '-' && word[1] != '-') {
      throw Error("unknown option " + word + " for '" + command_ +
                  "' (options start with --; see '" + command_ + " --help')");
    }
    if (word.rfind("--", 0) != 0 || word == "--") {
      positional_.push_back(word);
      continue;
    }
    std::string name = word.substr(2);
    std::optional<std::string> inline_value;
    if (const size_t equals = name.find('='); equals != std::string::npos) {
      inline_value = name.substr(equals + 1);
      name = name.substr(0, equals);
    }
    if (switches.count(name)) {
      if (inline_value) throw Error("option --" + name + " of '" + command_ + "' takes no value");
      switches_.insert(name);
    } else if (options_with_values.count(name)) {
      if (inline_value) {
        values_[name] = *inline_value;
      } else if (i + 1 < words.size()) {
        values_[name] = words[++i];
      } else {
        throw Error("option --" + name + " of '" + command_ + "' needs a value");
      }
    } else {
      throw Error("unknown option --" + name + " for '" + command_ + "' (see '" + command_ +
                  " --help')");
    }
  }
}

bool Arguments::has(const std::string& name) const {
  return switches_.count(name) > 0 || values_.count(name) > 0;
}

std::optional<std::string> Arguments::value(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

std::string Arguments::text(const std::string& name, const std::string& fallback) const {
  return value(name).value_or(fallback);
}

int64_t Arguments::integer(const std::string& name, int64_t fallback) const {
  const std::optional<std::string> text = value(name);
  if (!text) return fallback;
  size_t used = 0;
  int64_t parsed = 0;
  try {
    parsed = std::stoll(*text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text->size() || text->empty()) {
    throw Error("--" + name + " expects an integer, got '" + *text + "'");
  }
  return parsed;
}

int64_t Arguments::integer(const std::string& name, int64_t fallback, int64_t low,
                           int64_t high) const {
  const int64_t parsed = integer(name, fallback);
  if (parsed < low || parsed > high) {
    throw Error("--" + name + " must be from " + std::to_string(low) + " to " +
                std::to_string(high) + ", got " + std::to_string(parsed));
  }
  return parsed;
}

double Arguments::real(const std::string& name, double fallback) const {
  const std::optional<std::string> text = value(name);
  if (!text) return fallback;
  size_t used = 0;
  double parsed = 0;
  try {
    parsed = std::stod(*text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text->size() || text->empty() || !std::isfinite(parsed)) {
    throw Error("--" + name + " expects a finite number, got '" + *text + "'");
  }
  return parsed;
}

double Arguments::real(const std::string& name, double fallback, double low, double high) const {
  const double parsed = real(name, fallback);
  if (parsed < low || parsed > high) {
    char text[128];
    std::snprintf(text, sizeof text, "--%s must be from %g to %g, got %g", name.c_str(), low, high,
                  parsed);
    throw Error(text);
  }
  return parsed;
}

void Arguments::expect_at_most_positional(size_t most) const {
  if (positional_.size() <= most) return;
  throw Error("unexpected argument '" + positional_[most] + "' for '" + command_ + "' (see '" +
              command_ + " --help')");
}

void require_writable_file(const Arguments& arguments, const std::string& name) {
  const std::optional<std::string> path = arguments.value(name);
  if (!path) return;
  std::filesystem::path directory = std::filesystem::path(*path).parent_path();
  if (directory.empty()) directory = ".";
  std::error_code error;
  if (!std::filesystem::is_directory(directory, error)) {
    throw Error("--" + name + " " + *path + ": there is no directory " + directory.string() +
                "; create it or choose another path");
  }
  if (::access(directory.c_str(), W_OK) != 0) {
    throw Error("--" + name + " " + *path + ": the directory " + directory.string() +
                " is not writable; choose another path");
  }
}

}  // namespace mg::cli
