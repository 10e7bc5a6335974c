#pragma once
#include <stdexcept>
#include <string>

namespace mg {

// A problem the user can fix (bad shape, missing file, unsupported device feature). The message
// names the thing at fault and, where possible, how to fix it. The CLI prints it on one line and
// exits non-zero. The kind says what failed, for callers that react to faults differently (the
// run monitor of `meganeura train` records it and exits with a code per kind).
class Error : public std::runtime_error {
 public:
  enum class Kind {
    input,           // bad input or usage: the default
    data,            // a data set that cannot be read
    checkpoint,      // a checkpoint that cannot be read or written
    out_of_memory,   // the device or host ran out of memory
    device_lost,     // the device was lost (driver reset, hang, removal)
    shader_compile,  // a kernel that does not compile or that the driver refuses
    non_finite,      // NaN or infinity in the loss
  };

  explicit Error(const std::string& message, Kind kind = Kind::input)
      : std::runtime_error(message), kind_(kind) {}
  explicit Error(const char* message, Kind kind = Kind::input)
      : std::runtime_error(message), kind_(kind) {}

  Kind kind() const { return kind_; }

 private:
  Kind kind_;
};

}  // namespace mg
