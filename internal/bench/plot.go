package bench

import (
	"fmt"
	"image/color"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// Plot writes a PNG bar chart of every pattern's speed-up over batch-s3 per mode: the
// median makespan of batch-s3 divided by the mode's median, with a whisker from the
// mode's slowest run to its fastest (batch-s3's median / max … / min).
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
	modes := Modes
	p := plot.New()
	p.Title.Text = title
	p.Y.Label.Text = "speed-up over batch-s3 (median, min–max)"
	w := vg.Points(8)
	for i, m := range modes {
		vals := make(plotter.Values, len(patterns))
		lo, hi := make([]float64, len(patterns)), make([]float64, len(patterns))
		drawn := false
		for j, pat := range patterns {
			for _, r := range results {
				if r.Pattern == pat && r.Mode == string(m) && base[pat] > 0 {
					vals[j] = base[pat] / r.Median().Seconds()
					lo[j], hi[j] = base[pat]/r.Max().Seconds(), base[pat]/r.Min().Seconds()
					drawn = true
				}
			}
		}
		if !drawn {
			continue
		}
		bars, err := plotter.NewBarChart(vals, w)
		if err != nil {
			return err
		}
		bars.Color = modeColors[m]
		bars.LineStyle.Width = 0
		bars.Offset = w * vg.Length(2*i-len(modes)+1) / 2
		p.Add(bars, &whiskers{lo: lo, hi: hi, offset: bars.Offset, cap: w / 3})
		p.Legend.Add(string(m), bars)
	}
	p.Legend.Top = true
	p.Legend.Left = true
	p.Y.Max *= 1.45 // room above the tallest whisker for the legend (Add set the range)
	p.NominalX(patterns...)
	if err := p.Save(10*vg.Inch, 4.5*vg.Inch, path); err != nil {
		return fmt.Errorf("writing plot %s: %w", path, err)
	}
	return nil
}

// modeColors is the bar colour of each mode: greys for the batch baselines, one hue per
// Sluice mode.
var modeColors = map[Mode]color.RGBA{
	BatchLocal:      {150, 150, 150, 255},
	BatchS3:         {90, 90, 90, 255},
	BatchRclone:     {40, 40, 40, 255},
	SluiceUpdate:    {66, 133, 244, 255},
	SluiceNoUpdate:  {15, 157, 88, 255},
	SluiceUpdate2:   {160, 100, 220, 255},
	SluiceNoUpdate2: {244, 160, 0, 255},
	SluiceNoUpdate4: {219, 68, 55, 255},
}

// whiskers draws, for category j, a vertical line from lo[j] to hi[j] with caps, offset
// from the category's centre as the bar it belongs to (a zero range draws nothing).
type whiskers struct {
	lo, hi      []float64
	offset, cap vg.Length
}

// Plot implements plot.Plotter.
func (wh *whiskers) Plot(c draw.Canvas, plt *plot.Plot) {
	trX, trY := plt.Transforms(&c)
	style := draw.LineStyle{Color: color.Black, Width: vg.Points(0.7)}
	for j := range wh.lo {
		if wh.hi[j] <= wh.lo[j] {
			continue
		}
		x := trX(float64(j)) + wh.offset
		y0, y1 := trY(wh.lo[j]), trY(wh.hi[j])
		c.StrokeLine2(style, x, y0, x, y1)
		c.StrokeLine2(style, x-wh.cap, y0, x+wh.cap, y0)
		c.StrokeLine2(style, x-wh.cap, y1, x+wh.cap, y1)
	}
}

// DataRange implements plot.DataRanger, so that the Y axis includes the fastest runs.
func (wh *whiskers) DataRange() (xmin, xmax, ymin, ymax float64) {
	xmax = float64(len(wh.lo) - 1)
	for j := range wh.lo {
		ymax = max(ymax, wh.hi[j])
	}
	return 0, xmax, 0, ymax
}
