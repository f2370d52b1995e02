#include "app/gui/plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace px::gui::plot {

namespace {

constexpr ImU32 kFrame = IM_COL32(22, 24, 30, 255);
constexpr ImU32 kAxis = IM_COL32(170, 170, 180, 255);
constexpr ImU32 kGridLine = IM_COL32(255, 255, 255, 24);
constexpr ImU32 kText = IM_COL32(215, 215, 222, 255);

ImVec2 region(ImVec2 size) {
    const ImVec2 avail = ImGui::GetContentRegionAvail();
    if (size.x <= 0) size.x = std::max(avail.x + size.x, 80.0f);
    if (size.y <= 0) size.y = std::max(avail.y + size.y, 60.0f);
    return size;
}

bool usable(double v, bool log) {
    return std::isfinite(v) && (!log || v > 0);
}

double fwd(double v, bool log) {
    return log ? std::log10(v) : v;
}
double inv(double v, bool log) {
    return log ? std::pow(10.0, v) : v;
}

// Ticks of a log axis over [lo, hi] (data units): decades, and 2 and 5 when few decades show.
std::vector<double> log_ticks(double lo, double hi) {
    std::vector<double> t;
    const int a = static_cast<int>(std::floor(std::log10(lo)));
    const int b = static_cast<int>(std::ceil(std::log10(hi)));
    for (int e = a; e <= b; e++)
        for (double m : (b - a <= 2 ? std::vector<double>{1, 2, 5} : std::vector<double>{1})) {
            const double v = m * std::pow(10.0, e);
            if (v >= lo * 0.999 && v <= hi * 1.001) t.push_back(v);
        }
    return t;
}

}  // namespace

std::vector<double> nice_ticks(double lo, double hi, int target) {
    std::vector<double> t;
    if (!(hi > lo) || !std::isfinite(lo) || !std::isfinite(hi)) return t;
    const double raw = (hi - lo) / std::max(target, 1);
    const double mag = std::pow(10.0, std::floor(std::log10(raw)));
    double step = mag;
    for (double m : {1.0, 2.0, 5.0, 10.0})
        if (m * mag >= raw) {
            step = m * mag;
            break;
        }
    for (double v = std::ceil(lo / step) * step; v <= hi + step * 1e-9; v += step)
        t.push_back(std::fabs(v) < step * 1e-9 ? 0.0 : v);
    return t;
}

std::string tick_text(double v, double step) {
    char buf[48];
    const double a = std::fabs(v);
    if (a != 0 && (a >= 1e6 || a < 1e-3)) {
        std::snprintf(buf, sizeof buf, "%.3g", v);
    } else {
        const int decimals =
            step >= 1 ? 0 : std::min(6, static_cast<int>(std::ceil(-std::log10(step))));
        std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
    }
    return buf;
}

int draw_lines(const char* id, const LinePlot& p, PlotView& view, ImVec2 size) {
    size = region(size);
    ImGui::PushID(id);
    ImDrawList* dl = ImGui::GetWindowDrawList();
    const ImVec2 o = ImGui::GetCursorScreenPos();
    const float lh = ImGui::GetTextLineHeight();
    const bool has_right = std::any_of(p.series.begin(), p.series.end(),
                                       [](const Series& s) { return s.right_axis && s.n > 0; });
    // Margins: y tick labels and the y label on the left, x ticks and the x label below.
    const float left = lh * 4.2f, right = has_right ? lh * 4.2f : lh * 0.8f;
    // The legend goes above the frame, so it covers no line: on the title's line when it fits
    // beside it, else on lines of its own under the title, right-aligned.
    const size_t ns = p.series.size();
    std::vector<float> entry_w(ns);
    float legend_w = 0;
    for (size_t i = 0; i < ns; i++) {
        entry_w[i] = 24 + ImGui::CalcTextSize(p.series[i].label.c_str()).x + lh * 0.9f;
        legend_w += entry_w[i];
    }
    const float title_w = p.title.empty() ? 0 : ImGui::CalcTextSize(p.title.c_str()).x + lh;
    const float avail_w = size.x - left - right;
    const bool beside = ns == 0 || title_w + legend_w <= avail_w;
    std::vector<int> entry_line(ns, 0);
    int legend_lines = 0;
    if (!beside) {
        float x = 0;
        legend_lines = 1;
        for (size_t i = 0; i < ns; i++) {
            if (x > 0 && x + entry_w[i] > avail_w) {
                legend_lines++;
                x = 0;
            }
            entry_line[i] = legend_lines - 1;
            x += entry_w[i];
        }
    }
    const bool title_line = !p.title.empty() || (ns > 0 && beside);
    const float top = (title_line ? lh * 1.6f : lh * 0.6f) + legend_lines * (lh + 2);
    const float bottom = lh * 2.6f;
    const ImVec2 a(o.x + left, o.y + top), b(o.x + size.x - right, o.y + size.y - bottom);
    ImGui::InvisibleButton("plot", size);
    const bool hovered = ImGui::IsItemHovered();
    const bool log = view.log_y;

    // Data bounds (left axis; right-axis series are scaled to their own range).
    double dx0 = INFINITY, dx1 = -INFINITY, dy0 = INFINITY, dy1 = -INFINITY;
    double ry0 = INFINITY, ry1 = -INFINITY;
    for (const Series& s : p.series)
        for (int i = 0; i < s.n; i++) {
            if (!std::isfinite(s.x[i])) continue;
            if (s.right_axis) {
                if (!std::isfinite(s.y[i])) continue;
                ry0 = std::min(ry0, s.y[i]);
                ry1 = std::max(ry1, s.y[i]);
            } else {
                if (!usable(s.y[i], log)) continue;
                dy0 = std::min(dy0, s.y[i]);
                dy1 = std::max(dy1, s.y[i]);
            }
            dx0 = std::min(dx0, s.x[i]);
            dx1 = std::max(dx1, s.x[i]);
        }
    for (const HLine& h : p.hlines)
        if (usable(h.y, log) && dy0 <= dy1) {
            dy0 = std::min(dy0, h.y);
            dy1 = std::max(dy1, h.y);
        }
    const bool empty = !(dx0 <= dx1);
    if (view.auto_fit && !empty) {
        view.x0 = dx0;
        view.x1 = dx1 > dx0 ? dx1 : dx0 + 1;
        if (dy0 <= dy1) {
            double lo = fwd(dy0, log), hi = fwd(dy1, log);
            const double pad = hi > lo ? (hi - lo) * 0.06 : 0.5;
            view.y0 = inv(lo - pad, log);
            view.y1 = inv(hi + pad, log);
        }
    }
    if (ry1 <= ry0) {
        ry0 = ry0 <= ry1 ? ry0 - 0.5 : 0;
        ry1 = ry0 + 1;
    } else {
        const double pad = (ry1 - ry0) * 0.06;
        ry0 -= pad;
        ry1 += pad;
    }
    const double fy0 = fwd(view.y0, log), fy1 = fwd(view.y1, log);
    auto X = [&](double x) {
        return static_cast<float>(a.x + (x - view.x0) / (view.x1 - view.x0) * (b.x - a.x));
    };
    auto Y = [&](double y) {
        return static_cast<float>(b.y - (fwd(y, log) - fy0) / (fy1 - fy0) * (b.y - a.y));
    };
    auto Y2 = [&](double y) {
        return static_cast<float>(b.y - (y - ry0) / (ry1 - ry0) * (b.y - a.y));
    };

    // Zoom (wheel: x; shift+wheel: y), pan (drag), reset (double-click).
    if (hovered && !empty) {
        const ImGuiIO& io = ImGui::GetIO();
        const double mx = view.x0 + (io.MousePos.x - a.x) / (b.x - a.x) * (view.x1 - view.x0);
        const double my = fy0 + (b.y - io.MousePos.y) / (b.y - a.y) * (fy1 - fy0);
        if (io.MouseWheel != 0) {
            const double f = std::pow(0.85, io.MouseWheel);
            view.auto_fit = false;
            if (io.KeyShift) {
                view.y0 = inv(my + (fy0 - my) * f, log);
                view.y1 = inv(my + (fy1 - my) * f, log);
            } else {
                view.x0 = mx + (view.x0 - mx) * f;
                view.x1 = mx + (view.x1 - mx) * f;
            }
        }
        if (ImGui::IsMouseDragging(ImGuiMouseButton_Left)) {
            const ImVec2 d = io.MouseDelta;
            const double sx = d.x / (b.x - a.x) * (view.x1 - view.x0);
            const double sy = d.y / (b.y - a.y) * (fy1 - fy0);
            view.auto_fit = false;
            view.x0 -= sx;
            view.x1 -= sx;
            view.y0 = inv(fwd(view.y0, log) + sy, log);
            view.y1 = inv(fwd(view.y1, log) + sy, log);
        }
        if (ImGui::IsMouseDoubleClicked(ImGuiMouseButton_Left)) view.auto_fit = true;
    }

    dl->AddRectFilled(a, b, kFrame);
    if (!p.title.empty()) dl->AddText(ImVec2(a.x, o.y + lh * 0.2f), kText, p.title.c_str());
    // Ticks and grid.
    const std::vector<double> xt =
        nice_ticks(view.x0, view.x1, std::max(2, static_cast<int>((b.x - a.x) / 90)));
    const double xstep = xt.size() > 1 ? xt[1] - xt[0] : 1;
    for (double v : xt) {
        const float x = X(v);
        dl->AddLine(ImVec2(x, a.y), ImVec2(x, b.y), kGridLine);
        dl->AddLine(ImVec2(x, b.y), ImVec2(x, b.y + 4), kAxis);
        const std::string s = tick_text(v, xstep);
        const float w = ImGui::CalcTextSize(s.c_str()).x;
        dl->AddText(ImVec2(x - w / 2, b.y + 5), kText, s.c_str());
    }
    const int ny = std::max(2, static_cast<int>((b.y - a.y) / (lh * 2.5f)));
    std::vector<double> yt;
    double ystep = 1;
    // A log axis within one decade has no 1-2-5 ticks to label (2.3 .. 3.5): it takes
    // linear ticks instead, still placed on the log scale.
    bool log_labels = log;
    if (log) yt = log_ticks(view.y0, view.y1);
    if (!log || yt.size() < 2) {
        yt = nice_ticks(view.y0, view.y1, ny);
        ystep = yt.size() > 1 ? yt[1] - yt[0] : 1;
        log_labels = false;
    }
    for (double v : yt) {
        const float y = Y(v);
        if (y < a.y - 1 || y > b.y + 1) continue;
        dl->AddLine(ImVec2(a.x, y), ImVec2(b.x, y), kGridLine);
        dl->AddLine(ImVec2(a.x - 4, y), ImVec2(a.x, y), kAxis);
        const std::string s = log_labels ? tick_text(v, v / 10) : tick_text(v, ystep);
        const ImVec2 ts = ImGui::CalcTextSize(s.c_str());
        dl->AddText(ImVec2(a.x - 6 - ts.x, y - ts.y / 2), kText, s.c_str());
    }
    if (has_right) {
        const std::vector<double> rt = nice_ticks(ry0, ry1, ny);
        const double rstep = rt.size() > 1 ? rt[1] - rt[0] : 1;
        for (double v : rt) {
            const float y = Y2(v);
            dl->AddLine(ImVec2(b.x, y), ImVec2(b.x + 4, y), kAxis);
            dl->AddText(ImVec2(b.x + 6, y - lh / 2), kText, tick_text(v, rstep).c_str());
        }
    }
    dl->AddRect(a, b, kAxis);
    // Axis labels.
    if (!p.x_label.empty()) {
        const float w = ImGui::CalcTextSize(p.x_label.c_str()).x;
        dl->AddText(ImVec2((a.x + b.x - w) / 2, b.y + lh * 1.4f), kText, p.x_label.c_str());
    }
    if (!p.y_label.empty()) {
        // Above the tick labels, left-aligned (ImGui draws no rotated text).
        const std::string s = p.y_label + (log ? " (log)" : "");
        dl->AddText(ImVec2(o.x + 2, b.y + lh * 1.4f), kText, s.c_str());
    }
    if (has_right && !p.y2_label.empty()) {
        const float w = ImGui::CalcTextSize(p.y2_label.c_str()).x;
        dl->AddText(ImVec2(o.x + size.x - w - 2, b.y + lh * 1.4f), kText, p.y2_label.c_str());
    }

    dl->PushClipRect(a, b, true);
    for (const HLine& h : p.hlines) {
        if (!usable(h.y, log)) continue;
        const float y = Y(h.y);
        for (float x = a.x; x < b.x; x += 10)
            dl->AddLine(ImVec2(x, y), ImVec2(std::min(x + 6, b.x), y), h.colour, 1.5f);
        const float w = ImGui::CalcTextSize(h.label.c_str()).x;
        dl->AddText(ImVec2(b.x - w - 6, y - lh - 2), h.colour, h.label.c_str());
    }
    int clicked_marker = -1;
    for (size_t k = 0; k < p.markers.size(); k++) {
        const VMarker& m = p.markers[k];
        const float x = X(m.x);
        dl->AddLine(ImVec2(x, a.y), ImVec2(x, b.y), m.colour, 1.5f);
        dl->AddTriangleFilled(ImVec2(x - 5, a.y), ImVec2(x + 5, a.y), ImVec2(x, a.y + 8), m.colour);
        if (hovered && std::fabs(ImGui::GetIO().MousePos.x - x) < 5 &&
            ImGui::IsMouseClicked(ImGuiMouseButton_Left))
            clicked_marker = static_cast<int>(k);
    }
    for (const Series& s : p.series) {
        ImVec2 prev;
        bool have = false;
        for (int i = 0; i < s.n; i++) {
            const bool ok = s.right_axis ? std::isfinite(s.y[i]) : usable(s.y[i], log);
            if (!ok || !std::isfinite(s.x[i])) {
                have = false;
                continue;
            }
            const ImVec2 q(X(s.x[i]), s.right_axis ? Y2(s.y[i]) : Y(s.y[i]));
            if (have) dl->AddLine(prev, q, s.colour, 1.8f);
            if (s.markers) dl->AddCircleFilled(q, 3.0f, s.colour);
            prev = q;
            have = true;
        }
    }
    // Hover: a cursor line and every series' value at the nearest point.
    if (hovered && !empty) {
        const ImVec2 m = ImGui::GetIO().MousePos;
        if (m.x >= a.x && m.x <= b.x && m.y >= a.y && m.y <= b.y) {
            const double mx = view.x0 + (m.x - a.x) / (b.x - a.x) * (view.x1 - view.x0);
            dl->AddLine(ImVec2(m.x, a.y), ImVec2(m.x, b.y), IM_COL32(255, 255, 255, 70));
            std::string tip;
            for (const Series& s : p.series) {
                int best = -1;
                double bd = INFINITY;
                for (int i = 0; i < s.n; i++) {
                    const bool ok = s.right_axis ? std::isfinite(s.y[i]) : usable(s.y[i], log);
                    if (!ok) continue;
                    const double d = std::fabs(s.x[i] - mx);
                    if (d < bd) {
                        bd = d;
                        best = i;
                    }
                }
                if (best < 0) continue;
                char line[160];
                std::snprintf(line, sizeof line, "%s%s at %g: %.6g", tip.empty() ? "" : "\n",
                              s.label.c_str(), s.x[best], s.y[best]);
                tip += line;
                dl->AddCircle(ImVec2(X(s.x[best]), s.right_axis ? Y2(s.y[best]) : Y(s.y[best])), 5,
                              s.colour);
            }
            if (!tip.empty()) ImGui::SetTooltip("%s", tip.c_str());
        }
    }
    dl->PopClipRect();
    // Legend, above the frame, each of its lines right-aligned to the frame's right edge.
    const int lines = ns == 0 ? 0 : beside ? 1 : legend_lines;
    for (int line = 0; line < lines; line++) {
        float w = 0;
        for (size_t i = 0; i < ns; i++)
            if (beside || entry_line[i] == line) w += entry_w[i];
        float x = b.x - w + lh * 0.9f;
        const float y =
            beside ? o.y + lh * 0.2f : o.y + (title_line ? lh * 1.4f : lh * 0.2f) + line * (lh + 2);
        for (size_t i = 0; i < ns; i++) {
            if (!beside && entry_line[i] != line) continue;
            dl->AddLine(ImVec2(x, y + lh / 2), ImVec2(x + 18, y + lh / 2), p.series[i].colour, 3);
            dl->AddText(ImVec2(x + 24, y), kText, p.series[i].label.c_str());
            x += entry_w[i];
        }
    }
    if (empty) {
        const char* msg = "no data yet";
        const ImVec2 ts = ImGui::CalcTextSize(msg);
        dl->AddText(ImVec2((a.x + b.x - ts.x) / 2, (a.y + b.y - ts.y) / 2), kAxis, msg);
    }
    ImGui::PopID();
    return clicked_marker;
}

HeatmapHit draw_heatmap(const char* id, const Heatmap& h, ImVec2 size, int selected_row,
                        int selected_col) {
    size = region(size);
    HeatmapHit hit;
    ImGui::PushID(id);
    ImDrawList* dl = ImGui::GetWindowDrawList();
    const ImVec2 o = ImGui::GetCursorScreenPos();
    const float lh = ImGui::GetTextLineHeight();
    float label_w = 0;
    if (h.row_label)
        for (int r = 0; r < h.rows; r++)
            label_w = std::max(label_w, ImGui::CalcTextSize(h.row_label(r).c_str()).x);
    label_w = std::min(label_w + 8, size.x * 0.45f);
    const float bar_w = 130;
    const float top = h.title.empty() ? 4 : lh * 1.5f;
    const ImVec2 a(o.x + label_w, o.y + top), b(o.x + size.x - bar_w, o.y + size.y - lh * 2.6f);
    ImGui::InvisibleButton("heat", size);
    const bool hovered = ImGui::IsItemHovered();
    if (!h.title.empty()) dl->AddText(ImVec2(o.x, o.y), kText, h.title.c_str());
    dl->AddRectFilled(a, b, kFrame);
    if (h.rows > 0 && h.cols > 0 && b.x > a.x && b.y > a.y) {
        const float cw = (b.x - a.x) / h.cols, ch = (b.y - a.y) / h.rows;
        const float gap = cw > 4 && ch > 4 ? 1.0f : 0.0f;
        for (int r = 0; r < h.rows; r++)
            for (int c = 0; c < h.cols; c++) {
                const ImVec2 p0(a.x + c * cw, a.y + r * ch);
                dl->AddRectFilled(p0, ImVec2(p0.x + cw - gap, p0.y + ch - gap), h.colour(r, c));
            }
        // Row labels: every row whose label fits (lines may overlap by a tenth), else every
        // few rows with a tick at each labelled row; the hovered and the selected row's label
        // are drawn over them (below), so any row can be named.
        int every = 1;
        if (h.row_label) {
            every = std::max(1, static_cast<int>(std::ceil(lh * 0.9f / std::max(ch, 0.1f))));
            dl->PushClipRect(ImVec2(o.x, a.y - lh), ImVec2(a.x - 2, b.y + lh), true);
            for (int r = 0; r < h.rows; r += every) {
                const std::string s = h.row_label(r);
                const float w = ImGui::CalcTextSize(s.c_str()).x;
                const float y = a.y + r * ch + ch / 2;
                dl->AddText(ImVec2(a.x - 7 - w, y - lh / 2), kText, s.c_str());
                if (every > 1) dl->AddLine(ImVec2(a.x - 5, y), ImVec2(a.x - 1, y), kAxis);
            }
            dl->PopClipRect();
        }
        // Column ticks: steps.
        const int cs = std::max(1, h.col_step);
        const std::vector<double> ct =
            nice_ticks(h.first_col, h.first_col + static_cast<double>(h.cols - 1) * cs,
                       std::max(2, static_cast<int>((b.x - a.x) / 70)));
        for (double v : ct) {
            if (std::fabs(v - std::round(v)) > 1e-9) continue;
            if ((std::llround(v) - h.first_col) % cs != 0) continue;
            const float x =
                a.x + ((static_cast<float>(v) - h.first_col) / static_cast<float>(cs) + 0.5f) * cw;
            dl->AddLine(ImVec2(x, b.y), ImVec2(x, b.y + 4), kAxis);
            const std::string s = tick_text(v, 1);
            dl->AddText(ImVec2(x - ImGui::CalcTextSize(s.c_str()).x / 2, b.y + 5), kText,
                        s.c_str());
        }
        if (!h.x_label.empty()) {
            const float w = ImGui::CalcTextSize(h.x_label.c_str()).x;
            dl->AddText(ImVec2((a.x + b.x - w) / 2, b.y + lh * 1.4f), kText, h.x_label.c_str());
        }
        auto outline = [&](int r, int c, ImU32 col, float th) {
            const ImVec2 p0(a.x + c * cw, a.y + r * ch);
            dl->AddRect(p0, ImVec2(p0.x + cw, p0.y + ch), col, 0, 0, th);
        };
        const bool marked =
            h.mark_row >= 0 && h.mark_col >= 0 && h.mark_row < h.rows && h.mark_col < h.cols;
        if (marked) {
            outline(h.mark_row, h.mark_col, kYellow, 3);
            if (!h.mark_label.empty()) {  // right of the cell, else left of it; inside the frame
                const ImVec2 ts = ImGui::CalcTextSize(h.mark_label.c_str());
                float x = a.x + (h.mark_col + 1) * cw + 6;
                if (x + ts.x + 6 > b.x) x = a.x + h.mark_col * cw - ts.x - 12;
                const float y =
                    std::clamp(a.y + h.mark_row * ch + ch / 2 - lh / 2, a.y + 2, b.y - lh - 2);
                dl->AddRectFilled(ImVec2(x - 3, y - 1), ImVec2(x + ts.x + 3, y + lh + 1),
                                  IM_COL32(40, 40, 48, 235));
                dl->AddRect(ImVec2(x - 3, y - 1), ImVec2(x + ts.x + 3, y + lh + 1), kYellow);
                dl->AddText(ImVec2(x, y), kYellow, h.mark_label.c_str());
            }
        }
        if (selected_row >= 0 && selected_col >= 0 && selected_row < h.rows &&
            selected_col < h.cols)
            outline(selected_row, selected_col, IM_COL32(255, 255, 255, 255), 2);
        if (hovered) {
            const ImVec2 m = ImGui::GetIO().MousePos;
            if (m.x >= a.x && m.x < b.x && m.y >= a.y && m.y < b.y) {
                hit.col = std::min(h.cols - 1, static_cast<int>((m.x - a.x) / cw));
                hit.row = std::min(h.rows - 1, static_cast<int>((m.y - a.y) / ch));
                hit.clicked = ImGui::IsMouseClicked(ImGuiMouseButton_Left);
                outline(hit.row, hit.col, IM_COL32(255, 255, 255, 180), 1);
            }
        }
        // The hovered row's label (else the selected row's), highlighted where its row is.
        const int named = hit.row >= 0        ? hit.row
                          : selected_row >= 0 ? selected_row
                          : marked            ? h.mark_row
                                              : -1;
        if (h.row_label && every > 1 && named >= 0 && named < h.rows) {
            const std::string s = h.row_label(named);
            const ImVec2 ts = ImGui::CalcTextSize(s.c_str());
            const float y =
                std::clamp(a.y + named * ch + ch / 2 - lh / 2, a.y - lh / 2, b.y - lh / 2);
            const ImVec2 p0(std::max(o.x, a.x - 9 - ts.x), y - 1);
            dl->AddRectFilled(p0, ImVec2(a.x - 1, y + lh + 1), IM_COL32(40, 40, 48, 255));
            dl->AddRect(p0, ImVec2(a.x - 1, y + lh + 1), kYellow);
            dl->AddText(ImVec2(a.x - 5 - ts.x, y), kYellow, s.c_str());
        }
    }
    dl->AddRect(a, b, kAxis);
    // Colour bar: one swatch per stop, labels beside.
    const float bx = b.x + 14;
    const int n = static_cast<int>(h.legend.size());
    if (n > 0) {
        const float sh = std::min((b.y - a.y) / n, lh * 1.6f);
        for (int k = 0; k < n; k++) {
            const float y = b.y - (k + 1) * sh;
            dl->AddRectFilled(ImVec2(bx, y), ImVec2(bx + 16, y + sh),
                              h.legend[static_cast<size_t>(k)].first);
            dl->AddText(ImVec2(bx + 22, y + sh / 2 - lh / 2), kText,
                        h.legend[static_cast<size_t>(k)].second.c_str());
        }
        dl->AddRect(ImVec2(bx, b.y - n * sh), ImVec2(bx + 16, b.y), kAxis);
    }
    ImGui::PopID();
    return hit;
}

int draw_gantt(const char* id, const std::vector<std::string>& lanes,
               const std::vector<GanttBar>& bars, double t_min, double t_max,
               const std::string& x_label, ImVec2 size, bool integer_ticks) {
    size = region(size);
    // Lanes at most 3.5 lines tall: a few ranks do not become slabs.
    const float lh0 = ImGui::GetTextLineHeight();
    size.y = std::min(size.y, lh0 * 3.5f * std::max<size_t>(lanes.size(), 1) + lh0 * 2.6f + 8);
    ImGui::PushID(id);
    ImDrawList* dl = ImGui::GetWindowDrawList();
    const ImVec2 o = ImGui::GetCursorScreenPos();
    const float lh = ImGui::GetTextLineHeight();
    float label_w = 0;
    for (const std::string& l : lanes)
        label_w = std::max(label_w, ImGui::CalcTextSize(l.c_str()).x);
    const ImVec2 a(o.x + label_w + 10, o.y + 4), b(o.x + size.x - 8, o.y + size.y - lh * 2.6f);
    ImGui::InvisibleButton("gantt", size);
    const bool hovered = ImGui::IsItemHovered();
    dl->AddRectFilled(a, b, kFrame);
    int hit = -1;
    if (!(t_max > t_min)) t_max = t_min + 1;
    const int n = std::max<int>(1, static_cast<int>(lanes.size()));
    const float lane_h = (b.y - a.y) / n;
    auto X = [&](double t) {
        return static_cast<float>(a.x + (t - t_min) / (t_max - t_min) * (b.x - a.x));
    };
    const std::vector<double> xt =
        nice_ticks(t_min, t_max, std::max(2, static_cast<int>((b.x - a.x) / 90)));
    const double step = xt.size() > 1 ? xt[1] - xt[0] : 1;
    for (double v : xt) {
        if (integer_ticks && std::fabs(v - std::round(v)) > 1e-9) continue;
        const float x = X(v);
        dl->AddLine(ImVec2(x, a.y), ImVec2(x, b.y), kGridLine);
        const std::string s = tick_text(v, integer_ticks ? 1.0 : step);
        dl->AddText(ImVec2(x - ImGui::CalcTextSize(s.c_str()).x / 2, b.y + 5), kText, s.c_str());
    }
    for (size_t l = 0; l < lanes.size(); l++)
        dl->AddText(ImVec2(o.x + 2, a.y + l * lane_h + lane_h / 2 - lh / 2), kText,
                    lanes[l].c_str());
    const ImVec2 m = ImGui::GetIO().MousePos;
    for (size_t k = 0; k < bars.size(); k++) {
        const GanttBar& g = bars[k];
        const float y1 = a.y + (g.lane + 1) * lane_h - lane_h * 0.12f;
        const float y0 = y1 - lane_h * 0.76f * std::clamp(g.height, 0.05f, 1.0f);
        const float x0 = X(g.t0), x1 = std::max(X(g.t1), X(g.t0) + 1.5f);
        dl->AddRectFilled(ImVec2(x0, y0), ImVec2(x1, y1), g.colour, 2);
        const ImVec2 ts = ImGui::CalcTextSize(g.label.c_str());
        if (ts.x + 4 < x1 - x0 && ts.y < y1 - y0)
            dl->AddText(ImVec2((x0 + x1 - ts.x) / 2, (y0 + y1 - ts.y) / 2),
                        IM_COL32(10, 10, 14, 255), g.label.c_str());
        if (hovered && m.x >= x0 && m.x <= x1 && m.y >= y0 && m.y <= y1) hit = static_cast<int>(k);
    }
    if (hit >= 0) {
        const GanttBar& g = bars[static_cast<size_t>(hit)];
        ImGui::SetTooltip("%s\n%.3g .. %.3g (%.3g)", g.label.c_str(), g.t0, g.t1, g.t1 - g.t0);
    }
    dl->AddRect(a, b, kAxis);
    if (!x_label.empty()) {
        const float w = ImGui::CalcTextSize(x_label.c_str()).x;
        dl->AddText(ImVec2((a.x + b.x - w) / 2, b.y + lh * 1.4f), kText, x_label.c_str());
    }
    ImGui::PopID();
    return hit;
}

void draw_stacked_bars(const char* id, const StackedBars& s, ImVec2 size) {
    size = region(size);
    ImGui::PushID(id);
    ImDrawList* dl = ImGui::GetWindowDrawList();
    const ImVec2 o = ImGui::GetCursorScreenPos();
    const float lh = ImGui::GetTextLineHeight();
    const float legend_w = 190;
    const float top = s.title.empty() ? 6 : lh * 1.6f;
    const ImVec2 a(o.x + lh * 5.5f, o.y + top),
        b(o.x + size.x - legend_w, o.y + size.y - lh * 2.6f);
    ImGui::InvisibleButton("bars", size);
    const bool hovered = ImGui::IsItemHovered();
    if (!s.title.empty()) dl->AddText(o, kText, s.title.c_str());
    dl->AddRectFilled(a, b, kFrame);
    double top_v = 0;
    for (size_t c = 0; c < s.values.size(); c++) {
        double t = 0;
        for (double v : s.values[c]) t += v;
        top_v = std::max(top_v, t);
        if (c < s.reference.size()) top_v = std::max(top_v, s.reference[c]);
    }
    if (top_v <= 0) top_v = 1;
    top_v *= 1.08;
    auto Y = [&](double v) { return static_cast<float>(b.y - v / top_v * (b.y - a.y)); };
    auto fmt = [&](double v) {
        if (s.format) return s.format(v);
        char buf[32];
        std::snprintf(buf, sizeof buf, "%.3g", v);
        return std::string(buf);
    };
    for (double v : nice_ticks(0, top_v, 5)) {
        const float y = Y(v);
        dl->AddLine(ImVec2(a.x, y), ImVec2(b.x, y), kGridLine);
        const std::string t = fmt(v);
        dl->AddText(ImVec2(a.x - 6 - ImGui::CalcTextSize(t.c_str()).x, y - lh / 2), kText,
                    t.c_str());
    }
    const int n = std::max<int>(1, static_cast<int>(s.categories.size()));
    const float slot = (b.x - a.x) / n, w = std::min(slot * 0.6f, 90.0f);
    const ImVec2 m = ImGui::GetIO().MousePos;
    for (size_t c = 0; c < s.categories.size(); c++) {
        const float cx = a.x + (c + 0.5f) * slot;
        double base = 0;
        for (size_t k = 0; k < s.parts.size() && c < s.values.size() && k < s.values[c].size();
             k++) {
            const double v = s.values[c][k];
            const ImVec2 p0(cx - w / 2, Y(base + v)), p1(cx + w / 2, Y(base));
            if (v > 0) dl->AddRectFilled(p0, p1, s.colours[k % s.colours.size()]);
            if (hovered && v > 0 && m.x >= p0.x && m.x <= p1.x && m.y >= p0.y && m.y <= p1.y)
                ImGui::SetTooltip("%s, %s: %s", s.categories[c].c_str(), s.parts[k].c_str(),
                                  fmt(v).c_str());
            base += v;
        }
        if (c < s.reference.size() && s.reference[c] >= 0) {
            const float y = Y(s.reference[c]);
            dl->AddLine(ImVec2(cx - w / 2 - 6, y), ImVec2(cx + w / 2 + 6, y), kYellow, 2.5f);
        }
        const std::string& l = s.categories[c];
        dl->AddText(ImVec2(cx - ImGui::CalcTextSize(l.c_str()).x / 2, b.y + 5), kText, l.c_str());
    }
    dl->AddRect(a, b, kAxis);
    if (!s.y_label.empty()) dl->AddText(ImVec2(o.x + 2, b.y + lh * 1.4f), kText, s.y_label.c_str());
    // Legend.
    float ly = a.y + 4;
    const float lx = b.x + 14;
    for (size_t k = s.parts.size(); k-- > 0;) {
        dl->AddRectFilled(ImVec2(lx, ly + 2), ImVec2(lx + 14, ly + lh - 2),
                          s.colours[k % s.colours.size()]);
        dl->AddText(ImVec2(lx + 20, ly), kText, s.parts[k].c_str());
        ly += lh + 4;
    }
    if (!s.reference_label.empty()) {
        dl->AddLine(ImVec2(lx, ly + lh / 2), ImVec2(lx + 14, ly + lh / 2), kYellow, 2.5f);
        dl->AddText(ImVec2(lx + 20, ly), kText, s.reference_label.c_str());
    }
    ImGui::PopID();
}

}  // namespace px::gui::plot
