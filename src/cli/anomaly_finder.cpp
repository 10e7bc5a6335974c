#include "cli/anomaly_finder.hpp"

#include <algorithm>
#include <cmath>
#include <deque>
#include <set>

#include "cli/non_finite_steps.hpp"
#include "ir/op_names.hpp"

namespace mg::cli {

namespace {

std::string output_name(ValueId id) {
  return "anomaly." + std::to_string(id);
}

struct Finiteness {
  int64_t bad = 0;     // elements that are NaN or infinite
  int64_t first = -1;  // index of the first of them
  double first_value = 0;
};

template <typename Value>
Finiteness finiteness(std::span<const Value> values) {
  Finiteness result;
  for (size_t i = 0; i < values.size(); ++i) {
    if (std::isfinite(static_cast<double>(values[i]))) continue;
    if (result.bad++ == 0) {
      result.first = static_cast<int64_t>(i);
      result.first_value = static_cast<double>(values[i]);
    }
  }
  return result;
}

Finiteness constant_finiteness(const Node& node) {
  if (node.data) return finiteness(std::span<const double>(*node.data));
  const double value = node.attrs.get_float("value", 0);
  Finiteness result;
  if (!std::isfinite(value)) result = {node.type.elements(), 0, value};
  return result;
}

// The nearest parameter upstream of `id` (breadth first over its inputs): where in the model a
// node sits, since the graph's intermediate values carry no names.
std::string nearest_parameter(const Graph& graph, ValueId id) {
  std::deque<ValueId> queue{id};
  std::set<ValueId> seen{id};
  while (!queue.empty()) {
    const Node& node = graph.node(queue.front());
    queue.pop_front();
    if (node.op == op::parameter) return node.name;
    for (ValueId input : node.inputs) {
      if (seen.insert(input).second) queue.push_back(input);
    }
  }
  return "";
}

// The values that the training program computes: those its outputs and updates read. Others
// (a parameter that the loss does not reach) are not in the program, nor checked.
std::vector<bool> live_values(const Graph& graph) {
  std::vector<bool> live(graph.size(), false);
  std::vector<ValueId> pending;
  for (const auto& [name, id] : graph.outputs()) pending.push_back(id);
  for (const auto& [target, value] : graph.updates()) pending.push_back(value);
  while (!pending.empty()) {
    const ValueId id = pending.back();
    pending.pop_back();
    if (live[id]) continue;
    live[id] = true;
    for (ValueId input : graph.node(id).inputs) pending.push_back(input);
  }
  return live;
}

std::string describe_value(const Graph& graph, ValueId id) {
  const Node& node = graph.node(id);
  std::string text = "%" + std::to_string(id) + " " + node.op;
  if (!node.name.empty()) text += " '" + node.name + "'";
  return text + " " + type_string(node.type);
}

std::string number_text(double value) {
  return std::isnan(value) ? "nan" : (value > 0 ? "inf" : "-inf");
}

}  // namespace

AnomalyFinder::AnomalyFinder(const Graph& training_graph, const TrainingGraph& training,
                             const SessionOptions& options)
    : graph_(training_graph), loss_(training.loss), options_(options) {
  for (const auto& [parameter, gradient] : training.gradients)
    last_gradient_ = std::max(last_gradient_, gradient);
  // A program of its own: every value kept in its own bytes, parameters copied in.
  options_.shared_tensors = nullptr;
  options_.initialise_parameters = false;
  options_.profile = false;
  options_.time_runs = false;
}

AnomalyFinder::~AnomalyFinder() = default;

void AnomalyFinder::record_input(std::string_view name, std::span<const float> values) {
  float_inputs_[std::string(name)].assign(values.begin(), values.end());
}

void AnomalyFinder::record_input(std::string_view name, std::span<const int32_t> values) {
  int_inputs_[std::string(name)].assign(values.begin(), values.end());
}

std::optional<std::string> AnomalyFinder::find(const PersistentReader& read,
                                               const std::map<std::string, double>& step_inputs) {
  if (!checker_) {
    live_ = live_values(graph_);
    Graph checked = graph_;
    for (ValueId id = 0; id < static_cast<ValueId>(graph_.size()); ++id) {
      if (live_[id] && !graph_.node(id).is_leaf()) checked.set_output(output_name(id), id);
    }
    checker_ = std::make_unique<Session>(checked, options_);
  }
  std::map<std::string, std::vector<float>, std::less<>> persistent;
  for (const std::string& name : checker_->persistent_names()) {
    persistent[name] = read(name);
    checker_->write(name, persistent[name]);
  }
  for (const auto& [name, values] : float_inputs_) checker_->set_input(name, values);
  for (const auto& [name, values] : int_inputs_) checker_->set_input(name, values);
  for (const auto& [name, value] : step_inputs) {
    if (checker_->has_input(name))
      checker_->set_input(name, std::vector<float>{static_cast<float>(value)});
  }
  checker_->run();

  std::vector<bool> non_finite(graph_.size(), false);
  for (ValueId id = 0; id < static_cast<ValueId>(graph_.size()); ++id) {
    if (!live_[id]) continue;
    const Node& node = graph_.node(id);
    Finiteness found;
    if (node.op == op::constant) {
      found = constant_finiteness(node);
    } else if (node.is_leaf()) {
      if (const auto it = persistent.find(node.name); it != persistent.end()) {
        found = finiteness(std::span<const float>(it->second));
      } else if (const auto in = float_inputs_.find(node.name); in != float_inputs_.end()) {
        found = finiteness(std::span<const float>(in->second));
      }
    } else {
      found = finiteness(std::span<const float>(checker_->output(output_name(id))));
    }
    if (found.bad == 0) continue;
    non_finite[id] = true;
    bool from_finite_inputs = node.op != op::constant;
    for (ValueId input : node.inputs) from_finite_inputs = from_finite_inputs && !non_finite[input];
    if (!from_finite_inputs) continue;

    const std::string part = id < loss_             ? "forward"
                             : id == loss_          ? "loss"
                             : id <= last_gradient_ ? "backward"
                                                    : "optimizer update";
    std::string text = "the first non-finite value is " + describe_value(graph_, id) + " (" + part;
    const std::string near = nearest_parameter(graph_, id);
    if (!near.empty() && near != node.name) text += ", near '" + near + "'";
    text += ")";
    if (!node.inputs.empty()) {
      text += " of ";
      for (size_t i = 0; i < node.inputs.size(); ++i)
        text += (i ? ", " : "") + describe_value(graph_, node.inputs[i]);
    }
    return text + ": " + std::to_string(found.bad) + " of " + std::to_string(node.type.elements()) +
           " elements, the first " + number_text(found.first_value) + " at " +
           std::to_string(found.first);
  }
  return std::nullopt;
}

std::string anomaly_text(const std::optional<std::string>& finding) {
  return finding ? *finding
                 : "no value of the step is NaN or infinite when it runs again (a fault that did "
                   "not repeat)";
}

std::string anomaly_text_across_ranks(Communicator& communicator,
                                      const std::optional<std::string>& finding) {
  std::vector<double> found(static_cast<size_t>(communicator.size()), 0.0);
  if (finding) found[static_cast<size_t>(communicator.rank())] = 1.0;
  communicator.sum(found);
  const auto first = std::find(found.begin(), found.end(), 1.0);
  if (first == found.end()) return anomaly_text(std::nullopt);
  const int root = static_cast<int>(first - found.begin());
  std::string text = root == communicator.rank() ? *finding : std::string();
  uint64_t length = text.size();
  communicator.broadcast(std::as_writable_bytes(std::span<uint64_t>(&length, 1)), root);
  text.resize(length);
  communicator.broadcast(std::as_writable_bytes(std::span<char>(text.data(), text.size())), root);
  return "on rank " + std::to_string(root) + " (its share of the batch), " + text;
}

RecordedInputs::RecordedInputs(Session& session, std::unique_ptr<AnomalyFinder> finder)
    : session_(&session), finder_(std::move(finder)) {}

RecordedInputs::~RecordedInputs() = default;

void RecordedInputs::set(std::string_view name, std::span<const float> values) {
  if (finder_) finder_->record_input(name, values);
  session_->set_input(name, values);
}

void RecordedInputs::set(std::string_view name, std::span<const int32_t> values) {
  if (finder_) finder_->record_input(name, values);
  session_->set_input(name, values);
}

void RecordedInputs::set_step(NonFiniteSteps& non_finite, const OptimizerConfig& config,
                              int64_t step) {
  step_inputs_ = non_finite.set_step_inputs(*session_, config, step);
}

std::function<std::string()> RecordedInputs::anomaly() {
  if (!finder_) return {};
  return [this] {
    return anomaly_text(finder_->find(
        [this](const std::string& name) { return session_->read(name); }, step_inputs_));
  };
}

}  // namespace mg::cli
