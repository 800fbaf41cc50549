package semantics

import (
	"errors"
	"strings"
	"testing"
)

// A Consumed file is released once every instance of every step declaring it as an input
// has exited, not before; one committing after its consumers exited is released at once.
func TestConsumedFileIsReleasedAfterItsLastConsumer(t *testing.T) {
	e := engineYAML(t, `
steps:
- name: p
  outputs: [{path: "tmp/*", commit: {rule: OnClose}, lifetime: Consumed}, {path: keep, commit: {rule: OnClose}}]
- name: c
  replicas: 2
  inputs: ["tmp/*", keep]
- name: d
  inputs: ["tmp/a"]`)
	var released []string
	e.Observe(Observer{Release: func(st FileStatus) { released = append(released, st.Path) }})
	for _, p := range []string{"tmp/a", "tmp/b", "keep"} {
		e.Create(p, false)
		e.Close(p)
	}
	e.Terminate("c", 0)
	e.Terminate("d", 0)
	if len(released) != 0 {
		t.Fatalf("released %v while c[1] still runs", released)
	}
	e.Terminate("c", 1)
	if strings.Join(released, ",") != "tmp/a,tmp/b" && strings.Join(released, ",") != "tmp/b,tmp/a" {
		t.Errorf("released %v, want tmp/a and tmp/b (not keep, whose lifetime is Workflow)", released)
	}
	if !e.Status("tmp/a").Released || e.Status("keep").Released {
		t.Errorf("status: tmp/a %+v, keep %+v", e.Status("tmp/a"), e.Status("keep"))
	}
	e.Create("tmp/late", false)
	e.Close("tmp/late")
	if len(released) != 3 || released[2] != "tmp/late" {
		t.Errorf("a file committing after its consumers exited: released %v, want it at its commit", released)
	}
}

// A consumer instance that read a committed Consumed file to its end and closed it counts
// as done with it, as one that exited: the file is released once every instance of every
// declaring step is either.
func TestConsumedFileIsReleasedWhenReadToEnd(t *testing.T) {
	e := engineYAML(t, `
steps:
- name: p
  outputs: [{path: tmp, commit: {rule: OnClose}, lifetime: Consumed}]
- name: c
  replicas: 2
  inputs: [tmp]`)
	var released []string
	e.Observe(Observer{Release: func(st FileStatus) { released = append(released, st.Path) }})
	e.Create("tmp", false)
	e.ReadToEnd("tmp", "c", 0) // not committed yet: ignored
	e.Close("tmp")
	e.ReadToEnd("tmp", "p", 0) // not a consumer: ignored
	e.ReadToEnd("tmp", "c", 1)
	if len(released) != 0 {
		t.Fatalf("released %v while c[0] has not read it", released)
	}
	e.ReadToEnd("tmp", "c", 0)
	if len(released) != 1 || released[0] != "tmp" {
		t.Errorf("released %v, want tmp once both instances read it to its end", released)
	}
	e.Terminate("c", 0)
	e.Terminate("c", 1)
	if len(released) != 1 {
		t.Errorf("released %v: a file is released once", released)
	}
}

// A Consumed NoUpdate file being written is released from its start as every declared
// consumer instance reads past it (or exits), PunchStep at a time; a read of released
// bytes fails with ErrReleased.
func TestConsumedStreamIsReleasedAsItIsRead(t *testing.T) {
	e := engineYAML(t, `
steps:
- name: p
  outputs: [{path: s, commit: {rule: OnClose}, fire: NoUpdate, lifetime: Consumed}]
- name: c
  replicas: 2
  inputs: [s]`)
	var punched []int64
	e.Observe(Observer{Punch: func(p string, upto int64) { punched = append(punched, upto) }})
	e.Create("s", false)
	e.Write("s", 0, 8<<20)
	e.ReadProgress("s", "c", 0, 3<<20)
	if len(punched) != 0 {
		t.Fatalf("released %v while c[1] has read nothing", punched)
	}
	e.ReadProgress("s", "c", 1, 2<<20+100)
	if len(punched) != 1 || punched[0] != 2<<20 {
		t.Fatalf("released %v, want up to 2 MiB (c[1]'s progress, page-aligned)", punched)
	}
	e.ReadProgress("s", "c", 1, 2<<20+900000) // less than PunchStep further
	if len(punched) != 1 {
		t.Errorf("released %v after less than PunchStep more", punched)
	}
	if _, _, err := e.WaitRead(probe(), "s", 0, 4096); !errors.Is(err, ErrReleased) {
		t.Errorf("a read of released bytes: %v, want ErrReleased", err)
	}
	if n, _, err := e.WaitRead(probe(), "s", 0, 2<<20); err != nil || n != 6<<20 {
		t.Errorf("a read past the release: %d bytes, %v", n, err)
	}
	e.Terminate("c", 1) // c[1] needs nothing more: c[0] alone holds the release back
	if len(punched) != 2 || punched[1] != 3<<20 {
		t.Errorf("released %v after c[1] exited, want up to c[0]'s 3 MiB", punched)
	}
}
