#pragma once
#include <filesystem>
#include <vector>

namespace mg::data {

// Sample rates read_audio and resample accept; outside this range a file is taken as corrupt.
inline constexpr int kMinSampleRate = 1000;
inline constexpr int kMaxSampleRate = 768000;

// Mono audio, samples nominally in [-1, 1].
struct Audio {
  int sample_rate = 16000;
  std::vector<float> samples;
};

// Reads any file libsndfile reads (WAV in 8/16/24/32-bit PCM or 32/64-bit float, FLAC, OGG, ...),
// mixes its channels down to mono (the mean of the channels) and resamples it to `target_rate`.
// Integer PCM is scaled by 2^-(bits-1), as libsndfile, soundfile and librosa do. Throws mg::Error
// naming the file when it is missing, empty, not a format libsndfile knows, has no channels or
// samples, a sample rate outside [kMinSampleRate, kMaxSampleRate], or (WAV) a header declaring
// more bytes than the file holds.
Audio read_audio(const std::filesystem::path& path, int target_rate = 16000);

// Band-limited resampling with a Kaiser-windowed sinc (64 zero crossings, beta 14.77, cutoff at
// 0.945 of the lower Nyquist frequency; resampy's "kaiser_best" design). Samples before the start
// and after the end count as zeros. The output has floor(n * target_rate / sample_rate) samples,
// sample j sitting at input time j * sample_rate / target_rate exactly.
Audio resample(const Audio& audio, int target_rate);

}  // namespace mg::data
