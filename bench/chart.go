package main

import (
	"fmt"
	"html"
	"math"
	"slices"
	"strings"
)

// chartMax is the right end of the axis: a longer bar is cut there and
// carries its value, so that a 100x handoff does not flatten the 0.9x
// that matter.
const chartMax = 3.0

// chart draws the ratios as horizontal bars, grouped by workload, with a
// line at 1 (as fast as the reference). Hand-written SVG: no scripts, no
// fonts beyond the generic family.
func chart(bars []bar) string {
	const (
		labelW = 330
		plotW  = 420
		rowH   = 20
		top    = 40
	)
	// Group the bars, groups in order of first appearance.
	rank := map[string]int{}
	for _, b := range bars {
		if _, ok := rank[b.group]; !ok {
			rank[b.group] = len(rank)
		}
	}
	bars = slices.Clone(bars)
	slices.SortStableFunc(bars, func(a, b bar) int { return rank[a.group] - rank[b.group] })
	maxR := chartMax
	x := func(r float64) float64 { return labelW + min(r, maxR)/maxR*plotW }
	var rows strings.Builder
	y := top
	group := ""
	for _, b := range bars {
		if b.group != group {
			group = b.group
			y += 8
			fmt.Fprintf(&rows, `<text x="4" y="%d" font-weight="bold">%s</text>`+"\n", y+12, html.EscapeString(group))
			y += rowH
		}
		fmt.Fprintf(&rows, `<text x="%d" y="%d" text-anchor="end">%s</text>`+"\n", labelW-6, y+14, html.EscapeString(b.label))
		if math.IsNaN(b.ratio) {
			fmt.Fprintf(&rows, `<text x="%d" y="%d">n/a</text>`+"\n", labelW+4, y+14)
		} else {
			color := "#4a7ebb"
			if b.ratio < 1 {
				color = "#c0504d"
			}
			fmt.Fprintf(&rows, `<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"/>`+"\n", labelW, y+3, x(b.ratio)-labelW, rowH-6, color)
			cut := ""
			if b.ratio > maxR {
				cut = " (cut)"
			}
			fmt.Fprintf(&rows, `<text x="%.1f" y="%d">%.2fx%s</text>`+"\n", x(b.ratio)+4, y+14, b.ratio, cut)
		}
		y += rowH
	}
	h := y + 30
	w := labelW + plotW + 100
	var s strings.Builder
	fmt.Fprintf(&s, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", w, h, w, h)
	fmt.Fprintf(&s, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&s, `<text x="4" y="18" font-size="14" font-weight="bold">Ratios against each store's reference, medians over alternating rounds (1 = as good; longer is better)</text>`+"\n")
	for t := 0.0; t <= maxR; t += 0.5 {
		stroke, dash := "#ddd", ""
		if t == 1 {
			stroke, dash = "#333", ` stroke-dasharray="4 3"`
		}
		fmt.Fprintf(&s, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="%s"%s/>`+"\n", x(t), top, x(t), y, stroke, dash)
		fmt.Fprintf(&s, `<text x="%.1f" y="%d" text-anchor="middle" fill="#555">%.1f</text>`+"\n", x(t), y+16, t)
	}
	s.WriteString(rows.String())
	s.WriteString("</svg>\n")
	return s.String()
}
