// The Communicator over MPI_COMM_WORLD, where the build found MPI (MEGANEURA_WITH_MPI).
#include "meganeura/distributed.hpp"

#ifdef MEGANEURA_WITH_MPI
#include <mpi.h>

#include <algorithm>
#include <mutex>
#include <vector>
#endif

namespace mg {

#ifdef MEGANEURA_WITH_MPI
namespace {

// MPI counts are ints: larger spans go in pieces of this many elements.
constexpr size_t kMaxCount = size_t{1} << 30;

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator() {
    int initialised = 0;
    MPI_Initialized(&initialised);
    if (!initialised) {
      MPI_Init(nullptr, nullptr);
      owns_mpi_ = true;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    // The ranks that share memory with this one are those of its host.
    MPI_Comm host;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &host);
    MPI_Comm_rank(host, &local_rank_);
    MPI_Comm_free(&host);
  }
  ~MpiCommunicator() override {
    wait_all();
    if (owns_mpi_) MPI_Finalize();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }

  void start_sum(std::span<float> values) override {
    for (size_t first = 0; first < values.size(); first += kMaxCount) {
      const size_t count = std::min(kMaxCount, values.size() - first);
      MPI_Request request;
      MPI_Iallreduce(MPI_IN_PLACE, values.data() + first, static_cast<int>(count), MPI_FLOAT,
                     MPI_SUM, MPI_COMM_WORLD, &request);
      pending_.push_back(request);
    }
  }

  void wait_all() override {
    if (pending_.empty()) return;
    MPI_Waitall(static_cast<int>(pending_.size()), pending_.data(), MPI_STATUSES_IGNORE);
    pending_.clear();
  }

  void progress() override {
    if (pending_.empty()) return;
    int done = 0;
    MPI_Testall(static_cast<int>(pending_.size()), pending_.data(), &done, MPI_STATUSES_IGNORE);
    if (done) pending_.clear();
  }

  void sum(std::span<double> values) override {
    MPI_Allreduce(MPI_IN_PLACE, values.data(), static_cast<int>(values.size()), MPI_DOUBLE, MPI_SUM,
                  MPI_COMM_WORLD);
  }

  void broadcast(std::span<std::byte> bytes, int root) override {
    for (size_t first = 0; first < bytes.size(); first += kMaxCount) {
      const size_t count = std::min(kMaxCount, bytes.size() - first);
      MPI_Bcast(bytes.data() + first, static_cast<int>(count), MPI_BYTE, root, MPI_COMM_WORLD);
    }
  }

 protected:
  void abort_job(int exit_code) override { MPI_Abort(MPI_COMM_WORLD, exit_code); }

 private:
  bool owns_mpi_ = false;
  int rank_ = 0, size_ = 1, local_rank_ = 0;
  std::vector<MPI_Request> pending_;
};

}  // namespace

bool mpi_available() {
  return true;
}

std::shared_ptr<Communicator> mpi_communicator() {
  // MPI is initialised once a process: later calls share the communicator while it lives.
  static std::mutex mutex;
  static std::weak_ptr<Communicator> current;
  std::lock_guard lock(mutex);
  std::shared_ptr<Communicator> communicator = current.lock();
  if (!communicator) {
    int finalised = 0;
    MPI_Finalized(&finalised);
    if (finalised)
      throw Error("MPI was finalised in this process: keep one mpi_communicator() for the job");
    communicator = std::make_shared<MpiCommunicator>();
    current = communicator;
  }
  return communicator;
}

#else

bool mpi_available() {
  return false;
}

std::shared_ptr<Communicator> mpi_communicator() {
  throw Error(
      "this meganeura was built without MPI: install libopenmpi-dev and openmpi-bin "
      "(scripts/setup.sh) and build again to train over several processes");
}

#endif

}  // namespace mg
