#pragma once
// A launch as planning sees it: one dispatch of a backend's kernel over graph values. Planning
// places the values it binds and orders launches by the bytes they touch; what the kernel is
// (its source and specialisation) stays the backend's, behind KernelCode.
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "meganeura/graph.hpp"

namespace mg::target {

struct Operand {
  std::string name;  // the buffer's name in the kernel's source
  ValueId value = kNoValue;
  bool write = false;
};

// The backend's kernel of a launch; each backend derives its own and reads it back when it
// creates the launch's pipeline.
class KernelCode {
 public:
  virtual ~KernelCode() = default;
};

struct Launch {
  std::string label;              // "matmul %12", shown in profiles and errors
  std::string kernel;             // archetype name, e.g. "pointwise", "gemm"
  std::vector<Operand> operands;  // in binding order
  std::array<uint32_t, 3> groups{1, 1, 1};
  std::shared_ptr<const KernelCode> code;
};

}  // namespace mg::target
