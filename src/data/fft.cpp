#include "data/fft.hpp"

#include <algorithm>
#include <numbers>
#include <string>

#include "meganeura/error.hpp"

namespace mg::data {
namespace {

// std::complex's operator* checks for infinities and NaNs through a library call; samples are
// finite, so the plain product is exact enough and several times faster.
std::complex<double> multiply(std::complex<double> a, std::complex<double> b) {
  return {a.real() * b.real() - a.imag() * b.imag(), a.real() * b.imag() + a.imag() * b.real()};
}

}  // namespace

Fft::Fft(int size) : size_(size) {
  if (size < 1) throw Error("FFT size must be at least 1, got " + std::to_string(size));
  size_t remaining = static_cast<size_t>(size);
  for (size_t radix : {size_t{4}, size_t{2}, size_t{3}, size_t{5}}) {
    while (remaining % radix == 0) {
      radices_.push_back(radix);
      remaining /= radix;
    }
  }
  for (size_t prime = 7; remaining > 1; prime += 2) {
    while (remaining % prime == 0) {
      radices_.push_back(prime);
      remaining /= prime;
    }
    if (prime * prime > remaining && remaining > 1) {
      radices_.push_back(remaining);
      remaining = 1;
    }
  }
  twiddles_.resize(static_cast<size_t>(size));
  for (size_t k = 0; k < twiddles_.size(); ++k) {
    twiddles_[k] = std::polar(1.0, -2.0 * std::numbers::pi * static_cast<double>(k) / size);
  }
}

void Fft::forward(std::span<const std::complex<double>> input,
                  std::span<std::complex<double>> output) const {
  if (input.size() != static_cast<size_t>(size_) || output.size() != input.size()) {
    throw Error("FFT of size " + std::to_string(size_) + " was given " +
                std::to_string(input.size()) + " inputs and " + std::to_string(output.size()) +
                " outputs");
  }
  const size_t largest_radix =
      radices_.empty() ? 1 : *std::max_element(radices_.begin(), radices_.end());
  std::vector<std::complex<double>> scratch(largest_radix);
  transform(input.data(), 1, output.data(), input.size(), 0, scratch.data());
}

// Decimation in time: the `radix` interleaved subsequences of `input` are transformed into
// consecutive blocks of `output`, then combined in place by radix-point butterflies.
void Fft::transform(const std::complex<double>* input, size_t input_stride,
                    std::complex<double>* output, size_t length, size_t level,
                    std::complex<double>* scratch) const {
  if (length == 1) {
    output[0] = input[0];
    return;
  }
  const size_t radix = radices_[level];
  const size_t block = length / radix;
  for (size_t part = 0; part < radix; ++part) {
    transform(input + part * input_stride, input_stride * radix, output + part * block, block,
              level + 1, scratch);
  }
  const size_t full = static_cast<size_t>(size_);
  const size_t length_step = full / length;  // twiddles_ index of exp(-2 pi i / length)
  const size_t radix_step = full / radix;    // twiddles_ index of exp(-2 pi i / radix)
  for (size_t k = 0; k < block; ++k) {
    for (size_t part = 0; part < radix; ++part) {
      scratch[part] = multiply(output[part * block + k], twiddles_[part * k * length_step]);
    }
    for (size_t harmonic = 0; harmonic < radix; ++harmonic) {
      std::complex<double> sum = scratch[0];
      size_t rotation = 0;  // part * harmonic modulo radix, in steps of exp(-2 pi i / radix)
      for (size_t part = 1; part < radix; ++part) {
        rotation += harmonic;
        if (rotation >= radix) rotation -= radix;
        sum += multiply(scratch[part], twiddles_[rotation * radix_step]);
      }
      output[k + harmonic * block] = sum;
    }
  }
}

}  // namespace mg::data
