#pragma once
#include <nlohmann/json.hpp>
#include <span>
#include <vector>

namespace mg::data {

// Whisper's feature settings; the defaults are WhisperFeatureExtractor's (80 mel bins for
// Whisper tiny to large-v2, 128 for large-v3).
struct LogMelConfig {
  int sample_rate = 16000;
  int n_fft = 400;
  int hop_length = 160;
  int n_mels = 80;
  int chunk_seconds = 30;

  int64_t window_samples() const { return int64_t{chunk_seconds} * sample_rate; }
  // Columns of one window's features: 3000 at the defaults.
  int64_t frames() const;
};

// Reads a Whisper folder's preprocessor_config.json: feature_size, sampling_rate, n_fft,
// hop_length and chunk_length (each optional, defaulting as WhisperFeatureExtractor does), checked
// against n_samples and nb_max_frames when present. Throws mg::Error naming the key at fault, or
// when feature_extractor_type names another extractor.
LogMelConfig log_mel_config_from_json(const nlohmann::json& preprocessor_config);

// Slaney-style mel filters as transformers' mel_filter_bank(n_fft / 2 + 1, n_mels, 0, 8000,
// sample_rate, norm="slaney", mel_scale="slaney") builds them, row-major [n_mels, n_fft / 2 + 1].
std::vector<double> whisper_mel_filters(const LogMelConfig& config);

// Whisper's log-mel features of one window, row-major [n_mels, frames()], as
// WhisperFeatureExtractor computes them: the samples cut or zero-padded to window_samples(); a
// centered STFT (reflect padding by n_fft / 2, periodic Hann window, hop_length) whose last frame
// is dropped; |X|^2 through the mel filters; log10(max(x, 1e-10)); max(x, max(x) - 8); (x + 4) / 4.
// Computed in double precision; throws mg::Error on an invalid config.
std::vector<float> whisper_log_mel(std::span<const float> samples, const LogMelConfig& config);

// Cuts audio into consecutive windows of window_samples(); the last one holds the remainder
// (whisper_log_mel pads it). No samples give no windows.
std::vector<std::vector<float>> whisper_windows(std::span<const float> samples,
                                                const LogMelConfig& config);

}  // namespace mg::data
