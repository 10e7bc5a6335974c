#include "data/log_mel.hpp"

#include <algorithm>
#include <cmath>
#include <complex>
#include <limits>
#include <numbers>
#include <string>

#include "data/audio.hpp"
#include "data/fft.hpp"
#include "meganeura/error.hpp"

namespace mg::data {
namespace {

// WhisperFeatureExtractor places its mel filters between 0 Hz and 8 kHz whatever the sample rate.
constexpr double kMelMaxHertz = 8000.0;
constexpr double kMelFloor = 1e-10;
// Dynamic range kept below the loudest value, in log10 units (80 dB).
constexpr double kLogRange = 8.0;
// Bounds that keep a corrupt config from asking for absurd allocations.
constexpr int kMaxFft = 1 << 16;
constexpr int kMaxMels = 1024;
constexpr int kMaxChunkSeconds = 3600;

// Slaney's mel scale (librosa's default): linear below 1 kHz, logarithmic above.
constexpr double kLinearMelsPerHertz = 3.0 / 200.0;
constexpr double kLogRegionHertz = 1000.0;
constexpr double kLogRegionMel = 15.0;
const double kMelsPerLogHertz = 27.0 / std::log(6.4);

double hertz_to_mel(double hertz) {
  if (hertz < kLogRegionHertz) return hertz * kLinearMelsPerHertz;
  return kLogRegionMel + std::log(hertz / kLogRegionHertz) * kMelsPerLogHertz;
}

double mel_to_hertz(double mel) {
  if (mel < kLogRegionMel) return mel / kLinearMelsPerHertz;
  return kLogRegionHertz * std::exp((mel - kLogRegionMel) / kMelsPerLogHertz);
}

// numpy.linspace(start, stop, count): evenly spaced, the last value exactly `stop`.
std::vector<double> linspace(double start, double stop, size_t count) {
  std::vector<double> values(count);
  const double step = (stop - start) / static_cast<double>(count - 1);
  for (size_t i = 0; i < count; ++i) values[i] = start + static_cast<double>(i) * step;
  values.back() = stop;
  return values;
}

void check_range(int value, int low, int high, const std::string& name) {
  if (value < low || value > high) {
    throw Error("log-mel config: " + name + " is " + std::to_string(value) + "; expected " +
                std::to_string(low) + " to " + std::to_string(high));
  }
}

void validate(const LogMelConfig& config) {
  check_range(config.sample_rate, 1, kMaxSampleRate, "sampling_rate");
  check_range(config.n_fft, 2, kMaxFft, "n_fft");
  check_range(config.hop_length, 1, kMaxFft, "hop_length");
  check_range(config.n_mels, 1, kMaxMels, "feature_size (mel bins)");
  check_range(config.chunk_seconds, 1, kMaxChunkSeconds, "chunk_length");
  if (config.window_samples() <= config.n_fft / 2 || config.frames() < 1) {
    throw Error("log-mel config: a window of " + std::to_string(config.chunk_seconds) + " s at " +
                std::to_string(config.sample_rate) + " Hz is too short for n_fft " +
                std::to_string(config.n_fft) + " and hop_length " +
                std::to_string(config.hop_length));
  }
}

int read_setting(const nlohmann::json& config, const char* key, int fallback) {
  if (!config.contains(key)) return fallback;
  const nlohmann::json& value = config.at(key);
  if (!value.is_number_integer() || value.get<int64_t>() < 1 ||
      value.get<int64_t>() > std::numeric_limits<int>::max()) {
    throw Error(std::string("preprocessor_config.json: '") + key +
                "' must be a positive integer, got " + value.dump());
  }
  return value.get<int>();
}

// Reflect-pads the window's samples by `pad` on each side (numpy's "reflect": the edge sample
// is not repeated).
std::vector<double> padded_window(std::span<const float> samples, int64_t window, int64_t pad) {
  std::vector<double> padded(static_cast<size_t>(window + 2 * pad), 0.0);
  const int64_t kept = std::min<int64_t>(window, static_cast<int64_t>(samples.size()));
  for (int64_t i = 0; i < kept; ++i) padded[static_cast<size_t>(pad + i)] = samples[i];
  for (int64_t j = 1; j <= pad; ++j) {
    padded[static_cast<size_t>(pad - j)] = padded[static_cast<size_t>(pad + j)];
    padded[static_cast<size_t>(pad + window - 1 + j)] =
        padded[static_cast<size_t>(pad + window - 1 - j)];
  }
  return padded;
}

}  // namespace

int64_t LogMelConfig::frames() const {
  // Frames of the centered STFT, less the last one, which Whisper drops.
  const int64_t padded = window_samples() + 2 * (n_fft / 2);
  return (padded - n_fft) / hop_length;
}

LogMelConfig log_mel_config_from_json(const nlohmann::json& preprocessor_config) {
  const nlohmann::json& json = preprocessor_config;
  if (!json.is_object()) {
    throw Error("preprocessor_config.json must hold a JSON object, got " +
                std::string(json.type_name()));
  }
  if (json.contains("feature_extractor_type") &&
      json.at("feature_extractor_type") != "WhisperFeatureExtractor") {
    throw Error("preprocessor_config.json names feature extractor " +
                json.at("feature_extractor_type").dump() +
                ", not WhisperFeatureExtractor; point at a Whisper model folder");
  }
  LogMelConfig config;
  config.n_mels = read_setting(json, "feature_size", config.n_mels);
  config.sample_rate = read_setting(json, "sampling_rate", config.sample_rate);
  config.n_fft = read_setting(json, "n_fft", config.n_fft);
  config.hop_length = read_setting(json, "hop_length", config.hop_length);
  config.chunk_seconds = read_setting(json, "chunk_length", config.chunk_seconds);
  validate(config);
  if (json.contains("n_samples") && json.at("n_samples") != config.window_samples()) {
    throw Error(
        "preprocessor_config.json: n_samples " + json.at("n_samples").dump() +
        " is not chunk_length * sampling_rate = " + std::to_string(config.window_samples()));
  }
  const int64_t max_frames = config.window_samples() / config.hop_length;
  if (json.contains("nb_max_frames") && json.at("nb_max_frames") != max_frames) {
    throw Error("preprocessor_config.json: nb_max_frames " + json.at("nb_max_frames").dump() +
                " is not n_samples / hop_length = " + std::to_string(max_frames));
  }
  return config;
}

std::vector<double> whisper_mel_filters(const LogMelConfig& config) {
  validate(config);
  const size_t bins = static_cast<size_t>(config.n_fft / 2 + 1);
  const size_t mels = static_cast<size_t>(config.n_mels);
  const std::vector<double> bin_hertz =
      linspace(0.0, static_cast<double>(config.sample_rate / 2), bins);
  std::vector<double> edges = linspace(hertz_to_mel(0.0), hertz_to_mel(kMelMaxHertz), mels + 2);
  for (double& edge : edges) edge = mel_to_hertz(edge);

  std::vector<double> filters(mels * bins);
  for (size_t mel = 0; mel < mels; ++mel) {
    const double low = edges[mel];
    const double center = edges[mel + 1];
    const double high = edges[mel + 2];
    // Slaney normalization: each triangle has unit area, so every band carries equal energy.
    const double area_scale = 2.0 / (high - low);
    for (size_t bin = 0; bin < bins; ++bin) {
      const double rising = (bin_hertz[bin] - low) / (center - low);
      const double falling = (high - bin_hertz[bin]) / (high - center);
      filters[mel * bins + bin] = std::max(0.0, std::min(rising, falling)) * area_scale;
    }
  }
  return filters;
}

std::vector<float> whisper_log_mel(std::span<const float> samples, const LogMelConfig& config) {
  const std::vector<double> filters = whisper_mel_filters(config);
  const size_t n_fft = static_cast<size_t>(config.n_fft);
  const size_t bins = n_fft / 2 + 1;
  const size_t mels = static_cast<size_t>(config.n_mels);
  const size_t frames = static_cast<size_t>(config.frames());
  const size_t hop = static_cast<size_t>(config.hop_length);
  const std::vector<double> padded =
      padded_window(samples, config.window_samples(), config.n_fft / 2);

  // Periodic Hann window (numpy.hanning(n_fft + 1)[:-1], torch.hann_window(n_fft)).
  std::vector<double> window(n_fft);
  for (size_t i = 0; i < n_fft; ++i) {
    window[i] = 0.5 - 0.5 * std::cos(2.0 * std::numbers::pi * static_cast<double>(i) /
                                     static_cast<double>(n_fft));
  }
  // Each filter is a triangle: only its non-zero bins take part in the product.
  std::vector<std::pair<size_t, size_t>> spans(mels, {0, 0});
  for (size_t mel = 0; mel < mels; ++mel) {
    const double* row = filters.data() + mel * bins;
    size_t first = 0;
    while (first < bins && row[first] == 0.0) ++first;
    size_t end = bins;
    while (end > first && row[end - 1] == 0.0) --end;
    spans[mel] = {first, end};
  }

  const Fft fft(config.n_fft);
  std::vector<std::complex<double>> frame(n_fft);
  std::vector<std::complex<double>> spectrum(n_fft);
  std::vector<double> power(bins);
  std::vector<double> log_mel(mels * frames);
  for (size_t t = 0; t < frames; ++t) {
    const double* start = padded.data() + t * hop;
    for (size_t i = 0; i < n_fft; ++i) frame[i] = start[i] * window[i];
    fft.forward(frame, spectrum);
    for (size_t bin = 0; bin < bins; ++bin) power[bin] = std::norm(spectrum[bin]);
    for (size_t mel = 0; mel < mels; ++mel) {
      const double* row = filters.data() + mel * bins;
      double energy = 0.0;
      for (size_t bin = spans[mel].first; bin < spans[mel].second; ++bin) {
        energy += row[bin] * power[bin];
      }
      log_mel[mel * frames + t] = std::log10(std::max(energy, kMelFloor));
    }
  }

  const double floor = *std::max_element(log_mel.begin(), log_mel.end()) - kLogRange;
  std::vector<float> features(log_mel.size());
  for (size_t i = 0; i < log_mel.size(); ++i) {
    features[i] = static_cast<float>((std::max(log_mel[i], floor) + 4.0) / 4.0);
  }
  return features;
}

std::vector<std::vector<float>> whisper_windows(std::span<const float> samples,
                                                const LogMelConfig& config) {
  validate(config);
  const size_t window = static_cast<size_t>(config.window_samples());
  std::vector<std::vector<float>> windows;
  for (size_t start = 0; start < samples.size(); start += window) {
    const size_t end = std::min(samples.size(), start + window);
    windows.emplace_back(samples.begin() + static_cast<std::ptrdiff_t>(start),
                         samples.begin() + static_cast<std::ptrdiff_t>(end));
  }
  return windows;
}

}  // namespace mg::data
