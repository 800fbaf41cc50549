package bench

import (
	"fmt"
	"image/color"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// Plot writes a PNG bar chart of every pattern's speed-up over batch-s3 per mode: the
// median makespan of batch-s3 divided by the mode's (min–max are in results.csv).
func Plot(path, title string, results []Result) error {
	var patterns []string
	seen := map[string]bool{}
	base := map[string]float64{}
	for _, r := range results {
		if !seen[r.Pattern] {
			seen[r.Pattern] = true
			patterns = append(patterns, r.Pattern)
		}
		if r.Mode == string(BatchS3) {
			base[r.Pattern] = r.Median().Seconds()
		}
	}
	modes := []Mode{BatchLocal, BatchS3, SluiceUpdate, SluiceNoUpdate, SluiceNoUpdate2}
	colors := []color.RGBA{{150, 150, 150, 255}, {90, 90, 90, 255}, {66, 133, 244, 255}, {15, 157, 88, 255}, {244, 160, 0, 255}}
	p := plot.New()
	p.Title.Text = title
	p.Y.Label.Text = "speed-up over batch-s3 (median makespans)"
	w := vg.Points(9)
	for i, m := range modes {
		vals := make(plotter.Values, len(patterns))
		any := false
		for j, pat := range patterns {
			for _, r := range results {
				if r.Pattern == pat && r.Mode == string(m) && base[pat] > 0 {
					med := base[pat] / r.Median().Seconds()
					vals[j] = med
					any = true
				}
			}
		}
		if !any {
			continue
		}
		bars, err := plotter.NewBarChart(vals, w)
		if err != nil {
			return err
		}
		bars.Color = colors[i]
		bars.LineStyle.Width = 0
		bars.Offset = w * vg.Length(i-len(modes)/2)
		p.Add(bars)
		p.Legend.Add(string(m), bars)
	}
	p.Legend.Top = true
	p.NominalX(patterns...)
	if err := p.Save(9*vg.Inch, 4.5*vg.Inch, path); err != nil {
		return fmt.Errorf("writing plot %s: %w", path, err)
	}
	return nil
}
