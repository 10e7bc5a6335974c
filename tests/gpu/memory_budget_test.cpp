// A program whose plan does not fit the device fails before allocating, on one line naming its
// planned bytes and the device's heap (docs/RELIABILITY.md, resource faults).
#include <gtest/gtest.h>

#include <string>

#include "meganeura/ops.hpp"
#include "meganeura/session.hpp"

namespace mg {
namespace {

TEST(MemoryBudget, APlanLargerThanTheHeapFailsBeforeAllocating) {
  // 3 GiB of parameters, more than Lavapipe's 2 GiB heap (and than any arena may be alone).
  Graph graph;
  const Tensor weights = parameter(graph, "weights", {768, 1024, 1024}, Init::zeros());
  graph.set_output("total", sum_all(weights).id());
  SessionOptions options;
  options.initialise_parameters = false;
  try {
    Session session(graph, options);
    if (session.report().device.find("llvmpipe") != std::string::npos)
      ADD_FAILURE() << "a 3 GiB program was built on " << session.report().device;
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_EQ(error.kind(), Error::Kind::out_of_memory) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    EXPECT_EQ(message.rfind("the program needs 3.0 GiB of device memory (3.0 GiB persistent, ", 0),
              0u)
        << message;
    EXPECT_NE(message.find(" in its largest device-local heap"), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace mg
