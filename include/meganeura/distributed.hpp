#pragma once
// Data-parallel training across processes (docs/DISTRIBUTED.md): one process per GPU, each on its
// share of the global batch; the gradients are summed over the processes ("ranks") before the
// optimizer update, so that every rank takes the step one process would take on the whole batch.
// The collectives go through a Communicator: MPI's (mpirun) or a single process's.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "meganeura/graph.hpp"
#include "meganeura/session.hpp"
#include "meganeura/train.hpp"

namespace mg {

// The ranks of one job and the collectives data-parallel training needs. Every rank calls the
// collectives in the same order with the same sizes.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // The rank among the processes of this host (which GPU it takes).
  virtual int local_rank() const = 0;
  // Starts summing `values` element-wise over every rank, in place. The values must stay
  // untouched until wait_all() returns.
  virtual void start_sum(std::span<float> values) = 0;
  // Waits for every sum started since the last wait_all().
  virtual void wait_all() = 0;
  // Lets the sums started advance without waiting for them: MPI moves a non-blocking collective
  // on only inside MPI calls, and the trainer calls this between the gradient program's segments.
  virtual void progress() {}
  // Sums a few values (a loss, counters, flags) over every rank and returns when done.
  virtual void sum(std::span<double> values) = 0;
  // Rank `root`'s bytes into every rank's `bytes` (of the same size everywhere).
  virtual void broadcast(std::span<std::byte> bytes, int root) = 0;
  // Ends every rank of the job with `exit_code`, now: for a rank that failed, after printing its
  // error, so that the others do not wait for it in a collective forever. This process exits
  // even where the job's end does not reach it.
  [[noreturn]] void abort(int exit_code);

 protected:
  // Ends the other ranks of the job (and usually this one).
  virtual void abort_job(int exit_code) = 0;
};

// A job of one process: sums leave the values as they are.
std::shared_ptr<Communicator> single_process_communicator();

// MPI_COMM_WORLD. MPI is initialised by the first call and finalised when the last reference
// goes. Throws mg::Error when this build has no MPI (see mpi_available).
std::shared_ptr<Communicator> mpi_communicator();
bool mpi_available();  // whether this build was made with MPI
// Whether an MPI launcher (mpirun, or a batch system's PMI) started this process.
bool launched_by_mpi();

// The device for the rank with `local_rank` when none is named (SessionOptions::device, "" for
// the automatic choice): among the devices automatic choice ranks best (every discrete GPU, say),
// the local_rank-th, wrapping around when the ranks outnumber them (they then share a GPU).
// MEGANEURA_DEVICE, where set, still decides ("" is returned).
std::string device_for_local_rank(int local_rank);

struct DataParallelOptions {
  // Gradients are summed in buckets of about this many bytes, one collective each.
  size_t bucket_bytes = size_t{25} << 20;
  // With more than one rank, the gradient program runs in segments (Session::set_segments), one
  // ending where a bucket's gradients are final, and each bucket's sum starts while backward
  // still runs the later segments. false sums every bucket after the whole gradient program.
  // MEGANEURA_OVERLAP_REDUCTION=0/1 overrides.
  bool overlap = true;
};

// Data-parallel training of the scalar `loss` of `graph` (a forward graph, without
// add_training): each rank feeds its share of the global batch, all shares of one size, and a
// step then equals one step of add_training on the whole batch (with a loss that is a mean over
// the batch): the gradients of every rank are summed and divided by the number of ranks before
// clipping and the optimizer update, which every rank then applies alike.
//
// Two programs share the parameters on one device: the gradient program (the graph's outputs,
// "loss" and the gradients) and the update program (clipping, the optimizer and its state).
// The gradients travel between them through host memory, where the ranks sum them: each bucket
// as soon as the dispatch that finishes its last gradient has run (DataParallelOptions::overlap).
class DataParallelTrainer {
 public:
  // `options` as for a Session; a shared device and shared tensors are made where absent (pass
  // the SharedTensors of other programs, an evaluation one, to share the weights with them).
  DataParallelTrainer(const Graph& graph, ValueId loss, const OptimizerConfig& optimizer,
                      std::shared_ptr<Communicator> communicator, SessionOptions options = {},
                      DataParallelOptions parallel = {});
  ~DataParallelTrainer();
  DataParallelTrainer(const DataParallelTrainer&) = delete;
  DataParallelTrainer& operator=(const DataParallelTrainer&) = delete;

  // This rank's inputs of the graph, as Session::set_input.
  void set_input(std::string_view name, std::span<const float> values);
  void set_input(std::string_view name, std::span<const int32_t> values);
  bool has_input(std::string_view name) const;

  // Run `step` (0-based, counting graph runs as optimizer_inputs does): this rank's gradients,
  // their sum over the ranks, the update. Every rank calls it with the same step.
  void step(int64_t step);
  // The loss of the last step over the global batch (the mean of the ranks' losses).
  double loss() const;
  // This rank's outputs of the last step (the graph's outputs, on this rank's share).
  std::vector<float> output(std::string_view name) const;

  // The parameters and the optimizer state (checkpoints read and write them here).
  Session& state();
  // The program computing this rank's loss and gradients.
  Session& gradient_program();
  const BuildReport& report() const;  // the gradient program's
  Communicator& communicator() const;

  // Makes every rank's parameters and state those of rank `root` (weights loaded or initialised
  // on one rank, or a check that all start alike).
  void broadcast_state(int root = 0);

  // Where the last step's time went, in milliseconds of host wall time.
  struct StepTimes {
    // The gradient program's run (with overlap, the buckets staged and their sums started
    // meanwhile).
    double gradients_ms = 0;
    // After the gradient program: staging the gradients not yet staged, waiting for the sums
    // over the ranks and handing them to the update program.
    double reduction_ms = 0;
    double update_ms = 0;  // the update program's run
    size_t segments = 1;   // submissions of the gradient program
    // Buckets whose sum started while later segments of the gradient program were still to
    // finish (0 without overlap).
    size_t sums_started_during_backward = 0;
  };
  StepTimes last_step_times() const;

  // The last step's order of events on this rank: the gradient program's segments submitted and
  // finished, and the buckets' sums started (bucket 0 holds the last parameters' gradients,
  // which backward computes first).
  struct StepEvent {
    enum class Kind { segment_submitted, segment_finished, sum_started } kind;
    size_t index = 0;  // the segment's or the bucket's
  };
  std::vector<StepEvent> last_step_events() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mg
