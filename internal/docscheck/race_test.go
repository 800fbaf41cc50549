//go:build race

package docscheck

func init() { raceEnabled = true }
