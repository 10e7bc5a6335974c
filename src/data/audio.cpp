#include "data/audio.hpp"

#include <sndfile.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <numbers>
#include <numeric>
#include <span>
#include <string>

#include "meganeura/error.hpp"

namespace mg::data {
namespace {

constexpr int kZeroCrossings = 64;
constexpr double kKaiserBeta = 14.769656459379492;
constexpr double kRolloff = 0.9475937167399596;
// Kernel samples per zero crossing; linear interpolation between them errs by at most
// pi^2 / (8 * kTableResolution^2) of the peak, below the rounding of 24-bit samples.
constexpr int kTableResolution = 4096;
constexpr sf_count_t kReadFrames = 8192;
// Largest per-phase weight table kept (8 MiB of doubles).
constexpr int64_t kMaxCachedWeights = int64_t{1} << 20;

std::string quoted(const std::filesystem::path& path) {
  return "'" + path.string() + "'";
}

uint32_t little_endian_u32(const std::array<char, 4>& bytes) {
  return uint32_t{static_cast<unsigned char>(bytes[0])} |
         (uint32_t{static_cast<unsigned char>(bytes[1])} << 8) |
         (uint32_t{static_cast<unsigned char>(bytes[2])} << 16) |
         (uint32_t{static_cast<unsigned char>(bytes[3])} << 24);
}

// libsndfile silently shortens a RIFF WAV whose header declares more bytes than the file holds;
// such a file is truncated or corrupt, so it is refused here instead.
void check_riff_sizes(const std::filesystem::path& path, uintmax_t file_size) {
  std::ifstream in(path, std::ios::binary);
  std::array<char, 4> id{};
  std::array<char, 4> size{};
  std::array<char, 4> wave{};
  if (!in.read(id.data(), 4) || !in.read(size.data(), 4) || !in.read(wave.data(), 4)) return;
  if (std::string_view(id.data(), 4) != "RIFF" || std::string_view(wave.data(), 4) != "WAVE") {
    return;
  }
  const auto refuse = [&](std::string_view what, uintmax_t declared_end) {
    throw Error("audio file " + quoted(path) + " is truncated or corrupt: its " +
                std::string(what) + " declares " + std::to_string(declared_end) +
                " bytes but the file holds " + std::to_string(file_size) +
                "; re-export it (e.g. sox in.wav out.wav)");
  };
  // One byte of slack: writers differ on whether the pad byte of an odd-sized chunk is counted.
  const uintmax_t riff_end = uintmax_t{little_endian_u32(size)} + 8;
  if (riff_end > file_size + 1) refuse("RIFF header", riff_end);
  uintmax_t offset = 12;
  while (in.read(id.data(), 4) && in.read(size.data(), 4)) {
    const uintmax_t chunk_size = little_endian_u32(size);
    const uintmax_t chunk_end = offset + 8 + chunk_size;
    if (std::string_view(id.data(), 4) == "data") {
      if (chunk_end > file_size) refuse("'data' chunk", chunk_end);
      return;
    }
    offset = chunk_end + (chunk_size & 1);
    if (offset >= file_size) return;
    in.seekg(static_cast<std::streamoff>(offset));
  }
}

class SoundFile {
 public:
  SoundFile(const std::filesystem::path& path, SF_INFO& info)
      : file_(sf_open(path.c_str(), SFM_READ, &info)) {
    if (file_ == nullptr) {
      throw Error("cannot read audio file " + quoted(path) + ": " + sf_strerror(nullptr) +
                  " (expected WAV, FLAC, OGG or another format libsndfile reads)");
    }
  }
  SoundFile(const SoundFile&) = delete;
  SoundFile& operator=(const SoundFile&) = delete;
  ~SoundFile() { sf_close(file_); }

  SNDFILE* get() const { return file_; }

 private:
  SNDFILE* file_;
};

void check_sample_rate(int rate, const std::string& what) {
  if (rate < kMinSampleRate || rate > kMaxSampleRate) {
    throw Error(what + " has sample rate " + std::to_string(rate) + " Hz; supported rates are " +
                std::to_string(kMinSampleRate) + " to " + std::to_string(kMaxSampleRate) + " Hz");
  }
}

// The modified Bessel function I0 by its power series, sum over k of ((x / 2)^k / k!)^2, which
// converges quickly for the window's arguments (below 15).
double bessel_i0(double x) {
  const double quarter_square = x * x / 4.0;
  double term = 1.0;
  double sum = 1.0;
  for (int k = 1; term > sum * 1e-17; ++k) {
    term *= quarter_square / (static_cast<double>(k) * k);
    sum += term;
  }
  return sum;
}

double kaiser_sinc(double zero_crossings_from_center) {
  const double x = zero_crossings_from_center;
  const double sinc = x == 0.0 ? 1.0 : std::sin(std::numbers::pi * x) / (std::numbers::pi * x);
  const double ratio = x / kZeroCrossings;
  const double window =
      bessel_i0(kKaiserBeta * std::sqrt(1.0 - ratio * ratio)) / bessel_i0(kKaiserBeta);
  return sinc * window;
}

// The kernel's right half at kTableResolution points per zero crossing, plus a trailing zero so
// that interpolation next to the last zero crossing reads no further.
const std::vector<double>& kernel_table() {
  static const std::vector<double> table = [] {
    std::vector<double> values(static_cast<size_t>(kZeroCrossings) * kTableResolution + 2, 0.0);
    for (size_t i = 0; i + 1 < values.size(); ++i) {
      values[i] = kaiser_sinc(static_cast<double>(i) / kTableResolution);
    }
    return values;
  }();
  return table;
}

// The weights of the input samples around one output sample. Output j lies at input time
// whole + phase / up; its weights depend only on the phase, so they are computed once per phase
// while that table stays small (always, for the usual rates) and per output sample otherwise.
class Resampler {
 public:
  Resampler(int source_rate, int target_rate) {
    const int64_t divisor = std::gcd(source_rate, target_rate);
    up = target_rate / divisor;
    down = source_rate / divisor;
    // Cutoff as a fraction of the input's Nyquist frequency: below the lower of the two Nyquist
    // frequencies, so that downsampling does not alias and upsampling leaves no images.
    cutoff_ = kRolloff * std::min(1.0, static_cast<double>(target_rate) / source_rate);
    const int64_t reach = static_cast<int64_t>(kZeroCrossings / cutoff_);
    first_offset = -reach;
    taps_ = 2 * reach + 2;
    if (up * taps_ <= kMaxCachedWeights) {
      cache_.resize(static_cast<size_t>(up * taps_));
      for (int64_t phase = 0; phase < up; ++phase) {
        fill(phase, std::span<double>(cache_).subspan(static_cast<size_t>(phase * taps_),
                                                      static_cast<size_t>(taps_)));
      }
    }
  }

  // Weights of input samples whole + first_offset + tap for tap < taps.
  std::span<const double> weights(int64_t phase, std::vector<double>& scratch) const {
    if (!cache_.empty()) {
      return std::span<const double>(cache_).subspan(static_cast<size_t>(phase * taps_),
                                                     static_cast<size_t>(taps_));
    }
    scratch.resize(static_cast<size_t>(taps_));
    fill(phase, scratch);
    return scratch;
  }

  int64_t up = 1;
  int64_t down = 1;
  int64_t first_offset = 0;

 private:
  // Kernel weights at distance (phase / up - offset) * cutoff zero crossings, scaled by the
  // cutoff so that the filter passes low frequencies with unit gain.
  void fill(int64_t phase, std::span<double> weights) const {
    const std::vector<double>& table = kernel_table();
    const double fraction = static_cast<double>(phase) / static_cast<double>(up);
    for (size_t tap = 0; tap < weights.size(); ++tap) {
      const double distance =
          fraction - static_cast<double>(first_offset + static_cast<int64_t>(tap));
      const double index = std::abs(distance) * cutoff_ * kTableResolution;
      const size_t below = static_cast<size_t>(index);
      if (below + 1 >= table.size()) {
        weights[tap] = 0.0;
        continue;
      }
      const double above = index - static_cast<double>(below);
      weights[tap] = cutoff_ * (table[below] + above * (table[below + 1] - table[below]));
    }
  }

  double cutoff_ = 1.0;
  int64_t taps_ = 0;
  std::vector<double> cache_;
};

}  // namespace

Audio resample(const Audio& audio, int target_rate) {
  check_sample_rate(audio.sample_rate, "audio to resample");
  check_sample_rate(target_rate, "resampling target");
  if (audio.sample_rate == target_rate) return audio;

  const Resampler resampler(audio.sample_rate, target_rate);
  const int64_t input_count = static_cast<int64_t>(audio.samples.size());
  const int64_t output_count = input_count * resampler.up / resampler.down;
  Audio result;
  result.sample_rate = target_rate;
  result.samples.resize(static_cast<size_t>(output_count));
  std::vector<double> scratch;
  for (int64_t j = 0; j < output_count; ++j) {
    // Output j sits at input time j * down / up = whole + phase / up.
    const int64_t whole = j * resampler.down / resampler.up;
    const int64_t phase = j * resampler.down % resampler.up;
    const std::span<const double> weights = resampler.weights(phase, scratch);
    const int64_t first_tap = std::max<int64_t>(0, -(whole + resampler.first_offset));
    const int64_t end_tap = std::min<int64_t>(static_cast<int64_t>(weights.size()),
                                              input_count - (whole + resampler.first_offset));
    const float* source = audio.samples.data() + whole + resampler.first_offset;
    double sum = 0.0;
    for (int64_t tap = first_tap; tap < end_tap; ++tap) sum += weights[tap] * source[tap];
    result.samples[static_cast<size_t>(j)] = static_cast<float>(sum);
  }
  return result;
}

Audio read_audio(const std::filesystem::path& path, int target_rate) {
  std::error_code error;
  if (!std::filesystem::exists(path, error)) {
    throw Error("audio file " + quoted(path) + " does not exist");
  }
  if (!std::filesystem::is_regular_file(path, error)) {
    throw Error("audio file " + quoted(path) + " is not a regular file");
  }
  const uintmax_t file_size = std::filesystem::file_size(path, error);
  if (error) throw Error("cannot read audio file " + quoted(path) + ": " + error.message());
  if (file_size == 0) throw Error("audio file " + quoted(path) + " is empty (0 bytes)");
  check_riff_sizes(path, file_size);

  SF_INFO info{};
  const SoundFile file(path, info);
  if (info.channels < 1) throw Error("audio file " + quoted(path) + " declares no channels");
  check_sample_rate(info.samplerate, "audio file " + quoted(path));

  Audio audio;
  audio.sample_rate = info.samplerate;
  const size_t channels = static_cast<size_t>(info.channels);
  std::vector<double> block(static_cast<size_t>(kReadFrames) * channels);
  while (true) {
    const sf_count_t frames = sf_readf_double(file.get(), block.data(), kReadFrames);
    if (frames <= 0) break;
    for (size_t frame = 0; frame < static_cast<size_t>(frames); ++frame) {
      double sum = 0.0;
      for (size_t channel = 0; channel < channels; ++channel) {
        sum += block[frame * channels + channel];
      }
      audio.samples.push_back(static_cast<float>(sum / static_cast<double>(channels)));
    }
  }
  if (sf_error(file.get()) != SF_ERR_NO_ERROR) {
    throw Error("audio file " + quoted(path) + " is corrupt: " + sf_strerror(file.get()));
  }
  if (audio.samples.empty()) throw Error("audio file " + quoted(path) + " holds no samples");
  return resample(audio, target_rate);
}

}  // namespace mg::data
