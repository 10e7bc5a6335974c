#pragma once
// What the C API's opaque handles hold, and the one place C++ exceptions become statuses.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "meganeura/meganeura.h"
#include "meganeura/session.hpp"
#include "meganeura/train.hpp"
#include "models/classifier.hpp"
#include "models/llama.hpp"

struct mg_device {
  std::shared_ptr<mg::SharedDevice> shared;
  // The tensors of programs built with mg_program_options::share_parameters.
  std::shared_ptr<mg::SharedTensors> tensors;
  std::string description;
};

struct mg_program {
  std::shared_ptr<mg::SharedDevice> device;  // keeps the device alive after mg_device_release
  mg_program_kind kind = MG_PROGRAM_INFERENCE;
  // Which builder made the graph: a classifier (config) or a Llama folder (its config.json).
  std::optional<mg::models::ClassifierConfig> classifier;
  std::optional<mg::models::LlamaConfig> llama;
  nlohmann::json llama_config_json;
  mg::OptimizerConfig optimizer;
  int64_t steps = 0;
  struct Tensor {
    std::string name;
    mg::TensorType type;
  };
  // Inputs the app sets (the optimizer's own inputs are set here), outputs, parameters and state.
  std::vector<Tensor> tensors[3];
  std::unique_ptr<mg::Session> session;
  bool run_in_flight = false;
  bool chunked_run_under_way = false;
  bool has_outputs = false;
};

namespace mg::capi {

// An error the C API itself detects, with its status.
struct StatusError {
  mg_status status;
  std::string message;
};

[[noreturn]] void fail(mg_status status, std::string message);

const char* last_error_text();

// Records `message` as this thread's last error and returns `status`.
mg_status set_error(mg_status status, std::string message);

// Runs `body` (returning void), turning every exception into a status and a message.
template <typename Body>
mg_status guarded(Body&& body) noexcept {
  try {
    body();
    return MG_OK;
  } catch (const StatusError& error) {
    return set_error(error.status, error.message);
  } catch (const mg::Error& error) {
    return set_error(MG_ERROR_FAILED, error.what());
  } catch (const std::bad_alloc&) {
    return set_error(MG_ERROR_OUT_OF_MEMORY, "out of host memory");
  } catch (const std::exception& error) {
    return set_error(MG_ERROR_INTERNAL, std::string("internal error: ") + error.what());
  } catch (...) {
    return set_error(MG_ERROR_INTERNAL, "internal error: an unknown exception");
  }
}

// `pointer` is not null, else MG_ERROR_INVALID_ARGUMENT naming `what`.
template <typename Pointer>
void require(Pointer pointer, const char* what) {
  if (pointer == nullptr) fail(MG_ERROR_INVALID_ARGUMENT, std::string(what) + " is NULL");
}

// MG_ERROR_INVALID_STATE naming `call` while a chunked run is under way.
void refuse_during_chunked_run(const mg_program& program, const char* call);

// Sets the optimizer's inputs for the next step of a training program.
void prepare_step(mg_program& program);

}  // namespace mg::capi
