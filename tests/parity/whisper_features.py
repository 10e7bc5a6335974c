"""Numpy twin of Whisper's audio front end, following transformers' WhisperFeatureExtractor.

It reproduces both of transformers' code paths with their own number formats:
  numpy: audio_utils.spectrogram (float64 FFT stored as complex64, float64 mel product, float32
         log values), the path taken when torch is not installed;
  torch: _torch_extract_fbank_features (torch.stft in float32), the path taken when it is.
It also reads PCM/float RIFF WAV files on its own, to check the C++ reader on real files.

Usage:
  whisper_features.py features IN.f32 OUT.f32 PATH N_MELS SAMPLE_RATE N_FFT HOP CHUNK_SECONDS
  whisper_features.py filters OUT.f64 N_MELS SAMPLE_RATE N_FFT
  whisper_features.py wav IN.wav OUT.f64      (mono mean of the channels, then the sample rate)
Raw files are little-endian and row-major; features are [N_MELS, frames].
"""
import struct
import sys

import numpy as np


def hertz_to_mel(hertz):
    hertz = np.asarray(hertz, dtype=np.float64)
    linear = 3.0 * hertz / 200.0
    logarithmic = 15.0 + np.log(np.maximum(hertz, 1e-30) / 1000.0) * 27.0 / np.log(6.4)
    return np.where(hertz >= 1000.0, logarithmic, linear)


def mel_to_hertz(mel):
    mel = np.asarray(mel, dtype=np.float64)
    linear = 200.0 * mel / 3.0
    logarithmic = 1000.0 * np.exp(np.log(6.4) / 27.0 * (mel - 15.0))
    return np.where(mel >= 15.0, logarithmic, linear)


def mel_filters(n_mels, sample_rate, n_fft):
    """[n_mels, n_fft // 2 + 1]: slaney scale and norm, 0 to 8 kHz, as transformers builds them."""
    bins = n_fft // 2 + 1
    bin_hertz = np.linspace(0, sample_rate // 2, bins)
    edges = mel_to_hertz(np.linspace(hertz_to_mel(0.0), hertz_to_mel(8000.0), n_mels + 2))
    low, center, high = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    rising = (bin_hertz[None, :] - low) / (center - low)
    falling = (high - bin_hertz[None, :]) / (high - center)
    return np.maximum(0.0, np.minimum(rising, falling)) * (2.0 / (high - low))


def fit_window(samples, sample_rate, chunk_seconds):
    window = chunk_seconds * sample_rate
    fitted = np.zeros(window, dtype=np.float32)
    kept = min(window, samples.size)
    fitted[:kept] = samples[:kept]
    return fitted


def features_numpy(samples, n_mels, sample_rate, n_fft, hop):
    padded = np.pad(samples, n_fft // 2, mode="reflect").astype(np.float64)
    window = np.hanning(n_fft + 1)[:-1]
    count = 1 + (padded.size - n_fft) // hop
    starts = np.arange(count)[:, None] * hop + np.arange(n_fft)[None, :]
    spectrum = np.fft.rfft(padded[starts] * window, axis=1).astype(np.complex64)
    power = np.abs(spectrum, dtype=np.float64) ** 2
    mel = np.maximum(1e-10, mel_filters(n_mels, sample_rate, n_fft) @ power.T)
    log_mel = np.log10(mel).astype(np.float32)[:, :-1]
    log_mel = np.maximum(log_mel, log_mel.max() - np.float32(8.0))
    return (log_mel + np.float32(4.0)) / np.float32(4.0)


def features_torch(samples, n_mels, sample_rate, n_fft, hop):
    import torch

    waveform = torch.from_numpy(samples).type(torch.float32)
    stft = torch.stft(waveform, n_fft, hop, window=torch.hann_window(n_fft), return_complex=True)
    power = stft[..., :-1].abs() ** 2
    filters = torch.from_numpy(mel_filters(n_mels, sample_rate, n_fft)).type(torch.float32)
    log_mel = torch.clamp(filters @ power, min=1e-10).log10()
    log_mel = torch.maximum(log_mel, log_mel.max() - 8.0)
    return ((log_mel + 4.0) / 4.0).numpy()


def read_wav(path):
    """Mono float64 samples and the sample rate of a PCM or IEEE-float RIFF WAV file."""
    data = open(path, "rb").read()
    if data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise ValueError(f"{path} is not a RIFF WAVE file")
    offset, fmt, payload = 12, None, None
    while offset + 8 <= len(data):
        chunk = data[offset : offset + 4]
        size = struct.unpack("<I", data[offset + 4 : offset + 8])[0]
        body = data[offset + 8 : offset + 8 + size]
        if chunk == b"fmt ":
            fmt = body
        elif chunk == b"data":
            payload = body
        offset += 8 + size + (size & 1)
    tag, channels, rate = struct.unpack("<HHI", fmt[:8])
    bits = struct.unpack("<H", fmt[14:16])[0]
    if tag == 0xFFFE:  # WAVE_FORMAT_EXTENSIBLE: the sub-format GUID's first two bytes say which
        tag = struct.unpack("<H", fmt[24:26])[0]
    width = bits // 8
    count = len(payload) // (width * channels)
    raw = np.frombuffer(payload[: count * width * channels], dtype=np.uint8).reshape(-1, width)
    if tag == 3:
        values = raw.copy().view("<f4" if width == 4 else "<f8")[:, 0].astype(np.float64)
    elif width == 1:
        values = (raw[:, 0].astype(np.float64) - 128.0) / 128.0
    else:
        widened = np.zeros((raw.shape[0], 4), dtype=np.uint8)
        widened[:, 4 - width :] = raw  # left-justify into 32 bits, keeping the sign
        values = widened.view("<i4")[:, 0].astype(np.float64) / 2.0**31
    return values.reshape(count, channels).mean(axis=1), rate


def main(argv):
    command = argv[1]
    if command == "features":
        samples = np.fromfile(argv[2], dtype="<f4")
        path = argv[4]
        n_mels, sample_rate, n_fft, hop, chunk_seconds = (int(value) for value in argv[5:10])
        window = fit_window(samples, sample_rate, chunk_seconds)
        compute = {"numpy": features_numpy, "torch": features_torch}[path]
        features = compute(window, n_mels, sample_rate, n_fft, hop)
        np.ascontiguousarray(features, dtype="<f4").tofile(argv[3])
    elif command == "filters":
        n_mels, sample_rate, n_fft = (int(value) for value in argv[3:6])
        mel_filters(n_mels, sample_rate, n_fft).astype("<f8").tofile(argv[2])
    elif command == "wav":
        samples, rate = read_wav(argv[2])
        np.concatenate([samples, [float(rate)]]).astype("<f8").tofile(argv[3])
    else:
        raise SystemExit(f"unknown command {command}")


if __name__ == "__main__":
    main(sys.argv)
