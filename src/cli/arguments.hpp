#pragma once
// A small command-line parser: "--name value" / "--name=value" options, "--switch" flags and
// positional arguments. Unknown options (also single-dash ones) are errors that name the command;
// "-h" means "--help" where the command has --help.
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
  // Also throws unless low <= value <= high.
  int64_t integer(const std::string& name, int64_t fallback, int64_t low, int64_t high) const;
  // Finite numbers only (NaN and infinities are refused).
  double real(const std::string& name, double fallback) const;  // throws mg::Error
  // Also throws unless low <= value <= high.
  double real(const std::string& name, double fallback, double low, double high) const;
  const std::vector<std::string>& positional() const { return positional_; }
  // Throws mg::Error naming the first positional argument past `most`.
  void expect_at_most_positional(size_t most) const;

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
