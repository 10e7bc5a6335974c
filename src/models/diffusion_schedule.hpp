#pragma once
// The noise schedule Stable Diffusion trains with (DDPM, "scaled_linear" betas) and the per-step
// constants of two samplers over it, as diffusers' DDIMScheduler (eta 0, Stable Diffusion's
// steps_offset 1 and set_alpha_to_one false, "leading" spacing) and EulerDiscreteScheduler
// ("linspace" spacing, no churn) compute them. Both samplers' updates are linear in the sample
// and the predicted noise, so one step is four numbers (SamplerStep).
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace mg::models {

struct NoiseSchedule {
  std::vector<double> alphas_cumprod;  // one per training timestep
  int64_t timesteps() const { return static_cast<int64_t>(alphas_cumprod.size()); }
};

// betas = linspace(sqrt(beta_start), sqrt(beta_end), timesteps)^2 (Stable Diffusion's defaults).
NoiseSchedule scaled_linear_schedule(int64_t timesteps = 1000, double beta_start = 0.00085,
                                     double beta_end = 0.012);

enum class Sampler { ddim, euler };
Sampler parse_sampler(std::string_view name);  // "ddim" or "euler"; throws mg::Error otherwise
std::string_view sampler_name(Sampler sampler);

// One denoising step: the model sees sample * input_scale at `timestep`, and the next sample is
// sample * sample_scale + predicted_noise * noise_scale.
struct SamplerStep {
  double timestep = 0;
  double input_scale = 1;
  double sample_scale = 1;
  double noise_scale = 0;
};

// The `steps` steps of `sampler` from pure noise to a clean sample; throws mg::Error when steps
// is not in [1, schedule timesteps].
std::vector<SamplerStep> sampler_steps(const NoiseSchedule& schedule, Sampler sampler,
                                       int64_t steps);
// What the initial standard-normal noise is multiplied by (diffusers' init_noise_sigma).
double initial_noise_scale(const NoiseSchedule& schedule, Sampler sampler, int64_t steps);

}  // namespace mg::models
