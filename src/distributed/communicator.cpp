// The single-process communicator and the choices every data-parallel rank makes before MPI is
// involved (was this process launched by MPI, which device does it take).
#include <cstdlib>

#include "backends/vulkan/runtime/gpu.hpp"
#include "meganeura/distributed.hpp"
#include "meganeura/switches.hpp"

namespace mg {
namespace {

class SingleProcessCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  int local_rank() const override { return 0; }
  void start_sum(std::span<float>) override {}
  void wait_all() override {}
  void sum(std::span<double>) override {}
  void broadcast(std::span<std::byte>, int) override {}

 protected:
  void abort_job(int) override {}
};

}  // namespace

void Communicator::abort(int exit_code) {
  abort_job(exit_code);
  std::_Exit(exit_code);
}

std::shared_ptr<Communicator> single_process_communicator() {
  return std::make_shared<SingleProcessCommunicator>();
}

bool launched_by_mpi() {
  // Open MPI's mpirun sets the first; PMI-based launchers (srun, MPICH's hydra) the others.
  for (const char* variable : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"}) {
    if (std::getenv(variable)) return true;
  }
  return false;
}

std::string device_for_local_rank(int local_rank) {
  if (!Switches::from_environment().device.empty()) return "";
  const std::vector<gpu::DeviceInfo> devices = gpu::list_devices();
  if (devices.empty()) return "";
  const gpu::DeviceKind best = devices[gpu::choose_device(devices, "")].kind;
  std::vector<size_t> candidates;
  for (size_t i = 0; i < devices.size(); ++i) {
    if (devices[i].kind == best) candidates.push_back(i);
  }
  const size_t chosen = candidates[static_cast<size_t>(local_rank) % candidates.size()];
  return std::to_string(chosen);
}

}  // namespace mg
