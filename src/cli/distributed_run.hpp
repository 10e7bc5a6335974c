#pragma once
// A training job's place in a data-parallel run (`mpirun -np N meganeura train ...`, or
// --distributed): its communicator, which rank writes, the device it takes and its share of the
// global batch (docs/DISTRIBUTED.md).
#include <functional>
#include <memory>
#include <string>

#include "cli/arguments.hpp"
#include "meganeura/distributed.hpp"

namespace mg::cli {

class DistributedRun {
 public:
  // Alone unless --distributed is given or an MPI launcher started the process; throws mg::Error
  // when a distributed run is asked of a build without MPI, or on a bad --bucket-mb.
  explicit DistributedRun(const Arguments& arguments);

  bool distributed() const { return communicator_ != nullptr; }
  int rank() const { return communicator_ ? communicator_->rank() : 0; }
  int size() const { return communicator_ ? communicator_->size() : 1; }
  const std::shared_ptr<Communicator>& communicator() const { return communicator_; }
  // The trainer's options: --bucket-mb.
  const DataParallelOptions& parallel_options() const { return parallel_options_; }
  // Rank 0 alone writes the checkpoint, metrics, plot and progress line.
  bool writes() const { return rank() == 0; }
  // Prints the device this process trains on (with its rank where distributed) and, on the
  // writing rank, notes it in the run record.
  void announce_device(const std::string& device) const;
  // --device where given, otherwise the device of this rank's local rank.
  std::string device(const Arguments& arguments) const;
  // This rank's share of a global batch of `global` (--batch), which the ranks must divide.
  int64_t local_batch(int64_t global) const;
  // Whether any rank has `flag` set (every rank calls it at the same point of the run).
  bool any(bool flag) const;
  // Sums `value` over the ranks.
  double sum(double value) const;

  // Runs `job`. When it throws in a run of several ranks, prints the error as main() would and
  // ends every rank (MPI_Abort) so that none waits for this one in a collective.
  int run(const std::string& command, const std::function<int()>& job) const;

 private:
  std::shared_ptr<Communicator> communicator_;
  DataParallelOptions parallel_options_;
};

// For the jobs that train in one process (Whisper, SmolVLA, the U-Net): throws mg::Error naming
// `job` when an MPI launcher started this process, since each of its processes would train a
// copy of its own into the same --out folder.
void refuse_mpi_launcher(const std::string& job);

}  // namespace mg::cli
