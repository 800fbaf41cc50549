package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The image's binary is built with the toolchain go.mod names (issue 43: the golang
// image's GOTOOLCHAIN=local built it with 1.26.8, and its reachable standard-library
// vulnerabilities, despite go.mod's toolchain go1.26.10): the Dockerfile's build stage
// uses the golang image of exactly that version and lets the go command switch to
// go.mod's toolchain (GOTOOLCHAIN=auto) if they ever differ.
func TestImageBuildsWithGoModsToolchain(t *testing.T) {
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join("..", "..", name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	gomod, dockerfile := read("go.mod"), read("Dockerfile")
	m := regexp.MustCompile(`(?m)^toolchain go(\S+)$`).FindStringSubmatch(gomod)
	if m == nil {
		t.Fatal("go.mod names no toolchain")
	}
	want := m[1]
	from := regexp.MustCompile(`(?m)^FROM golang:(\S+) AS build$`).FindStringSubmatch(dockerfile)
	if from == nil || from[1] != want {
		t.Errorf("the Dockerfile builds FROM golang:%v, want golang:%s (go.mod's toolchain)", from, want)
	}
	env := regexp.MustCompile(`(?m)^ENV GOTOOLCHAIN=(\S+)$`).FindStringSubmatch(dockerfile)
	if env == nil || env[1] != "auto" {
		t.Errorf("the Dockerfile sets GOTOOLCHAIN %v, want auto (the golang image's local ignores go.mod)", env)
	}
	if i, j := strings.Index(dockerfile, "ENV GOTOOLCHAIN"), strings.Index(dockerfile, "RUN go mod download"); i < 0 || j < 0 || i > j {
		t.Error("GOTOOLCHAIN is not set before the first go command")
	}
}
