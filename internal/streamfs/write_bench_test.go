package streamfs

import (
	"context"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/go-logr/logr"
	"sigs.k8s.io/yaml"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/semantics"
	"github.com/sluice-io/sluice/internal/store"
)

// BenchmarkHandleWrite measures the server's side of one FUSE WRITE of a governed file
// (handle.Write: the checks, the reservation, the pwrite, the engine's Write), without
// the kernel: what every write(2) through a view costs above the store's own pwrite.
func BenchmarkHandleWrite(b *testing.B) {
	var spec v1alpha1.WorkflowSpec
	if err := yaml.UnmarshalStrict([]byte("steps:\n- name: p\n  outputs:\n  - {path: f, commit: {rule: OnClose}}\n"), &spec); err != nil {
		b.Fatal(err)
	}
	rs, errs, _ := semantics.Compile(context.Background(), &spec)
	if len(errs) > 0 {
		b.Fatalf("Compile: %v", errs.ToAggregate())
	}
	st, err := store.New(filepath.Join(b.TempDir(), "store"), store.Options{})
	if err != nil {
		b.Fatal(err)
	}
	eng := semantics.NewEngine(rs)
	v := newBenchView(st, eng)
	fd, err := st.Open("f", syscall.O_CREAT|syscall.O_RDWR, 0o644)
	if err != nil {
		b.Fatal(err)
	}
	defer syscall.Close(fd)
	_ = eng.Create("f", false)
	h := &handle{n: &node{v: v}, fd: fd, write: true}
	v.names.register(h, "f")
	data := make([]byte, 128<<10)
	const span = 64 << 20 // rewrite the same 64 MiB: the store stays small
	ctx := context.Background()
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		off := int64(i*len(data)) % span
		if _, errno := h.Write(ctx, data, off); errno != 0 {
			b.Fatalf("write at %d: %v", off, errno)
		}
	}
}

// newBenchView is a View over st and eng that mounts nothing: enough for handle.Write.
func newBenchView(st *store.Store, eng *semantics.Engine) *View {
	return &View{store: st, sem: eng, files: st.Files(eng), anon: st.Files(nil), rules: eng.Rules(), opts: Options{Step: "p", Log: logr.Discard()}}
}
