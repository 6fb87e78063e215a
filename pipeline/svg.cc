// The timeline picture (see timeline.h): one row per stage, boxes coloured by action kind
// with the micro-batch number inside, in the style of the GPipe/Zero Bubble figures.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

#include "pipeline/timeline.h"

namespace strata::pipeline {
namespace {

struct Style {
  const char* fill;        // chunk 0
  const char* fill_other;  // chunks 1.. (interleaved): a darker shade
  const char* label;
};

Style style_of(ActionKind k) {
  switch (k) {
    case ActionKind::forward:
      return {"#8ab6e8", "#3d78b8", "F forward"};
    case ActionKind::backward_input:
      return {"#f7c08a", "#c97a2e", "B input gradient"};
    case ActionKind::backward_weight:
      return {"#a8d5a0", "#4f9a45", "W weight gradient"};
    case ActionKind::backward_full:
      return {"#e8a0a0", "#b55050", "BW full backward (B+W)"};
    default:
      return {"#c8c8c8", "#888888", "OPT optimizer step"};
  }
}

std::string fmt(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", x);
  return buf;
}

// A tick step of 1, 2 or 5 times a power of ten giving about `target` ticks.
double nice_step(double range, int target) {
  if (range <= 0) return 1;
  const double raw = range / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  for (double f : {1.0, 2.0, 5.0, 10.0}) {
    if (f * mag >= raw) return f * mag;
  }
  return 10 * mag;
}

}  // namespace

std::string to_svg(const Timeline& t, const std::string& title) {
  double t0 = std::numeric_limits<double>::infinity(), t1 = -t0;
  bool kinds[4] = {false, false, false, false};  // F, B, W, BW seen
  for (const auto& ta : t.actions) {
    if (!is_compute(ta.action.kind)) continue;
    t0 = std::min(t0, ta.start);
    t1 = std::max(t1, ta.end);
    kinds[static_cast<int>(ta.action.kind)] = true;
  }
  if (!(t0 < t1)) t0 = 0, t1 = 1;
  const double left = 78, top = 44, row = 30, gap = 6, right = 20;
  const double plot_w = std::clamp((t1 - t0) * 40.0, 900.0, 1800.0);
  const double scale = plot_w / (t1 - t0);
  const double rows_h = t.stages * (row + gap);
  const double height = top + rows_h + 70;
  const double width = left + plot_w + right;

  std::ostringstream os;
  os << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << fmt(width) << "\" height=\"" << fmt(height)
     << "\" viewBox=\"0 0 " << fmt(width) << ' ' << fmt(height) << "\" font-family=\"Helvetica, Arial, sans-serif\">\n";
  os << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  os << "<text x=\"" << fmt(left) << "\" y=\"24\" font-size=\"16\" font-weight=\"bold\">" << title << "</text>\n";
  for (int s = 0; s < t.stages; ++s) {
    const double y = top + s * (row + gap);
    os << "<rect x=\"" << fmt(left) << "\" y=\"" << fmt(y) << "\" width=\"" << fmt(plot_w) << "\" height=\"" << fmt(row)
       << "\" fill=\"#f3f3f3\"/>\n";
    os << "<text x=\"" << fmt(left - 8) << "\" y=\"" << fmt(y + row / 2 + 5)
       << "\" font-size=\"13\" text-anchor=\"end\">"
       << "Stage " << s << "</text>\n";
  }
  for (const auto& ta : t.actions) {
    const ActionKind k = ta.action.kind;
    if (!is_compute(k) || ta.end <= ta.start) continue;
    const Style st = style_of(k);
    const double x = left + (ta.start - t0) * scale, w = (ta.end - ta.start) * scale;
    const double y = top + ta.stage * (row + gap);
    const bool other = ta.action.chunk > 0;
    os << "<rect x=\"" << fmt(x) << "\" y=\"" << fmt(y) << "\" width=\"" << fmt(std::max(w, 0.5)) << "\" height=\""
       << fmt(row) << "\" fill=\"" << (other ? st.fill_other : st.fill)
       << "\" stroke=\"#333\" stroke-width=\"0.6\"><title>" << format_action(ta.action) << " stage " << ta.stage
       << "</title></rect>\n";
    const double font = std::min(13.0, w * 0.55);
    if (font >= 6) {
      os << "<text x=\"" << fmt(x + w / 2) << "\" y=\"" << fmt(y + row / 2 + font * 0.36) << "\" font-size=\""
         << fmt(font) << "\" text-anchor=\"middle\" fill=\"" << (other ? "white" : "black") << "\">" << ta.action.micro
         << "</text>\n";
    }
  }
  // Time axis.
  const double axis_y = top + rows_h + 4;
  os << "<line x1=\"" << fmt(left) << "\" y1=\"" << fmt(axis_y) << "\" x2=\"" << fmt(left + plot_w) << "\" y2=\""
     << fmt(axis_y) << "\" stroke=\"#333\"/>\n";
  const double step = nice_step(t1 - t0, 12);
  for (double v = 0; v <= (t1 - t0) + step * 1e-9; v += step) {
    const double x = left + v * scale;
    os << "<line x1=\"" << fmt(x) << "\" y1=\"" << fmt(axis_y) << "\" x2=\"" << fmt(x) << "\" y2=\"" << fmt(axis_y + 5)
       << "\" stroke=\"#333\"/>\n";
    std::ostringstream label;
    label << v;
    os << "<text x=\"" << fmt(x) << "\" y=\"" << fmt(axis_y + 18) << "\" font-size=\"11\" text-anchor=\"middle\">"
       << label.str() << "</text>\n";
  }
  os << "<text x=\"" << fmt(left + plot_w) << "\" y=\"" << fmt(axis_y + 32)
     << "\" font-size=\"11\" text-anchor=\"end\">"
     << "time (" << t.unit << ")</text>\n";
  // Legend: the kinds that appear.
  double lx = left;
  const double ly = axis_y + 26;
  for (int k = 0; k < 4; ++k) {
    if (!kinds[k]) continue;
    const Style st = style_of(static_cast<ActionKind>(k));
    os << "<rect x=\"" << fmt(lx) << "\" y=\"" << fmt(ly) << "\" width=\"14\" height=\"14\" fill=\"" << st.fill
       << "\" stroke=\"#333\" stroke-width=\"0.6\"/>\n";
    os << "<text x=\"" << fmt(lx + 20) << "\" y=\"" << fmt(ly + 11) << "\" font-size=\"12\">" << st.label
       << "</text>\n";
    lx += 190;
  }
  if (t.chunks > 1) {
    os << "<text x=\"" << fmt(lx) << "\" y=\"" << fmt(ly + 11) << "\" font-size=\"12\">"
       << (t.chunks == 2 ? std::string("darker: chunk 1") : "darker: chunks 1.." + std::to_string(t.chunks - 1))
       << "</text>\n";
  }
  os << "</svg>\n";
  return os.str();
}

}  // namespace strata::pipeline
