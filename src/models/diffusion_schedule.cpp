#include "models/diffusion_schedule.hpp"

#include <algorithm>
#include <cmath>

#include "meganeura/error.hpp"

namespace mg::models {
namespace {

// sqrt((1 - alpha_bar) / alpha_bar) at a fractional timestep, interpolated linearly as
// EulerDiscreteScheduler does with np.interp.
double sigma_at(const NoiseSchedule& schedule, double timestep) {
  const auto sigma = [&](int64_t t) {
    const double alpha = schedule.alphas_cumprod[t];
    return std::sqrt((1 - alpha) / alpha);
  };
  const int64_t low =
      std::clamp<int64_t>(static_cast<int64_t>(std::floor(timestep)), 0, schedule.timesteps() - 1);
  const int64_t high = std::min(low + 1, schedule.timesteps() - 1);
  const double fraction = timestep - static_cast<double>(low);
  return sigma(low) + (sigma(high) - sigma(low)) * fraction;
}

std::vector<double> euler_timesteps(const NoiseSchedule& schedule, int64_t steps) {
  std::vector<double> timesteps(steps);
  const double last = static_cast<double>(schedule.timesteps() - 1);
  for (int64_t i = 0; i < steps; ++i) {
    timesteps[i] = steps == 1 ? last : last - last * static_cast<double>(i) / (steps - 1);
  }
  return timesteps;
}

}  // namespace

NoiseSchedule scaled_linear_schedule(int64_t timesteps, double beta_start, double beta_end) {
  if (timesteps < 2) throw Error("a noise schedule needs at least 2 timesteps");
  NoiseSchedule schedule;
  double product = 1;
  const double start = std::sqrt(beta_start), end = std::sqrt(beta_end);
  for (int64_t t = 0; t < timesteps; ++t) {
    const double root = start + (end - start) * static_cast<double>(t) / (timesteps - 1);
    product *= 1 - root * root;
    schedule.alphas_cumprod.push_back(product);
  }
  return schedule;
}

Sampler parse_sampler(std::string_view name) {
  if (name == "ddim") return Sampler::ddim;
  if (name == "euler") return Sampler::euler;
  throw Error("unknown sampler '" + std::string(name) + "' (ddim or euler)");
}

std::string_view sampler_name(Sampler sampler) {
  return sampler == Sampler::ddim ? "ddim" : "euler";
}

std::vector<SamplerStep> sampler_steps(const NoiseSchedule& schedule, Sampler sampler,
                                       int64_t steps) {
  if (steps < 1 || steps > schedule.timesteps()) {
    throw Error("--steps must be between 1 and " + std::to_string(schedule.timesteps()) + ", got " +
                std::to_string(steps));
  }
  std::vector<SamplerStep> result;
  if (sampler == Sampler::ddim) {
    const int64_t ratio = schedule.timesteps() / steps;
    constexpr int64_t kStepsOffset = 1;
    for (int64_t i = steps - 1; i >= 0; --i) {
      const int64_t t = std::min(i * ratio + kStepsOffset, schedule.timesteps() - 1);
      const int64_t previous = t - ratio;
      const double alpha = schedule.alphas_cumprod[t];
      // set_alpha_to_one = false: the last step lands on alpha_bar of timestep 0.
      const double alpha_previous =
          previous >= 0 ? schedule.alphas_cumprod[previous] : schedule.alphas_cumprod[0];
      SamplerStep step;
      step.timestep = static_cast<double>(t);
      step.sample_scale = std::sqrt(alpha_previous / alpha);
      step.noise_scale = std::sqrt(1 - alpha_previous) -
                         std::sqrt(alpha_previous) * std::sqrt(1 - alpha) / std::sqrt(alpha);
      result.push_back(step);
    }
    return result;
  }
  const std::vector<double> timesteps = euler_timesteps(schedule, steps);
  for (int64_t i = 0; i < steps; ++i) {
    const double sigma = sigma_at(schedule, timesteps[i]);
    const double next = i + 1 < steps ? sigma_at(schedule, timesteps[i + 1]) : 0.0;
    SamplerStep step;
    step.timestep = timesteps[i];
    step.input_scale = 1 / std::sqrt(sigma * sigma + 1);
    step.noise_scale = next - sigma;
    result.push_back(step);
  }
  return result;
}

double initial_noise_scale(const NoiseSchedule& schedule, Sampler sampler, int64_t steps) {
  if (sampler == Sampler::ddim) return 1.0;
  return sigma_at(schedule, euler_timesteps(schedule, steps).front());
}

}  // namespace mg::models
