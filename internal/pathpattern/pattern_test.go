package pathpattern

import (
	"errors"
	"path"
	"testing"
)

func TestClean(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		err      error
	}{
		{"a/b", "a/b", nil},
		{"/tmp/file", "tmp/file", nil},
		{"./a//b/", "a/b", nil},
		{"/", ".", nil},
		{".", ".", nil},
		{"", "", ErrEmpty},
		{"a/../b", "", ErrDotDot},
		{"../x", "", ErrDotDot},
		{"a\x00b", "", ErrNUL},
		{"a\xffb", "", ErrBadUTF8},
	} {
		got, err := Clean(tc.in)
		if !errors.Is(err, tc.err) || got != tc.want {
			t.Errorf("Clean(%q) = %q, %v; want %q, %v", tc.in, got, err, tc.want, tc.err)
		}
	}
}

func TestMatch(t *testing.T) {
	for _, tc := range []struct {
		pat, name string
		want      bool
	}{
		{"chunks/*", "chunks/a", true},
		{"chunks/*", "chunks/a/b", false},
		{"chunks/*", "chunks", false},
		{"*.dat", "file_A.dat", true},
		{"*.dat", "dir/file_A.dat", false},
		{"file_?.dat", "file_A.dat", true},
		{"file_?.dat", "file_AB.dat", false},
		{"out[0-9].txt", "out7.txt", true},
		{"out[!0-9].txt", "out7.txt", false},
		{"out[^0-9].txt", "outx.txt", true},
		{"a\\*b", "a*b", true},
		{"a\\*b", "axb", false},
		{"*a*b*c", "xxaxxbxxc", true},
		{"*a*b*c", "xxaxxcxxb", false},
		{"/tmp/file", "tmp/file", true},
		{"[]]x", "]x", true},
		{"[a-]", "-", true},
	} {
		p, err := Parse(tc.pat)
		if err != nil {
			t.Fatalf("Parse(%q): %v", tc.pat, err)
		}
		if got := p.Match(tc.name); got != tc.want {
			t.Errorf("%q.Match(%q) = %v, want %v", tc.pat, tc.name, got, tc.want)
		}
	}
}

func TestParseErrors(t *testing.T) {
	for _, p := range []string{"a[b", "a[]", "x/[z-a]", "a\\", "../up"} {
		if _, err := Parse(p); err == nil {
			t.Errorf("Parse(%q) succeeded, want an error", p)
		}
	}
}

func TestMatchPrefix(t *testing.T) {
	p := MustParse("dir*")
	if got, ok := p.MatchPrefix("dir1/a/b"); !ok || got != "dir1" {
		t.Errorf("MatchPrefix = %q, %v; want dir1, true", got, ok)
	}
	if _, ok := p.MatchPrefix("other/dir1"); ok {
		t.Error("MatchPrefix matched a non-leading segment")
	}
}

func TestOverlaps(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want bool
	}{
		{"chunks/*", "chunks/a", true},
		{"chunks/*", "chunks", false},
		{"*.dat", "file_*", true},
		{"*.dat", "*.txt", false},
		{"a*", "*b", true},
		{"a*", "b*", false},
		{"[0-4]*", "[5-9]*", false},
		{"[0-5]*", "[5-9]*", true},
		{"[!a]x", "ax", false},
		{"[!a]x", "bx", true},
		{"?", "ab", false},
		{"??", "a*", true},
		{"x/*/y", "x/a/*", true},
		{"x/*/y", "x/a/z", false},
		{"*", "*", true},
	} {
		a, b := MustParse(tc.a), MustParse(tc.b)
		if got := Overlaps(a, b); got != tc.want {
			t.Errorf("Overlaps(%q, %q) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
		if got := Overlaps(b, a); got != tc.want {
			t.Errorf("Overlaps(%q, %q) = %v, want %v (not symmetric)", tc.b, tc.a, got, tc.want)
		}
	}
}

// FuzzMatch checks the matcher against the standard library's path.Match (same syntax
// for patterns without escapes at the end) and that Overlaps agrees with a witness: a path
// matched by two patterns means they overlap.
func FuzzMatch(f *testing.F) {
	for _, s := range [][3]string{
		{"chunks/*", "chunks/a", "chunks/?"},
		{"*a*b", "xab", "[a-c]*"},
		{"[!x]y", "zy", "?y"},
		{"a\\*", "a*", "*"},
	} {
		f.Add(s[0], s[1], s[2])
	}
	f.Fuzz(func(t *testing.T, pat, name, other string) {
		p, err := Parse(pat)
		if err != nil {
			return
		}
		cn, err := Clean(name)
		if err != nil {
			return
		}
		got := p.Match(cn)
		if want, err := path.Match(p.String(), cn); err == nil && cn != "." && p.String() != "." && want != got && !hasClassOrEscape(p.String()) {
			t.Fatalf("Match(%q, %q) = %v, path.Match says %v", p, cn, got, want)
		}
		q, err := Parse(other)
		if err != nil {
			return
		}
		if got && q.Match(cn) && !Overlaps(p, q) {
			t.Fatalf("%q and %q both match %q but Overlaps says no", p, q, cn)
		}
	})
}

// hasClassOrEscape reports whether a pattern uses syntax whose corner cases differ from
// path.Match ("[^...]" negation, escapes inside classes).
func hasClassOrEscape(s string) bool {
	for _, c := range s {
		if c == '[' || c == '\\' {
			return true
		}
	}
	return false
}

// Names with control characters or invalid UTF-8 are quoted; ordinary names are not.
func TestPrintable(t *testing.T) {
	for in, want := range map[string]string{
		"data/out.txt":   "data/out.txt",
		"données/é.txt":  "données/é.txt",
		"a\nINFO forged": `"a\nINFO forged"`,
		"esc\x1b[31m":    `"esc\x1b[31m"`,
		"bad\xff":        `"bad\xff"`,
	} {
		if got := Printable(in); got != want {
			t.Errorf("Printable(%q) = %s, want %s", in, got, want)
		}
	}
}
