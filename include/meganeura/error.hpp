#pragma once
#include <stdexcept>
#include <string>

namespace mg {

// A problem the user can fix (bad shape, missing file, unsupported device feature). The message
// names the thing at fault and, where possible, how to fix it. The CLI prints it on one line and
// exits non-zero.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace mg
