package semantics

import (
	"fmt"
	"runtime"
	"testing"
)

// TestEngineHoldsLittlePerCommittedFile bounds what the engine keeps of each committed
// small file (issue 41: at most 1 KiB of a node's memory per committed file, the engine,
// the store and the views together). A workflow of 10^6 small files holds its engine's
// record of every one of them until it ends, so a record that grows shows here first:
// the record, its key in the path index and its written range measure about 155 bytes
// now; they measured 266 before a plain file's record left out what only directories,
// Consumed files and failed files need (fileExtra).
func TestEngineHoldsLittlePerCommittedFile(t *testing.T) {
	const n = 20000
	const limit = 200 // bytes of heap a committed file's record may hold
	e := engineYAML(t, `
steps:
- name: p
  outputs: [{path: "data/*", commit: {rule: OnClose}}]
- name: c
  inputs: ["data/*"]`)
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("data/f%d", i) // made before the measure: the caller's strings
	}
	before := heapInUse()
	for _, p := range names {
		if err := e.Create(p, false); err != nil {
			t.Fatal(err)
		}
		if err := e.Write(p, 0, 1024); err != nil {
			t.Fatal(err)
		}
		if err := e.Close(p); err != nil {
			t.Fatal(err)
		}
	}
	per := float64(heapInUse()-before) / n
	if st := e.Status(names[n-1]); !st.Committed {
		t.Fatalf("%s is not committed: %+v", names[n-1], st)
	}
	if per > limit {
		t.Errorf("the engine holds %.0f bytes of heap per committed file, want at most %d", per, limit)
	}
	t.Logf("%.0f bytes of heap per committed file", per)
	runtime.KeepAlive(e)
	runtime.KeepAlive(names)
}

// heapInUse returns the bytes of heap in use after a collection.
func heapInUse() int64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}
