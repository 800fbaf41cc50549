package runner

import "testing"

func TestExpand(t *testing.T) {
	vars := map[string]string{"A": "1", "DIR": "/data", "EMPTY": ""}
	lookup := func(k string) (string, bool) { v, ok := vars[k]; return v, ok }
	for in, want := range map[string]string{
		"$(A)":          "1",
		"x$(DIR)/y":     "x/data/y",
		"$$(A)":         "$(A)",
		"$(UNKNOWN)":    "$(UNKNOWN)",
		"$(EMPTY)z":     "z",
		"$A $ $(":       "$A $ $(",
		"no vars":       "no vars",
		"$(A)$(A)$$":    "11$",
		"trailing $":    "trailing $",
		"$()":           "$()",
		"a $(DIR) $$$$": "a /data $$",
	} {
		if got := expand(in, lookup); got != want {
			t.Errorf("expand(%q) = %q, want %q", in, got, want)
		}
	}
}
