#include "backends/vulkan/runtime/shader_compiler.hpp"

#include <glslang/Public/ResourceLimits.h>
#include <glslang/Public/ShaderLang.h>
#include <glslang/SPIRV/GlslangToSpv.h>
#include <glslang/build_info.h>
#include <spirv-tools/libspirv.hpp>

#include <algorithm>
#include <cctype>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "backends/vulkan/runtime/spirv_bfloat16.hpp"
#include "backends/vulkan/runtime/spirv_cooperative_matrix.hpp"
#include "backends/vulkan/runtime/vulkan_api.hpp"
#include "meganeura/error.hpp"

namespace mg::gpu {
namespace detail {
namespace {

struct Target {
  glslang::EShTargetClientVersion client;
  glslang::EShTargetLanguageVersion spirv;
  spv_target_env validator_env;
  const char* name;
};

Target target_for(uint32_t vulkan_api_version) {
  if (vulkan_api_version >= VK_API_VERSION_1_3)
    return {glslang::EShTargetVulkan_1_3, glslang::EShTargetSpv_1_6, SPV_ENV_VULKAN_1_3,
            "vulkan1.3"};
  if (vulkan_api_version >= VK_API_VERSION_1_2)
    return {glslang::EShTargetVulkan_1_2, glslang::EShTargetSpv_1_5, SPV_ENV_VULKAN_1_2,
            "vulkan1.2"};
  return {glslang::EShTargetVulkan_1_1, glslang::EShTargetSpv_1_3, SPV_ENV_VULKAN_1_1, "vulkan1.1"};
}

void initialize_glslang() {
  // glslang's process-wide tables are built once; after that compiles may run in parallel.
  static std::once_flag once;
  std::call_once(once, [] { glslang::InitializeProcess(); });
}

// glslang builds its built-in symbol tables for a (version, stage, target) on the first parse,
// under a process-wide lock; a parse of an empty kernel builds them.
void parse_empty_kernel(uint32_t vulkan_api_version) {
  initialize_glslang();
  const Target target = target_for(vulkan_api_version);
  const char* text = "#version 450\nlayout(local_size_x = 1) in;\nvoid main() {}\n";
  glslang::TShader shader(EShLangCompute);
  shader.setStrings(&text, 1);
  shader.setEnvInput(glslang::EShSourceGlsl, EShLangCompute, glslang::EShClientVulkan, 100);
  shader.setEnvClient(glslang::EShClientVulkan, target.client);
  shader.setEnvTarget(glslang::EShTargetSpv, target.spirv);
  shader.parse(GetDefaultResources(), 450, false,
               static_cast<EShMessages>(EShMsgSpvRules | EShMsgVulkanRules));
}

// Joined at exit, before glslang's own statics go.
struct CompilerPreparation {
  std::thread thread;
  ~CompilerPreparation() {
    if (thread.joinable()) thread.join();
  }
};

bool is_identifier(const std::string& name) {
  if (name.empty() || std::isdigit(static_cast<unsigned char>(name[0]))) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
  });
}

std::string describe_defines(const KernelSpec& spec) {
  if (spec.defines.empty()) return "no defines";
  std::string out = "defines:";
  for (const auto& [name, value] : spec.defines) out += " " + name + "=" + value;
  return out;
}

void check_defines(const KernelSpec& spec) {
  for (const auto& [name, value] : spec.defines) {
    if (!is_identifier(name))
      throw Error("kernel '" + spec.label + "': define name \"" + name + "\" is not an identifier");
    if (value.find('\n') != std::string::npos)
      throw Error("kernel '" + spec.label + "': define " + name + " has a line break in its value");
  }
}

// The LINE of each "ERROR: SOURCE:LINE:" report in glslang's `log`.
std::set<size_t> error_lines(const std::string& log) {
  const std::string marker = "ERROR: ";
  std::set<size_t> numbers;
  for (size_t at = log.find(marker); at != std::string::npos; at = log.find(marker, at + 1)) {
    size_t end = at + marker.size();
    // Digits from `end`, then ':'; the digits' start, or npos where the text is not so.
    const auto number_then_colon = [&]() -> size_t {
      const size_t start = end;
      while (end < log.size() && std::isdigit(static_cast<unsigned char>(log[end]))) ++end;
      if (end == start || end >= log.size() || log[end] != ':') return std::string::npos;
      ++end;
      return start;
    };
    if (number_then_colon() == std::string::npos) continue;
    const size_t line = number_then_colon();
    if (line != std::string::npos) numbers.insert(std::stoul(log.substr(line, end - 1 - line)));
  }
  return numbers;
}

// glslang reports "ERROR: 0:LINE: message"; this shows each such line of the compiled text.
std::string offending_lines(const std::string& log, const std::string& text) {
  const std::set<size_t> numbers = error_lines(log);
  if (numbers.empty()) return "";

  std::vector<std::string> lines;
  std::istringstream stream(text);
  for (std::string line; std::getline(stream, line);) lines.push_back(line);
  std::string out = "\nat:";
  for (size_t number : numbers)
    if (number >= 1 && number <= lines.size())
      out += "\n  " + std::to_string(number) + " | " + lines[number - 1];
  return out;
}

std::string trimmed(std::string text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
  return text;
}

void validate_spirv(const KernelSpec& spec, const std::vector<uint32_t>& spirv, Target target) {
  spvtools::SpirvTools tools(target.validator_env);
  std::string messages;
  tools.SetMessageConsumer(
      [&messages](spv_message_level_t, const char*, const spv_position_t&, const char* message) {
        messages += std::string("\n  ") + message;
      });
  if (!tools.Validate(spirv))
    throw Error("kernel '" + spec.label + "' (" + describe_defines(spec) +
                    ") compiled to invalid SPIR-V:" + messages,
                Error::Kind::shader_compile);
}

}  // namespace

std::string full_source(const KernelSpec& spec) {
  std::string text = "#version 450\n";
  for (const auto& [name, value] : spec.defines) text += "#define " + name + " " + value + "\n";
  text += spec.source;
  return text;
}

std::string compiler_identity(uint32_t vulkan_api_version) {
  return "glslang " + std::to_string(GLSLANG_VERSION_MAJOR) + "." +
         std::to_string(GLSLANG_VERSION_MINOR) + "." + std::to_string(GLSLANG_VERSION_PATCH) +
         GLSLANG_VERSION_FLAVOR + " " + target_for(vulkan_api_version).name;
}

std::vector<uint32_t> compile_to_spirv(const KernelSpec& spec, uint32_t vulkan_api_version,
                                       bool validate) {
  check_defines(spec);
  initialize_glslang();
  const Target target = target_for(vulkan_api_version);
  const std::string text = full_source(spec);
  const char* strings[] = {text.c_str()};

  glslang::TShader shader(EShLangCompute);
  shader.setStrings(strings, 1);  // unnamed, so errors read "ERROR: 0:LINE:"
  shader.setEnvInput(glslang::EShSourceGlsl, EShLangCompute, glslang::EShClientVulkan, 100);
  shader.setEnvClient(glslang::EShClientVulkan, target.client);
  shader.setEnvTarget(glslang::EShTargetSpv, target.spirv);
  const auto messages = static_cast<EShMessages>(EShMsgSpvRules | EShMsgVulkanRules);
  if (!shader.parse(GetDefaultResources(), 450, false, messages)) {
    std::string log = shader.getInfoLog();
    throw Error("kernel '" + spec.label + "' (" + describe_defines(spec) + ") does not compile:\n" +
                    trimmed(log) + offending_lines(log, text),
                Error::Kind::shader_compile);
  }

  glslang::TProgram program;
  program.addShader(&shader);
  if (!program.link(messages))
    throw Error("kernel '" + spec.label + "' (" + describe_defines(spec) + ") does not link:\n" +
                    trimmed(program.getInfoLog()),
                Error::Kind::shader_compile);

  std::vector<uint32_t> spirv;
  spv::SpvBuildLogger logger;
  glslang::SpvOptions options;  // no optimizer: drivers optimize, and compiles stay fast
  glslang::GlslangToSpv(*program.getIntermediate(EShLangCompute), spirv, &logger, &options);
  if (spirv.empty())
    throw Error("kernel '" + spec.label + "' (" + describe_defines(spec) +
                    "): SPIR-V generation failed:\n" + trimmed(logger.getAllMessages()),
                Error::Kind::shader_compile);
  if (validate) validate_spirv(spec, spirv, target);
  // The rewrite runs after validation: Debian's SPIRV-Tools (2023.1) predates the KHR
  // extension and rejects its opcodes, so the NV form is what gets checked.
  if (!spec.khr_cooperative_matrix) return spirv;
  spirv = nv_to_khr_cooperative_matrix(spirv);
  if (spec.bf16_operands)
    spirv = f16_operands_to_bf16(
        spirv, spec.bf16_buffers ? HalfBuffers::hold_bfloat16 : HalfBuffers::refused);
  if (spec.matrix_loads == MatrixLoads::plain) return spirv;
  return khr_loads_to_tensor_loads(spirv, spec.matrix_loads);
}

}  // namespace detail

std::vector<uint32_t> compile_glsl(const KernelSpec& spec) {
  return detail::compile_to_spirv(spec, VK_API_VERSION_1_1, true);
}

void prepare_shader_compiler() {
  static detail::CompilerPreparation preparation;
  static std::once_flag once;
  std::call_once(once, [] {
    preparation.thread = std::thread([] { detail::parse_empty_kernel(VK_API_VERSION_1_3); });
  });
}

}  // namespace mg::gpu
