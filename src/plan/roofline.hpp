#pragma once
// What each dispatch of a program asks of the device, from shapes alone: its arithmetic
// (FLOPs, multiply and add counted apart) and the bytes of the values it binds, each read or
// written once. Roofline reports divide these by measured times and compare them with the
// device's peaks (cli/roofline_report.hpp). Products and convolutions count their multiply-adds
// exactly; attention counts the products its kernels compute (the backward kernels recompute
// the scores); every other kernel counts one operation per element it writes, which is what
// matters for them: they are bound by their bytes.
#include <cstdint>
#include <vector>

#include "plan/program.hpp"

namespace mg::plan {

struct LaunchCost {
  double flops = 0;
  double bytes = 0;
};

LaunchCost launch_cost(const Program& program, const PlannedLaunch& launch);
// One per entry of program.launches, in order.
std::vector<LaunchCost> launch_costs(const Program& program);

}  // namespace mg::plan
