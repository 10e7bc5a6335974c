#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "ir/op_names.hpp"
#include "ops/op.hpp"

namespace mg {
namespace {

// The registry and the op-name constants (ir/op_names.hpp) list the same ops: code that names
// an op through a constant names a registered op, and a registered op has its constant.
TEST(OpRegistry, EveryOpHasItsConstantAndEveryConstantAnOp) {
  const std::vector<std::string> registered = op_names();
  for (std::string_view name : op::kAll) {
    EXPECT_NE(find_op(name), nullptr)
        << "op::" << name << " (ir/op_names.hpp) names no registered op: register it in its "
        << "family file under src/ops/ or drop the constant";
  }
  for (const std::string& name : registered) {
    EXPECT_NE(std::find(op::kAll.begin(), op::kAll.end(), name), op::kAll.end())
        << "op '" << name << "' is registered but has no constant: add op::" << name
        << " to ir/op_names.hpp (and to op::kAll)";
  }
  EXPECT_EQ(registered.size(), op::kAll.size()) << "an op is registered twice";
}

}  // namespace
}  // namespace mg
