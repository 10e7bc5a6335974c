// DataParallelTrainer: a gradient program and an update program on shared parameters, with the
// gradients summed over the ranks in between (include/meganeura/distributed.hpp).
#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>

#include "ir/op_names.hpp"
#include "meganeura/autodiff.hpp"
#include "meganeura/distributed.hpp"
#include "meganeura/ops.hpp"
#include "meganeura/switches.hpp"

namespace mg {
namespace {

// The gradient program's output of a parameter's gradient, and the update program's input of it.
std::string gradient_name(const std::string& parameter) {
  return "gradient." + parameter;
}

double milliseconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

// The forward graph with output "loss" and one output per parameter's gradient.
Graph gradient_graph(const Graph& forward, ValueId loss) {
  Graph graph = forward;
  if (graph.type(loss).elements() != 1)
    throw Error("data-parallel training needs a scalar loss, got " + type_string(graph.type(loss)));
  const std::vector<ValueId> parameters = graph.leaves(op::parameter);
  if (parameters.empty()) throw Error("data-parallel training: the graph has no parameters");
  const std::map<ValueId, ValueId> gradient_of = gradients(graph, loss, parameters);
  graph.set_output("loss", loss);
  for (const auto& [parameter, gradient] : gradient_of)
    graph.set_output(gradient_name(graph.node(parameter).name), gradient);
  return graph;
}

// The parameters of `forward` (same names, types and initialisation), each updated by the
// optimizer from input "gradient.<name>", the sum of the ranks' gradients, divided by `ranks`.
Graph update_graph(const Graph& forward, const OptimizerConfig& optimizer, int ranks) {
  Graph graph;
  std::map<ValueId, ValueId> gradient_of;
  for (ValueId leaf : forward.leaves(op::parameter)) {
    const Node& node = forward.node(leaf);
    const ValueId parameter = graph.parameter(node.name, node.type, leaf_init(node));
    Tensor gradient{&graph, graph.input(gradient_name(node.name), node.type)};
    if (ranks > 1) gradient = gradient * (1.0 / ranks);
    gradient_of[parameter] = gradient.id();
  }
  add_optimizer_update(graph, gradient_of, optimizer);
  return graph;
}

// Gradients summed by one collective: consecutive parameters, backward's order (last first).
struct Bucket {
  struct Entry {
    std::string name;  // gradient_name(parameter)
    size_t offset = 0, count = 0;
  };
  std::vector<Entry> entries;
  std::vector<float> values;
  size_t segment = 0;  // the gradient program's segment after which its gradients are final
};

std::vector<Bucket> make_buckets(const Graph& forward, size_t bucket_bytes) {
  std::vector<Bucket> buckets;
  const std::vector<ValueId> parameters = forward.leaves(op::parameter);
  size_t filled = 0;
  for (auto it = parameters.rbegin(); it != parameters.rend(); ++it) {
    const Node& node = forward.node(*it);
    const auto count = static_cast<size_t>(node.type.elements());
    if (buckets.empty() || (filled > 0 && (filled + count) * sizeof(float) > bucket_bytes)) {
      buckets.emplace_back();
      filled = 0;
    }
    buckets.back().entries.push_back({gradient_name(node.name), filled, count});
    filled += count;
    buckets.back().values.resize(filled);
  }
  return buckets;
}

SessionOptions with_shared_tensors(SessionOptions options) {
  if (!options.shared_device) {
    options.shared_device =
        open_shared_device(options.device, options.validation, options.switches);
  }
  if (!options.shared_tensors) options.shared_tensors = make_shared_tensors(options.shared_device);
  return options;
}

}  // namespace

struct DataParallelTrainer::Impl {
  Impl(const Graph& graph, ValueId loss, const OptimizerConfig& optimizer_config,
       std::shared_ptr<Communicator> shared_communicator, const SessionOptions& options,
       const DataParallelOptions& parallel)
      : communicator(std::move(shared_communicator)),
        optimizer(optimizer_config),
        // The gradient program is built first: it creates the parameters and initialises them
        // as the forward graph says, as add_training's single program would.
        gradients(gradient_graph(graph, loss), options),
        update(update_graph(graph, optimizer_config, communicator->size()), options),
        buckets(make_buckets(graph, std::max<size_t>(parallel.bucket_bytes, sizeof(float)))) {
    const Switches switches = options.switches ? *options.switches : Switches::from_environment();
    if (switches.overlap_reduction.value_or(parallel.overlap) && communicator->size() > 1)
      cut_gradient_program();
  }

  // One segment of the gradient program ends where a bucket's last gradient is final.
  void cut_gradient_program() {
    std::vector<size_t> ends;
    for (const Bucket& bucket : buckets) {
      std::optional<size_t> ready;
      for (const Bucket::Entry& entry : bucket.entries) {
        const std::optional<size_t> entry_ready = gradients.output_ready_after(entry.name);
        if (entry_ready) ready = std::max(ready.value_or(0), *entry_ready);
      }
      if (ready) ends.push_back(*ready);
    }
    std::sort(ends.begin(), ends.end());
    ends.erase(std::unique(ends.begin(), ends.end()), ends.end());
    gradients.set_segments(ends);
    for (Bucket& bucket : buckets) {
      for (const Bucket::Entry& entry : bucket.entries)
        bucket.segment = std::max(bucket.segment, gradients.output_segment(entry.name));
    }
  }

  void stage_and_start_sum(size_t index) {
    Bucket& bucket = buckets[index];
    for (const Bucket::Entry& entry : bucket.entries) {
      const std::span<const float> gradient = gradients.f32_output(entry.name);
      std::copy(gradient.begin(), gradient.end(),
                bucket.values.begin() + static_cast<std::ptrdiff_t>(entry.offset));
    }
    communicator->start_sum(bucket.values);
    events.push_back({StepEvent::Kind::sum_started, index});
  }

  // Runs the gradient program a segment at a time, one segment queued behind the one the host
  // waits for so that the GPU does not idle, and starts each bucket's sum once the segments up
  // to its own have finished. Every rank starts the sums in bucket order.
  void run_segments_and_start_sums() {
    const size_t segments = gradients.segment_count();
    const auto submit = [&](size_t segment) {
      gradients.submit_segment(segment);
      events.push_back({StepEvent::Kind::segment_submitted, segment});
    };
    submit(0);
    if (segments > 1) submit(1);
    size_t next_bucket = 0;
    for (size_t segment = 0; segment < segments; ++segment) {
      communicator->progress();
      gradients.wait_segment(segment);
      events.push_back({StepEvent::Kind::segment_finished, segment});
      for (; next_bucket < buckets.size() && buckets[next_bucket].segment <= segment;
           ++next_bucket) {
        stage_and_start_sum(next_bucket);
        if (segment + 1 < segments) ++times.sums_started_during_backward;
      }
      if (segment + 2 < segments) submit(segment + 2);
      communicator->progress();
    }
  }

  std::shared_ptr<Communicator> communicator;
  OptimizerConfig optimizer;
  Session gradients;
  Session update;
  std::vector<Bucket> buckets;
  double loss = 0;
  StepTimes times;
  std::vector<StepEvent> events;
};

DataParallelTrainer::DataParallelTrainer(const Graph& graph, ValueId loss,
                                         const OptimizerConfig& optimizer,
                                         std::shared_ptr<Communicator> communicator,
                                         SessionOptions options, DataParallelOptions parallel) {
  if (!communicator) throw Error("DataParallelTrainer needs a communicator");
  if (optimizer.loss_scaling)
    throw Error(
        "loss scaling is not supported in data-parallel training yet: turn it off "
        "(--loss-scale off) or train on one device");
  impl_ = std::make_unique<Impl>(graph, loss, optimizer, std::move(communicator),
                                 with_shared_tensors(std::move(options)), parallel);
}

DataParallelTrainer::~DataParallelTrainer() = default;

void DataParallelTrainer::set_input(std::string_view name, std::span<const float> values) {
  impl_->gradients.set_input(name, values);
}

void DataParallelTrainer::set_input(std::string_view name, std::span<const int32_t> values) {
  impl_->gradients.set_input(name, values);
}

bool DataParallelTrainer::has_input(std::string_view name) const {
  return impl_->gradients.has_input(name);
}

void DataParallelTrainer::step(int64_t step) {
  Impl& impl = *impl_;
  impl.events.clear();
  impl.times = {};
  auto start = std::chrono::steady_clock::now();
  if (impl.gradients.segment_count() > 0) {
    impl.run_segments_and_start_sums();
    impl.times.segments = impl.gradients.segment_count();
    impl.times.gradients_ms = milliseconds_since(start);
    start = std::chrono::steady_clock::now();
  } else {
    impl.gradients.run();
    impl.times.gradients_ms = milliseconds_since(start);
    start = std::chrono::steady_clock::now();
    // Each bucket's sum starts as soon as it is staged, while the next ones are copied out.
    for (size_t bucket = 0; bucket < impl.buckets.size(); ++bucket)
      impl.stage_and_start_sum(bucket);
  }
  double loss = impl.gradients.scalar_output("loss");
  impl.communicator->sum(std::span(&loss, 1));
  impl.loss = loss / impl.communicator->size();
  impl.communicator->wait_all();
  for (const Bucket& bucket : impl.buckets) {
    for (const Bucket::Entry& entry : bucket.entries) {
      impl.update.set_input(entry.name,
                            std::span(bucket.values).subspan(entry.offset, entry.count));
    }
  }
  impl.times.reduction_ms = milliseconds_since(start);

  start = std::chrono::steady_clock::now();
  for (const auto& [name, value] : optimizer_inputs(impl.optimizer, step)) {
    if (impl.update.has_input(name))
      impl.update.set_input(name, std::vector<float>{static_cast<float>(value)});
  }
  impl.update.run();
  impl.times.update_ms = milliseconds_since(start);
}

double DataParallelTrainer::loss() const {
  return impl_->loss;
}

std::vector<float> DataParallelTrainer::output(std::string_view name) const {
  return impl_->gradients.output(name);
}

Session& DataParallelTrainer::state() {
  return impl_->update;
}

Session& DataParallelTrainer::gradient_program() {
  return impl_->gradients;
}

const BuildReport& DataParallelTrainer::report() const {
  return impl_->gradients.report();
}

Communicator& DataParallelTrainer::communicator() const {
  return *impl_->communicator;
}

void DataParallelTrainer::broadcast_state(int root) {
  Communicator& communicator = *impl_->communicator;
  if (communicator.size() == 1) return;
  for (const std::string& name : impl_->update.persistent_names()) {
    std::vector<float> values = impl_->update.read(name);
    communicator.broadcast(std::as_writable_bytes(std::span(values)), root);
    if (communicator.rank() != root) impl_->update.write(name, values);
  }
}

DataParallelTrainer::StepTimes DataParallelTrainer::last_step_times() const {
  return impl_->times;
}

std::vector<DataParallelTrainer::StepEvent> DataParallelTrainer::last_step_events() const {
  return impl_->events;
}

}  // namespace mg
