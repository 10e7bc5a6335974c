#include "io/plot.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>

#include "io/bitmap_font.hpp"
#include "meganeura/error.hpp"

namespace mg::io {
namespace {

struct Color {
  uint8_t r, g, b;
};

constexpr Color kBackground{255, 255, 255};
constexpr Color kInk{40, 40, 40};
constexpr Color kGrid{225, 225, 225};
// Matplotlib's "tab10" palette: distinct and readable for colour-blind viewers.
constexpr std::array<Color, 6> kSeriesColors = {
    {{31, 119, 180}, {255, 127, 14}, {44, 160, 44}, {214, 39, 40}, {148, 103, 189}, {140, 86, 75}}};

constexpr int kTitleScale = 2;
constexpr int kLabelScale = 2;
constexpr int kTickScale = 1;
constexpr int kLegendScale = 1;
constexpr size_t kMarkedSeriesLength = 20;

struct Rect {
  int left, top, right, bottom;  // right and bottom exclusive
  int width() const { return right - left; }
  int height() const { return bottom - top; }
};

class Canvas {
 public:
  Canvas(int width, int height) : image_{width, height, 3, {}} {
    image_.pixels.resize(static_cast<size_t>(width) * height * 3);
    fill({0, 0, width, height}, kBackground);
  }

  void set(int x, int y, Color color) {
    if (x < 0 || y < 0 || x >= image_.width || y >= image_.height) return;
    uint8_t* pixel = &image_.pixels[(static_cast<size_t>(y) * image_.width + x) * 3];
    pixel[0] = color.r;
    pixel[1] = color.g;
    pixel[2] = color.b;
  }

  void fill(Rect rect, Color color) {
    for (int y = rect.top; y < rect.bottom; ++y) {
      for (int x = rect.left; x < rect.right; ++x) set(x, y, color);
    }
  }

  void outline(Rect rect, Color color) {
    fill({rect.left, rect.top, rect.right, rect.top + 1}, color);
    fill({rect.left, rect.bottom - 1, rect.right, rect.bottom}, color);
    fill({rect.left, rect.top, rect.left + 1, rect.bottom}, color);
    fill({rect.right - 1, rect.top, rect.right, rect.bottom}, color);
  }

  // A two-pixel-wide line: thin lines are hard to see on a chart this size.
  void line(double x0, double y0, double x1, double y1, Color color) {
    const int steps = static_cast<int>(std::ceil(std::max(std::abs(x1 - x0), std::abs(y1 - y0))));
    for (int i = 0; i <= steps; ++i) {
      const double t = steps == 0 ? 0.0 : static_cast<double>(i) / steps;
      const int x = static_cast<int>(std::lround(x0 + (x1 - x0) * t));
      const int y = static_cast<int>(std::lround(y0 + (y1 - y0) * t));
      fill({x, y, x + 2, y + 2}, color);
    }
  }

  // Draws `text` with its top-left corner at (x, y), or, when vertical, reading bottom to top
  // with its bottom-left corner at (x, y).
  void text(int x, int y, std::string_view text, int scale, Color color, bool vertical = false) {
    for (size_t i = 0; i < text.size(); ++i) {
      const GlyphRows& rows = glyph(text[i]);
      const int advance = static_cast<int>(i) * kGlyphAdvance * scale;
      for (int row = 0; row < kGlyphHeight; ++row) {
        for (int column = 0; column < kGlyphWidth; ++column) {
          if (!(rows[row] & (0x10 >> column))) continue;
          const int u = (advance + column * scale), v = row * scale;
          const Rect cell = vertical ? Rect{x + v, y - u - scale, x + v + scale, y - u}
                                     : Rect{x + u, y + v, x + u + scale, y + v + scale};
          fill(cell, color);
        }
      }
    }
  }

  Image take() { return std::move(image_); }

 private:
  Image image_;
};

struct Axis {
  double low = 0, high = 1, step = 0.2;
};

// "Nice" tick steps (1, 2 or 5 times a power of ten) giving about five ticks over the data.
Axis nice_axis(double low, double high) {
  if (!(low < high)) {
    const double pad = low == 0 ? 1.0 : std::abs(low) * 0.1;
    low -= pad;
    high += pad;
  }
  const double rough = (high - low) / 5;
  const double magnitude = std::pow(10.0, std::floor(std::log10(rough)));
  const double fraction = rough / magnitude;
  const double step = (fraction < 1.5   ? 1
                       : fraction < 3.5 ? 2
                       : fraction < 7.5 ? 5
                                        : 10) *
                      magnitude;
  return {std::floor(low / step) * step, std::ceil(high / step) * step, step};
}

std::string tick_label(double value, double step) {
  char buffer[32];
  if (std::abs(value) < step * 1e-6) value = 0;  // avoid "-0.0" from rounding
  if (step >= 1e-4 && std::abs(value) < 1e7) {
    const int decimals = std::max(0, static_cast<int>(std::ceil(-std::log10(step) - 1e-9)));
    std::snprintf(buffer, sizeof buffer, "%.*f", decimals, value);
  } else {
    std::snprintf(buffer, sizeof buffer, "%.2g", value);
  }
  return buffer;
}

bool finite(const std::pair<double, double>& point) {
  return std::isfinite(point.first) && std::isfinite(point.second);
}

void draw_panel(Canvas& canvas, const ChartPanel& panel, Rect area) {
  const int label_height = kGlyphHeight * kLabelScale;
  const int tick_height = kGlyphHeight * kTickScale;
  const Rect plot{area.left + 12 + label_height + 6 * kGlyphAdvance * kTickScale,
                  area.top + label_height + 12, area.right - 12,
                  area.bottom - 16 - tick_height - label_height};
  if (plot.width() < 40 || plot.height() < 40) throw Error("chart is too small for its panels");

  double x_low = INFINITY, x_high = -INFINITY, y_low = INFINITY, y_high = -INFINITY;
  for (const Series& series : panel.series) {
    for (const auto& point : series.points) {
      if (!finite(point)) continue;
      x_low = std::min(x_low, point.first);
      x_high = std::max(x_high, point.first);
      y_low = std::min(y_low, point.second);
      y_high = std::max(y_high, point.second);
    }
  }
  if (x_low > x_high) x_low = 0, x_high = 1, y_low = 0, y_high = 1;
  const Axis x_axis = nice_axis(x_low, x_high), y_axis = nice_axis(y_low, y_high);
  const auto to_x = [&](double x) {
    return plot.left + (x - x_axis.low) / (x_axis.high - x_axis.low) * (plot.width() - 2);
  };
  const auto to_y = [&](double y) {
    return plot.bottom - 2 - (y - y_axis.low) / (y_axis.high - y_axis.low) * (plot.height() - 2);
  };

  // Grid and ticks. Ticks are counted, not accumulated, so rounding cannot add or drop one.
  const int x_ticks = static_cast<int>(std::lround((x_axis.high - x_axis.low) / x_axis.step));
  for (int i = 0; i <= x_ticks; ++i) {
    const double value = x_axis.low + i * x_axis.step;
    const int x = static_cast<int>(std::lround(to_x(value)));
    canvas.fill({x, plot.top, x + 1, plot.bottom}, kGrid);
    canvas.fill({x, plot.bottom, x + 1, plot.bottom + 4}, kInk);
    const std::string label = tick_label(value, x_axis.step);
    canvas.text(x - text_width(label, kTickScale) / 2, plot.bottom + 6, label, kTickScale, kInk);
  }
  const int y_ticks = static_cast<int>(std::lround((y_axis.high - y_axis.low) / y_axis.step));
  for (int i = 0; i <= y_ticks; ++i) {
    const double value = y_axis.low + i * y_axis.step;
    const int y = static_cast<int>(std::lround(to_y(value)));
    canvas.fill({plot.left, y, plot.right, y + 1}, kGrid);
    canvas.fill({plot.left - 4, y, plot.left, y + 1}, kInk);
    const std::string label = tick_label(value, y_axis.step);
    canvas.text(plot.left - 6 - text_width(label, kTickScale), y - tick_height / 2, label,
                kTickScale, kInk);
  }
  canvas.outline(plot, kInk);

  for (size_t s = 0; s < panel.series.size(); ++s) {
    const Color color = kSeriesColors[s % kSeriesColors.size()];
    const auto& points = panel.series[s].points;
    for (size_t i = 0; i < points.size(); ++i) {
      if (!finite(points[i])) continue;
      const double x = to_x(points[i].first), y = to_y(points[i].second);
      if (i > 0 && finite(points[i - 1])) {
        canvas.line(to_x(points[i - 1].first), to_y(points[i - 1].second), x, y, color);
      }
      // Short series (one test accuracy per epoch) get markers so single points show.
      if (points.size() <= kMarkedSeriesLength) {
        const int px = static_cast<int>(x), py = static_cast<int>(y);
        canvas.fill({px - 2, py - 2, px + 3, py + 3}, color);
      }
    }
  }

  canvas.text((plot.left + plot.right - text_width(panel.title, kLabelScale)) / 2, area.top + 4,
              panel.title, kLabelScale, kInk);
  canvas.text((plot.left + plot.right - text_width(panel.x_label, kLabelScale)) / 2,
              area.bottom - label_height - 4, panel.x_label, kLabelScale, kInk);
  canvas.text(area.left + 4, (plot.top + plot.bottom + text_width(panel.y_label, kLabelScale)) / 2,
              panel.y_label, kLabelScale, kInk, /*vertical=*/true);

  // Legend in a right-hand corner of the plot.
  size_t longest = 0;
  for (const Series& series : panel.series) longest = std::max(longest, series.name.size());
  if (panel.series.empty() || longest == 0) return;
  const int row_height = kGlyphHeight * kLegendScale + 6;
  const int swatch = 16;
  const int legend_width = swatch + 14 + text_width(std::string(longest, ' '), kLegendScale) + 8;
  const int legend_height = 6 + row_height * static_cast<int>(panel.series.size());
  // Top-right unless more data lies there than in the bottom-right corner.
  const Rect top_right{plot.right - legend_width - 8, plot.top + 8, plot.right - 8,
                       plot.top + 8 + legend_height};
  const Rect bottom_right{top_right.left, plot.bottom - 8 - legend_height, top_right.right,
                          plot.bottom - 8};
  // How much of the drawn data a box would hide: samples along every segment, with a margin.
  auto points_inside = [&](const Rect& box) {
    int count = 0;
    for (const Series& series : panel.series) {
      for (size_t i = 0; i < series.points.size(); ++i) {
        if (!finite(series.points[i])) continue;
        const auto& from =
            i > 0 && finite(series.points[i - 1]) ? series.points[i - 1] : series.points[i];
        for (int t = 0; t <= 16; ++t) {
          const double x = to_x(from.first + (series.points[i].first - from.first) * t / 16.0);
          const double y = to_y(from.second + (series.points[i].second - from.second) * t / 16.0);
          count +=
              x >= box.left - 8 && x <= box.right + 8 && y >= box.top - 8 && y <= box.bottom + 8;
        }
      }
    }
    return count;
  };
  const Rect legend =
      points_inside(top_right) > points_inside(bottom_right) ? bottom_right : top_right;
  canvas.fill(legend, kBackground);
  canvas.outline(legend, kInk);
  for (size_t s = 0; s < panel.series.size(); ++s) {
    const int y = legend.top + 6 + static_cast<int>(s) * row_height;
    const Color color = kSeriesColors[s % kSeriesColors.size()];
    canvas.fill({legend.left + 6, y + 2, legend.left + 6 + swatch, y + 5}, color);
    canvas.text(legend.left + 12 + swatch, y, panel.series[s].name, kLegendScale, kInk);
  }
}

}  // namespace

Image render_chart(const Chart& chart) {
  if (chart.width < 100 || chart.height < 100 || chart.width > 8192 || chart.height > 8192) {
    throw Error("chart size " + std::to_string(chart.width) + "x" + std::to_string(chart.height) +
                " is outside 100..8192 pixels per side");
  }
  Canvas canvas(chart.width, chart.height);
  const int title_height = chart.title.empty() ? 0 : kGlyphHeight * kTitleScale + 16;
  canvas.text((chart.width - text_width(chart.title, kTitleScale)) / 2, 8, chart.title, kTitleScale,
              kInk);
  const int panel_count = std::max<int>(1, static_cast<int>(chart.panels.size()));
  const int panel_width = chart.width / panel_count;
  for (size_t i = 0; i < chart.panels.size(); ++i) {
    const int left = static_cast<int>(i) * panel_width;
    draw_panel(canvas, chart.panels[i], {left, title_height, left + panel_width, chart.height});
  }
  return canvas.take();
}

void write_chart_png(const std::filesystem::path& path, const Chart& chart) {
  write_png(path, render_chart(chart));
}

}  // namespace mg::io
