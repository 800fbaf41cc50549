package semantics

import (
	"context"
	"errors"
	"sync"
	"testing"
)

// Every commit rule under both firing rules: what a reader may do before and after the
// event that commits the file.
func TestCommitRulesTimesFiringRules(t *testing.T) {
	type step struct {
		name string
		do   func(e *Engine)
	}
	cases := []struct {
		name string
		spec string
		// events before commit; after them the file must not yet be committed
		before []step
		// the event that commits it
		commit step
	}{
		{
			name: "OnClose:1",
			spec: `
steps:
- name: p
  outputs: [{path: f, commit: {rule: OnClose}, fire: FIRE}]
- name: c
  inputs: [f]`,
			before: []step{{"create", func(e *Engine) { e.Create("f", false) }}, {"write", func(e *Engine) { e.Write("f", 0, 10) }}},
			commit: step{"close", func(e *Engine) { e.Close("f") }},
		},
		{
			name: "OnClose:3 summed over writers",
			spec: `
steps:
- name: p
  replicas: 3
  outputs: [{path: f, commit: {rule: OnClose, count: 3}, fire: FIRE}]`,
			before: []step{
				{"create", func(e *Engine) { e.Create("f", false) }},
				{"write", func(e *Engine) { e.Write("f", 0, 10) }},
				{"close by writer 1", func(e *Engine) { e.Close("f") }},
				{"close by writer 2", func(e *Engine) { e.Close("f") }},
			},
			commit: step{"close by writer 3", func(e *Engine) { e.Close("f") }},
		},
		{
			name: "OnTermination of all replicas",
			spec: `
steps:
- name: p
  replicas: 2
  outputs: [{path: f, fire: FIRE}]`,
			before: []step{
				{"create", func(e *Engine) { e.Create("f", false) }},
				{"write", func(e *Engine) { e.Write("f", 0, 10) }},
				{"close", func(e *Engine) { e.Close("f") }},
				{"instance 0 exits", func(e *Engine) { e.Terminate("p", 0) }},
				{"instance 0 exits again", func(e *Engine) { e.Terminate("p", 0) }},
			},
			commit: step{"instance 1 exits", func(e *Engine) { e.Terminate("p", 1) }},
		},
		{
			name: "OnTermination:1 of 3",
			spec: `
steps:
- name: p
  replicas: 3
  outputs: [{path: f, commit: {rule: OnTermination, count: 1}, fire: FIRE}]`,
			before: []step{{"create", func(e *Engine) { e.Create("f", false) }}, {"write", func(e *Engine) { e.Write("f", 0, 10) }}},
			commit: step{"instance 2 exits", func(e *Engine) { e.Terminate("p", 2) }},
		},
		{
			name: "OnFile",
			spec: `
steps:
- name: p
  outputs:
  - {path: f, commit: {rule: OnFile, files: [done]}, fire: FIRE}
  - {path: done, commit: {rule: OnClose}}`,
			before: []step{
				{"create", func(e *Engine) { e.Create("f", false) }},
				{"write", func(e *Engine) { e.Write("f", 0, 10) }},
				{"close", func(e *Engine) { e.Close("f") }},
				{"create dep", func(e *Engine) { e.Create("done", false) }},
			},
			commit: step{"dep closes", func(e *Engine) { e.Close("done") }},
		},
	}
	for _, tc := range cases {
		for _, fire := range []string{"Update", "NoUpdate"} {
			t.Run(tc.name+"/"+fire, func(t *testing.T) {
				e := engineYAML(t, replaceFire(tc.spec, fire))
				opened := waitAsync(func() error { _, err := e.WaitOpen(context.Background(), "f"); return err })
				eof := waitAsync(func() error {
					for off := int64(0); ; {
						n, eof, err := e.WaitRead(context.Background(), "f", 0, off)
						if err != nil || eof {
							return err
						}
						off += n
					}
				})
				for _, s := range tc.before {
					s.do(e)
				}
				st := e.Status("f")
				if st.Committed {
					t.Fatalf("committed before %q", tc.commit.name)
				}
				if st.Size != 10 {
					t.Errorf("size before commit = %d, want 10 (stat shows what is written)", st.Size)
				}
				_, err := e.WaitOpen(probe(), "f")
				if fire == "Update" && !blocked(err) {
					t.Errorf("Update: open before commit did not block (err=%v)", err)
				}
				if fire == "NoUpdate" {
					if err != nil {
						t.Errorf("NoUpdate: open of a written file blocked: %v", err)
					}
					if n, eof := readableNow(e, "f", 0); n != 10 || eof {
						t.Errorf("NoUpdate: Readable(0) = %d, %v before commit; want 10, false", n, eof)
					}
					if n, eof := readableNow(e, "f", 10); n != 0 || eof {
						t.Errorf("NoUpdate: Readable(10) = %d, %v before commit; want 0, false (no EOF before commit)", n, eof)
					}
				} else if n, eof := readableNow(e, "f", 0); n != 0 || eof {
					t.Errorf("Update: Readable(0) = %d, %v before commit; want 0, false", n, eof)
				}
				select {
				case err := <-eof:
					t.Fatalf("reader saw EOF before commit (err=%v)", err)
				default:
				}
				tc.commit.do(e)
				if !e.Status("f").Committed {
					t.Fatalf("not committed after %q", tc.commit.name)
				}
				if err := mustReturn(t, opened, "open"); err != nil {
					t.Errorf("open after commit: %v", err)
				}
				if err := mustReturn(t, eof, "read to EOF"); err != nil {
					t.Errorf("read after commit: %v", err)
				}
				if n, eof := readableNow(e, "f", 4); n != 6 || eof {
					t.Errorf("Readable(4) after commit = %d, %v; want 6, false", n, eof)
				}
				if err := e.Write("f", 10, 1); !errors.Is(err, ErrCommitted) {
					t.Errorf("write after commit: err = %v, want ErrCommitted", err)
				}
			})
		}
	}
}

func replaceFire(spec, fire string) string {
	out := []byte{}
	for i := 0; i < len(spec); i++ {
		if i+4 <= len(spec) && spec[i:i+4] == "FIRE" {
			out = append(out, fire...)
			i += 3
			continue
		}
		out = append(out, spec[i])
	}
	return string(out)
}

func TestDirectoryOnNFiles(t *testing.T) {
	for _, fire := range []string{"Update", "NoUpdate"} {
		t.Run(fire, func(t *testing.T) {
			e := engineYAML(t, replaceFire(`
steps:
- name: split
  outputs:
  - {path: chunks, type: Directory, commit: {rule: OnNFiles, count: 2}, fire: FIRE}
  - {path: "chunks/*", commit: {rule: OnClose}}`, fire))
			listed := waitAsync(func() error { _, err := e.WaitDir(context.Background(), "chunks"); return err })
			e.Create("chunks", true)
			e.Create("chunks/a", false)
			e.Write("chunks/a", 0, 3)
			if got := e.Visible("chunks/a"); got != (fire == "NoUpdate") {
				t.Errorf("entry visible before commit = %v under %s", got, fire)
			}
			e.Close("chunks/a")
			if !e.Visible("chunks/a") {
				t.Error("committed entry not visible")
			}
			// the entry's own rule (chunks/* OnClose, Update) overrides the directory's
			if _, err := e.WaitOpen(probe(), "chunks/a"); err != nil {
				t.Errorf("open of a committed entry: %v", err)
			}
			e.Create("chunks/b", false)
			if dirComplete(e, "chunks") {
				t.Fatal("directory complete with 1 of 2 files committed")
			}
			if st := e.Status("chunks"); st.Entries != 2 || st.CommittedEntries != 1 {
				t.Errorf("entries = %d committed %d, want 2 and 1", st.Entries, st.CommittedEntries)
			}
			e.Close("chunks/b")
			if err := mustReturn(t, listed, "listing"); err != nil {
				t.Fatal(err)
			}
			if !dirComplete(e, "chunks") {
				t.Error("directory not complete after 2 commits")
			}
		})
	}
}

func TestFileInDirectoryInheritsItsRule(t *testing.T) {
	e := engineYAML(t, `
steps:
- name: p
  outputs: [{path: out, type: Directory, commit: {rule: OnClose, count: 2}, fire: NoUpdate}]`)
	res := e.Rules().Resolve("out/x")
	if res.Dir != "out" || res.Commit != "OnClose" || res.Count != 2 || res.Fire != "NoUpdate" {
		t.Fatalf("Resolve(out/x) = %+v; want the directory's OnClose:2 NoUpdate", res)
	}
	e.Create("out", true)
	e.Create("out/x", false)
	e.Close("out/x")
	if e.Status("out/x").Committed {
		t.Fatal("committed after 1 of 2 closes")
	}
	e.Close("out/x")
	if !e.Status("out/x").Committed {
		t.Fatal("not committed after 2 closes")
	}
	if dirComplete(e, "out") {
		t.Fatal("OnClose directory complete before its producers exited")
	}
	e.Terminate("p", 0)
	if !dirComplete(e, "out") {
		t.Fatal("OnClose directory not complete after its producers exited")
	}
}

func TestOnNFilesDirectoryEntriesDefaultToOnTermination(t *testing.T) {
	e := engineYAML(t, `
steps:
- name: p
  replicas: 2
  outputs: [{path: d, type: Directory, commit: {rule: OnNFiles, count: 1}}]`)
	res := e.Rules().Resolve("d/x")
	if res.Commit != "OnTermination" || res.Count != 2 {
		t.Fatalf("Resolve(d/x) = %s:%d, want OnTermination:2", res.Commit, res.Count)
	}
}

func TestOnFileChain(t *testing.T) {
	e := engineYAML(t, `
steps:
- name: p
  outputs:
  - {path: a, commit: {rule: OnClose}}
  - {path: b, commit: {rule: OnFile, files: [a]}}
  - {path: c, commit: {rule: OnFile, files: [b]}}`)
	var mu sync.Mutex
	var order []string
	e.Observe(Observer{Commit: func(st FileStatus) { mu.Lock(); order = append(order, st.Path); mu.Unlock() }})
	for _, f := range []string{"a", "b", "c"} {
		e.Create(f, false)
	}
	if e.Status("c").Committed {
		t.Fatal("c committed before a")
	}
	e.Close("a")
	for _, f := range []string{"a", "b", "c"} {
		if !e.Status(f).Committed {
			t.Errorf("%s not committed after a closed", f)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(order) != 3 || order[0] != "a" || order[1] != "b" || order[2] != "c" {
		t.Errorf("commit order = %v, want [a b c]", order)
	}
}

func TestOnFileCreatedAfterItsDependencyCommits(t *testing.T) {
	e := engineYAML(t, `
steps:
- name: p
  outputs:
  - {path: a, commit: {rule: OnClose}}
  - {path: b, commit: {rule: OnFile, files: [a]}, fire: NoUpdate}`)
	e.Create("a", false)
	e.Close("a")
	e.Create("b", false)
	if !e.Status("b").Committed {
		t.Error("b not committed at creation although its dependency is committed")
	}
}
