// A small plotting module on Dear ImGui's ImDrawList (Debian packages no ImPlot): line plots
// with axes, ticks, labels, a legend, zoom (mouse wheel), pan (drag), reset (double-click), log
// scale and hover values; heatmaps with a colour bar and cell picking; Gantt bars; stacked
// bars. Every panel draws its plots with it. Immediate mode: the caller passes the data each
// frame and keeps a PlotView per plot for its zoom and pan.
//
// Index
//   PlotView          a plot's zoom, pan and scale, kept by the caller between frames
//   Series, HLine, VMarker, LinePlot   what draw_lines draws
//   draw_lines        lines against x, with axes, ticks, legend, hover tooltip
//   Heatmap, draw_heatmap   cells coloured by the caller, row labels, a colour bar; hover/click
//   GanttBar, draw_gantt    bars on lanes against time; hover
//   StackedBars, draw_stacked_bars   one stacked bar per category, with reference ticks
//   nice_ticks        1-2-5 ticks over a range
#pragma once
#include <imgui.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace px::gui::plot {

struct PlotView {
    bool auto_fit = true;  // follow the data; zoom or pan turns it off, double-click back on
    bool log_y = false;
    double x0 = 0, x1 = 1, y0 = 0, y1 = 1;  // the visible range (y in data units, also when log)
};

struct Series {
    std::string label;
    const double* x = nullptr;
    const double* y = nullptr;  // points with non-finite y (or y <= 0 on a log scale) are gaps
    int n = 0;
    ImU32 colour = IM_COL32(90, 160, 255, 255);
    bool markers = false;     // a dot at each point (sparse series: validation loss)
    bool right_axis = false;  // scaled to its own range, drawn against a right-hand axis
};

struct HLine {  // a horizontal reference line across the plot
    double y = 0;
    std::string label;
    ImU32 colour = IM_COL32(200, 200, 200, 160);
};

struct VMarker {  // a vertical marker at x (events, spikes)
    double x = 0;
    std::string label;
    ImU32 colour = IM_COL32(255, 120, 80, 200);
};

struct LinePlot {
    std::string title, x_label, y_label, y2_label;
    std::vector<Series> series;
    std::vector<HLine> hlines;
    std::vector<VMarker> markers;
};

// Draws p in a region of `size` (negative: fill the available width/height). Returns the index
// of a marker clicked this frame, or -1.
int draw_lines(const char* id, const LinePlot& p, PlotView& view, ImVec2 size);

struct Heatmap {
    int rows = 0, cols = 0;
    std::function<ImU32(int row, int col)> colour;
    std::function<std::string(int row)> row_label;  // shown at most every few rows when crowded
    std::string x_label, title;
    int first_col = 1;  // the number shown under column 0 (steps start at 1)
    int col_step = 1;   // the numbers of consecutive columns differ by this (every N steps)
    // The colour bar: stops from bottom to top, each a colour and a label.
    std::vector<std::pair<ImU32, std::string>> legend;
    // A cell marked for the reader (the first divergence): outlined in yellow, its label beside
    // it, its row named as a selected row's is; -1: none.
    int mark_row = -1, mark_col = -1;
    std::string mark_label;
};

struct HeatmapHit {
    int row = -1, col = -1;  // hovered cell, -1: none
    bool clicked = false;
};
HeatmapHit draw_heatmap(const char* id, const Heatmap& h, ImVec2 size, int selected_row = -1,
                        int selected_col = -1);

struct GanttBar {
    int lane = 0;
    double t0 = 0, t1 = 0;
    ImU32 colour = IM_COL32(90, 160, 255, 255);
    std::string label;    // drawn inside when it fits; always in the hover tooltip
    float height = 1.0f;  // of the lane, bottom-aligned (a thin band under the full bars)
};
// Bars on lanes (labels top to bottom) against x from t_min to t_max; returns the hovered bar.
int draw_gantt(const char* id, const std::vector<std::string>& lanes,
               const std::vector<GanttBar>& bars, double t_min, double t_max,
               const std::string& x_label, ImVec2 size, bool integer_ticks = false);

struct StackedBars {
    std::vector<std::string> categories;      // one bar each (ranks)
    std::vector<std::string> parts;           // stack order, bottom up
    std::vector<ImU32> colours;               // per part
    std::vector<std::vector<double>> values;  // [category][part]
    std::vector<double> reference;            // per category, a tick across the bar (-1: none)
    std::string reference_label, y_label, title;
    std::function<std::string(double)> format;  // axis and tooltip values ("3.2 MiB")
};
void draw_stacked_bars(const char* id, const StackedBars& b, ImVec2 size);

std::vector<double> nice_ticks(double lo, double hi, int target);  // 1-2-5 steps inside [lo, hi]
std::string tick_text(double v, double step);                      // as many decimals as step needs

// Colours shared by the panels.
inline constexpr ImU32 kBlue = IM_COL32(86, 156, 255, 255);
inline constexpr ImU32 kOrange = IM_COL32(255, 160, 60, 255);
inline constexpr ImU32 kGreen = IM_COL32(90, 200, 120, 255);
inline constexpr ImU32 kPurple = IM_COL32(180, 120, 255, 255);
inline constexpr ImU32 kGrey = IM_COL32(150, 150, 160, 255);
inline constexpr ImU32 kRed = IM_COL32(240, 70, 60, 255);
inline constexpr ImU32 kYellow = IM_COL32(240, 210, 80, 255);

}  // namespace px::gui::plot
