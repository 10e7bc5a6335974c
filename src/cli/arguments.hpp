#pragma once
// A small command-line parser: "--name value" / "--name=value" options, "--switch" flags and
// positional arguments. Unknown options are errors that name the command.
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace mg::cli {

class Arguments {
 public:
  Arguments(std::string command, const std::vector<std::string>& words,
            const std::set<std::string>& options_with_values,
            const std::set<std::string>& switches);

  bool has(const std::string& name) const;  // switch given, or option given a value
  std::optional<std::string> value(const std::string& name) const;
  std::string text(const std::string& name, const std::string& fallback) const;
  int64_t integer(const std::string& name, int64_t fallback) const;  // throws mg::Error
  double real(const std::string& name, double fallback) const;       // throws mg::Error
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  std::string command_;
  std::map<std::string, std::string> values_;
  std::set<std::string> switches_;
  std::vector<std::string> positional_;
};

// Throws mg::Error unless option `name` (when given) names a file whose directory exists and is
// writable: checked when the command starts, not when it ends with the file.
void require_writable_file(const Arguments& arguments, const std::string& name);

}  // namespace mg::cli
