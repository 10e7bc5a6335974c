#include "cli/distributed_run.hpp"

#include <cstdio>
#include <exception>

#include "cli/run_record.hpp"

namespace mg::cli {

DistributedRun::DistributedRun(const Arguments& arguments) {
  const double bucket_mib = arguments.real("bucket-mb", 25.0);
  if (!(bucket_mib > 0) || bucket_mib > 1 << 20)
    throw Error("--bucket-mb " + arguments.text("bucket-mb", "") +
                ": give the gradient buckets' size in MiB, a number above 0 (default 25)");
  parallel_options_.bucket_bytes = static_cast<size_t>(bucket_mib * (1 << 20));
  if (!arguments.has("distributed") && !launched_by_mpi()) return;
  if (!mpi_available()) {
    throw Error(
        "this meganeura was built without MPI, so it cannot train over several processes "
        "(--distributed or mpirun): install libopenmpi-dev and openmpi-bin (scripts/setup.sh) "
        "and build again");
  }
  communicator_ = mpi_communicator();
}

void refuse_mpi_launcher(const std::string& job) {
  if (!launched_by_mpi()) return;
  throw Error("the " + job +
              " job trains in one process; data-parallel training (docs/DISTRIBUTED.md) covers "
              "the Fashion-MNIST classifiers, the ResNets and the language models: start it "
              "without mpirun");
}

std::string DistributedRun::device(const Arguments& arguments) const {
  if (arguments.has("device") || !communicator_) return arguments.text("device", "");
  return device_for_local_rank(communicator_->local_rank());
}

int64_t DistributedRun::local_batch(int64_t global) const {
  if (global % size() != 0) {
    throw Error("--batch " + std::to_string(global) + " is the global batch of " +
                std::to_string(size()) + " ranks, which must divide it: give a multiple of " +
                std::to_string(size()));
  }
  return global / size();
}

bool DistributedRun::any(bool flag) const {
  return sum(flag ? 1.0 : 0.0) > 0;
}

double DistributedRun::sum(double value) const {
  if (communicator_) communicator_->sum(std::span(&value, 1));
  return value;
}

namespace {

// Prints the exception in flight as main() would, naming the rank.
void print_error(const std::string& command, int rank, int size) {
  try {
    throw;
  } catch (const Error& error) {
    std::fprintf(stderr, "meganeura %s: rank %d of %d: error: %s\n", command.c_str(), rank, size,
                 error.what());
  } catch (const std::exception& error) {
    std::fprintf(stderr, "meganeura %s: rank %d of %d: internal error: %s\n", command.c_str(), rank,
                 size, error.what());
  } catch (...) {
    std::fprintf(stderr, "meganeura %s: rank %d of %d: internal error\n", command.c_str(), rank,
                 size);
  }
  std::fflush(stderr);
}

// What the terminate handler ends: an exception that escapes while another unwinds (a
// destructor waiting for a GPU that hangs) must end every rank too, not this one alone.
struct RunningJob {
  Communicator* communicator = nullptr;
  std::string command;
  int rank = 0, size = 1;
};
RunningJob running_job;

}  // namespace

int DistributedRun::run(const std::string& command, const std::function<int()>& job) const {
  if (!communicator_ || communicator_->size() == 1) return job();
  running_job = {communicator_.get(), command, rank(), size()};
  std::set_terminate([] {
    if (std::current_exception())
      print_error(running_job.command, running_job.rank, running_job.size);
    running_job.communicator->abort(1);
  });
  try {
    return job();
  } catch (...) {
    print_error(command, rank(), size());
  }
  communicator_->abort(1);
}

void DistributedRun::announce_device(const std::string& device) const {
  if (distributed()) {
    std::fprintf(stderr, "rank %d of %d: device: %s\n", rank(), size(), device.c_str());
  } else {
    std::fprintf(stderr, "device: %s\n", device.c_str());
  }
  if (writes()) current_run().set("device", device);
}

}  // namespace mg::cli
