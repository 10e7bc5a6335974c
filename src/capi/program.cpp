// The C API's programs (include/meganeura/meganeura.h): building one from a classifier config, a
// checkpoint or a Llama model folder, its tensors, runs, training steps and saving.
#include <cstring>

#include "capi/handles.hpp"
#include "io/checkpoint.hpp"
#include "io/model_folder.hpp"
#include "ir/op_names.hpp"
#include "runtime/llama_runtime.hpp"

namespace mg::capi {
namespace {

constexpr const char* kOptimizerPrefix = "optimizer.";

mg_program_options default_options() {
  mg_program_options options{};
  options.struct_size = sizeof(mg_program_options);
  options.kind = MG_PROGRAM_INFERENCE;
  options.batch = 1;
  options.sequence_length = 16;
  options.learning_rate = 1e-3;
  return options;
}

// The app's options over the defaults; an older, shorter struct keeps the newer fields' defaults.
mg_program_options checked_options(const mg_program_options* given) {
  mg_program_options options = default_options();
  if (given == nullptr) return options;
  if (given->struct_size == 0 || given->struct_size > sizeof(mg_program_options))
    fail(MG_ERROR_INVALID_ARGUMENT, "options->struct_size is " +
                                        std::to_string(given->struct_size) +
                                        ": fill the options with mg_program_options_init first");
  std::memcpy(&options, given, given->struct_size);
  if (options.kind != MG_PROGRAM_INFERENCE && options.kind != MG_PROGRAM_TRAINING)
    fail(MG_ERROR_INVALID_ARGUMENT, "options->kind is neither MG_PROGRAM_INFERENCE nor TRAINING");
  if (options.batch < 1 || options.sequence_length < 1)
    fail(MG_ERROR_INVALID_ARGUMENT, "options->batch and options->sequence_length must be >= 1");
  if (options.share_parameters != 0 && options.share_parameters != 1)
    fail(MG_ERROR_INVALID_ARGUMENT, "options->share_parameters must be 0 or 1");
  if (!(options.learning_rate > 0))
    fail(MG_ERROR_INVALID_ARGUMENT, "options->learning_rate must be > 0");
  return options;
}

SessionOptions session_options(const mg_device& device, const mg_program_options& options,
                               bool initialise_parameters) {
  SessionOptions session;
  session.shared_device = device.shared;
  if (options.share_parameters) session.shared_tensors = device.tensors;
  session.seed = options.seed;
  session.initialise_parameters = initialise_parameters;
  try {
    session.precision = parse_precision(options.precision ? options.precision : "strict");
  } catch (const Error& error) {
    fail(MG_ERROR_INVALID_ARGUMENT, std::string("options->precision: ") + error.what());
  }
  return session;
}

OptimizerConfig optimizer_of(const mg_program_options& options) {
  OptimizerConfig optimizer;
  try {
    optimizer.kind = parse_optimizer(options.optimizer ? options.optimizer : "adam");
  } catch (const Error& error) {
    fail(MG_ERROR_INVALID_ARGUMENT, std::string("options->optimizer: ") + error.what());
  }
  optimizer.learning_rate = options.learning_rate;
  return optimizer;
}

// Builds the session of `graph` and lists the tensors an app sees.
void finish_program(mg_program& program, const mg_device& device, const Graph& graph,
                    const mg_program_options& options, bool initialise_parameters) {
  program.device = device.shared;
  program.kind = options.kind;
  program.session =
      std::make_unique<Session>(graph, session_options(device, options, initialise_parameters));
  for (ValueId input : graph.leaves(op::input)) {
    const std::string& name = graph.node(input).name;
    if (name.rfind(kOptimizerPrefix, 0) != 0)
      program.tensors[MG_TENSOR_INPUT].push_back({name, graph.type(input)});
  }
  for (const auto& [name, value] : graph.outputs())
    program.tensors[MG_TENSOR_OUTPUT].push_back({name, graph.type(value)});
  for (const std::string& name : program.session->persistent_names())
    program.tensors[MG_TENSOR_PARAMETER].push_back({name, program.session->leaf_type(name)});
}

const mg_program::Tensor& tensor(const mg_program& program, mg_tensor_role role, const char* name) {
  require(name, "name");
  for (const mg_program::Tensor& entry : program.tensors[role])
    if (entry.name == name) return entry;
  static const char* const roles[] = {"input", "output", "parameter"};
  std::string known;
  for (const mg_program::Tensor& entry : program.tensors[role])
    known += (known.empty() ? "" : ", ") + entry.name;
  fail(MG_ERROR_INVALID_ARGUMENT, std::string("the program has no ") + roles[role] + " '" + name +
                                      "' (" + roles[role] + "s: " + known + ")");
}

void check_count(const mg_program::Tensor& entry, size_t count) {
  if (static_cast<int64_t>(count) != entry.type.elements())
    fail(MG_ERROR_INVALID_ARGUMENT, "'" + entry.name + "' is " + type_string(entry.type) + " (" +
                                        std::to_string(entry.type.elements()) +
                                        " values) but the call passes " + std::to_string(count));
}

void load_classifier_checkpoint(mg_program& program, const char* path) {
  require(path, "path");
  const io::Checkpoint checkpoint = io::load_checkpoint(path);
  io::check_same_model(program.classifier->to_json(), checkpoint.model_config, path);
  const bool with_state = program.kind == MG_PROGRAM_TRAINING;
  for (const mg_program::Tensor& entry : program.tensors[MG_TENSOR_PARAMETER]) {
    if (entry.name.rfind(kOptimizerPrefix, 0) == 0 && !with_state) continue;
    const io::TensorRecord* record = checkpoint.find(entry.name);
    if (record == nullptr)
      throw Error("checkpoint " + std::string(path) + " has no tensor '" + entry.name + "'");
    if (record->dtype != DType::f32 || record->shape != entry.type.shape)
      throw Error("checkpoint " + std::string(path) + ": tensor '" + entry.name + "' is " +
                  std::string(dtype_name(record->dtype)) + shape_string(record->shape) +
                  " but the program expects " + type_string(entry.type));
    std::vector<float> values(static_cast<size_t>(entry.type.elements()));
    std::memcpy(values.data(), record->bytes.data(), values.size() * sizeof(float));
    program.session->write(entry.name, values);
  }
  if (with_state) program.steps = checkpoint.step;
}

mg_program* create_classifier(mg_device* device, const models::ClassifierConfig& config,
                              const mg_program_options& options) {
  auto program = std::make_unique<mg_program>();
  program->classifier = config;
  program->optimizer = optimizer_of(options);
  const Graph graph =
      options.kind == MG_PROGRAM_TRAINING
          ? models::build_classifier_training(config, options.batch, program->optimizer)
          : models::build_classifier(config, options.batch);
  finish_program(*program, *device, graph, options, true);
  return program.release();
}

}  // namespace

void refuse_during_chunked_run(const mg_program& program, const char* call) {
  if (program.chunked_run_under_way)
    fail(MG_ERROR_INVALID_STATE, std::string(call) +
                                     " during a chunked run: call mg_program_run_chunk (or "
                                     "_record_chunk) until it reports the run finished");
}

void prepare_step(mg_program& program) {
  if (program.kind != MG_PROGRAM_TRAINING) return;
  for (const auto& [name, value] : optimizer_inputs(program.optimizer, program.steps)) {
    const float single = static_cast<float>(value);
    if (program.session->has_input(name)) program.session->set_input(name, std::span(&single, 1));
  }
}

}  // namespace mg::capi

using namespace mg::capi;

extern "C" {

mg_status mg_program_options_init(mg_program_options* options) {
  return guarded([&] {
    require(options, "options");
    *options = default_options();
  });
}

mg_status mg_program_create_classifier(mg_device* device, const char* config_json,
                                       const mg_program_options* options, mg_program** program) {
  return guarded([&] {
    require(program, "program (the result pointer)");
    *program = nullptr;
    require(device, "device");
    const mg_program_options checked = checked_options(options);
    mg::models::ClassifierConfig config;
    if (config_json != nullptr) {
      try {
        config = mg::models::ClassifierConfig::from_json(nlohmann::json::parse(config_json));
      } catch (const std::exception& error) {
        fail(MG_ERROR_INVALID_ARGUMENT, std::string("config_json: ") + error.what());
      }
    }
    *program = create_classifier(device, config, checked);
  });
}

mg_status mg_program_create_from_checkpoint(mg_device* device, const char* path,
                                            const mg_program_options* options,
                                            mg_program** program) {
  return guarded([&] {
    require(program, "program (the result pointer)");
    *program = nullptr;
    require(device, "device");
    require(path, "path");
    const mg_program_options checked = checked_options(options);
    const auto config =
        mg::models::ClassifierConfig::from_json(mg::io::load_checkpoint(path).model_config);
    std::unique_ptr<mg_program> created(create_classifier(device, config, checked));
    load_classifier_checkpoint(*created, path);
    *program = created.release();
  });
}

mg_status mg_program_create_from_model_folder(mg_device* device, const char* folder,
                                              const mg_program_options* options,
                                              mg_program** program) {
  return guarded([&] {
    require(program, "program (the result pointer)");
    *program = nullptr;
    require(device, "device");
    require(folder, "folder");
    const mg_program_options checked = checked_options(options);
    auto created = std::make_unique<mg_program>();
    const mg::models::LlamaConfig config = mg::models::load_llama_config(folder);
    const mg::io::ModelFolder weights = mg::io::ModelFolder::open(folder);
    mg::models::check_llama_weights(weights, config);
    created->llama = config;
    created->llama_config_json = weights.config();
    created->optimizer = optimizer_of(checked);
    mg::Graph graph =
        checked.kind == MG_PROGRAM_TRAINING
            ? mg::models::llama_loss_graph(config, checked.batch, checked.sequence_length)
            : mg::models::llama_logits_graph(config, checked.batch, checked.sequence_length);
    if (checked.kind == MG_PROGRAM_TRAINING)
      mg::add_training(graph, graph.output(mg::models::kLoss), created->optimizer);
    finish_program(*created, *device, graph, checked, false);
    mg::models::load_llama_weights(*created->session, weights, config);
    *program = created.release();
  });
}

mg_status mg_program_release(mg_program* program) {
  return guarded([&] { delete program; });
}

mg_status mg_program_tensor_count(const mg_program* program, mg_tensor_role role, size_t* count) {
  return guarded([&] {
    require(program, "program");
    require(count, "count");
    if (role < MG_TENSOR_INPUT || role > MG_TENSOR_PARAMETER)
      fail(MG_ERROR_INVALID_ARGUMENT, "role is not an mg_tensor_role");
    *count = program->tensors[role].size();
  });
}

mg_status mg_program_tensor_name(const mg_program* program, mg_tensor_role role, size_t index,
                                 const char** name) {
  return guarded([&] {
    require(program, "program");
    require(name, "name");
    if (role < MG_TENSOR_INPUT || role > MG_TENSOR_PARAMETER)
      fail(MG_ERROR_INVALID_ARGUMENT, "role is not an mg_tensor_role");
    if (index >= program->tensors[role].size())
      fail(MG_ERROR_INVALID_ARGUMENT, "index " + std::to_string(index) + " is past the " +
                                          std::to_string(program->tensors[role].size()) +
                                          " tensors of that role");
    *name = program->tensors[role][index].name.c_str();
  });
}

mg_status mg_program_tensor_info(const mg_program* program, const char* name,
                                 mg_tensor_info* info) {
  return guarded([&] {
    require(program, "program");
    require(name, "name");
    require(info, "info");
    for (const auto& role : program->tensors) {
      for (const mg_program::Tensor& entry : role) {
        if (entry.name != name) continue;
        mg_tensor_info result{};
        result.dtype = entry.type.dtype == mg::DType::i32    ? MG_DTYPE_I32
                       : entry.type.dtype == mg::DType::f16  ? MG_DTYPE_F16
                       : entry.type.dtype == mg::DType::bf16 ? MG_DTYPE_BF16
                                                             : MG_DTYPE_F32;
        result.rank = static_cast<uint32_t>(entry.type.shape.size());
        if (result.rank > MG_MAX_RANK)
          fail(MG_ERROR_INVALID_ARGUMENT, "'" + entry.name + "' has more than MG_MAX_RANK axes");
        for (uint32_t axis = 0; axis < result.rank; ++axis)
          result.shape[axis] = entry.type.shape[axis];
        result.elements = entry.type.elements();
        *info = result;
        return;
      }
    }
    fail(MG_ERROR_INVALID_ARGUMENT, std::string("the program has no tensor '") + name + "'");
  });
}

mg_status mg_program_set_input(mg_program* program, const char* name, mg_dtype dtype,
                               const void* data, size_t count) {
  return guarded([&] {
    require(program, "program");
    const mg_program::Tensor& entry = tensor(*program, MG_TENSOR_INPUT, name);
    require(data, "data");
    check_count(entry, count);
    const bool integer = entry.type.dtype == mg::DType::i32;
    if ((integer && dtype != MG_DTYPE_I32) || (!integer && dtype != MG_DTYPE_F32))
      fail(MG_ERROR_INVALID_ARGUMENT, "input '" + entry.name + "' is " + type_string(entry.type) +
                                          ": pass " + (integer ? "MG_DTYPE_I32" : "MG_DTYPE_F32") +
                                          " data");
    // An input the program does not read was pruned from it: nothing to set.
    if (!program->session->has_input(entry.name)) return;
    if (integer)
      program->session->set_input(entry.name, std::span(static_cast<const int32_t*>(data), count));
    else
      program->session->set_input(entry.name, std::span(static_cast<const float*>(data), count));
  });
}

mg_status mg_program_run(mg_program* program) {
  return guarded([&] {
    require(program, "program");
    refuse_during_chunked_run(*program, "mg_program_run");
    prepare_step(*program);
    program->session->run();
    program->run_in_flight = false;
    program->has_outputs = true;
    if (program->kind == MG_PROGRAM_TRAINING) ++program->steps;
  });
}

mg_status mg_program_train_step(mg_program* program, float* loss) {
  return guarded([&] {
    require(program, "program");
    if (program->kind != MG_PROGRAM_TRAINING)
      fail(MG_ERROR_INVALID_STATE,
           "mg_program_train_step on an inference program: create it with kind "
           "MG_PROGRAM_TRAINING");
    refuse_during_chunked_run(*program, "mg_program_train_step");
    prepare_step(*program);
    program->session->run();
    program->run_in_flight = false;
    program->has_outputs = true;
    ++program->steps;
    if (loss != nullptr) *loss = program->session->scalar_output(mg::models::kLoss);
  });
}

mg_status mg_program_step_count(const mg_program* program, int64_t* steps) {
  return guarded([&] {
    require(program, "program");
    require(steps, "steps");
    *steps = program->steps;
  });
}

mg_status mg_program_start(mg_program* program) {
  return guarded([&] {
    require(program, "program");
    refuse_during_chunked_run(*program, "mg_program_start");
    prepare_step(*program);
    program->session->start_run();
    program->run_in_flight = true;
    program->has_outputs = true;
    if (program->kind == MG_PROGRAM_TRAINING) ++program->steps;
  });
}

mg_status mg_program_wait(mg_program* program) {
  return guarded([&] {
    require(program, "program");
    program->session->finish_run();
    program->run_in_flight = false;
  });
}

mg_status mg_program_get_output(mg_program* program, const char* name, float* data, size_t count) {
  return guarded([&] {
    require(program, "program");
    const mg_program::Tensor& entry = tensor(*program, MG_TENSOR_OUTPUT, name);
    require(data, "data");
    check_count(entry, count);
    if (!program->has_outputs)
      fail(MG_ERROR_INVALID_STATE, "output '" + entry.name + "' read before the first run");
    program->session->finish_run();
    program->run_in_flight = false;
    const std::vector<float> values = program->session->output(entry.name);
    std::memcpy(data, values.data(), values.size() * sizeof(float));
  });
}

mg_status mg_program_read_parameter(mg_program* program, const char* name, float* data,
                                    size_t count) {
  return guarded([&] {
    require(program, "program");
    const mg_program::Tensor& entry = tensor(*program, MG_TENSOR_PARAMETER, name);
    require(data, "data");
    check_count(entry, count);
    const std::vector<float> values = program->session->read(entry.name);
    std::memcpy(data, values.data(), values.size() * sizeof(float));
  });
}

mg_status mg_program_write_parameter(mg_program* program, const char* name, const float* data,
                                     size_t count) {
  return guarded([&] {
    require(program, "program");
    const mg_program::Tensor& entry = tensor(*program, MG_TENSOR_PARAMETER, name);
    require(data, "data");
    check_count(entry, count);
    refuse_during_chunked_run(*program, "mg_program_write_parameter");
    program->session->write(entry.name, std::span(data, count));
  });
}

mg_status mg_program_save(mg_program* program, const char* path) {
  return guarded([&] {
    require(program, "program");
    require(path, "path");
    refuse_during_chunked_run(*program, "mg_program_save");
    mg::Session& session = *program->session;
    if (program->llama) {
      mg::io::save_model_folder(path, program->llama_config_json,
                                mg::models::llama_weights(session, *program->llama));
      return;
    }
    mg::io::Checkpoint checkpoint;
    checkpoint.model_config = program->classifier->to_json();
    checkpoint.step = program->steps;
    checkpoint.optimizer = {{"kind", mg::optimizer_name(program->optimizer.kind)},
                            {"learning_rate", program->optimizer.learning_rate}};
    for (const mg_program::Tensor& entry : program->tensors[MG_TENSOR_PARAMETER]) {
      const std::vector<float> values = session.read(entry.name);
      mg::io::TensorRecord record;
      record.name = entry.name;
      record.shape = entry.type.shape;
      record.bytes.resize(values.size() * sizeof(float));
      std::memcpy(record.bytes.data(), values.data(), record.bytes.size());
      checkpoint.tensors.push_back(std::move(record));
    }
    mg::io::save_checkpoint(path, checkpoint);
  });
}

mg_status mg_program_load(mg_program* program, const char* path) {
  return guarded([&] {
    require(program, "program");
    if (!program->classifier)
      fail(MG_ERROR_INVALID_STATE,
           "mg_program_load reads classifier checkpoints; a language model loads its folder "
           "in mg_program_create_from_model_folder");
    refuse_during_chunked_run(*program, "mg_program_load");
    load_classifier_checkpoint(*program, path);
  });
}

mg_status mg_program_set_chunk_budget(mg_program* program, double budget_ms, size_t* chunks) {
  return guarded([&] {
    require(program, "program");
    if (!(budget_ms >= 0)) fail(MG_ERROR_INVALID_ARGUMENT, "budget_ms must be >= 0");
    refuse_during_chunked_run(*program, "mg_program_set_chunk_budget");
    const size_t count = program->session->set_chunk_budget(budget_ms);
    if (chunks != nullptr) *chunks = count;
  });
}

mg_status mg_program_run_chunk(mg_program* program, int* finished) {
  return guarded([&] {
    require(program, "program");
    require(finished, "finished");
    *finished = 0;
    if (program->session->chunk_count() == 0)
      fail(MG_ERROR_INVALID_STATE, "mg_program_run_chunk needs mg_program_set_chunk_budget first");
    if (!program->chunked_run_under_way) prepare_step(*program);
    program->chunked_run_under_way = true;
    if (!program->session->run_next_chunk()) return;
    program->chunked_run_under_way = false;
    program->has_outputs = true;
    if (program->kind == MG_PROGRAM_TRAINING) ++program->steps;
    *finished = 1;
  });
}

mg_status mg_program_run_transfers(const mg_program* program, size_t* copies, uint64_t* bytes) {
  return guarded([&] {
    require(program, "program");
    const mg::Session::Transfers transfers = program->session->run_transfers();
    if (copies != nullptr) *copies = transfers.copies;
    if (bytes != nullptr) *bytes = transfers.bytes;
  });
}

mg_status mg_program_next_chunk_ms(mg_program* program, double* milliseconds) {
  return guarded([&] {
    require(program, "program");
    require(milliseconds, "milliseconds");
    *milliseconds = program->session->next_chunk_ms();
  });
}

}  // extern "C"
