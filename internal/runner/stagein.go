package runner

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"time"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/objstore"
	"github.com/sluice-io/sluice/internal/pathpattern"
	"github.com/sluice-io/sluice/internal/store"
)

// stageIn brings spec.sources into the volume on the first node, chunk by chunk through
// the same events a writing view produces, so the rules (and the transport) see the
// downloads as they happen; then it terminates the reserved stage-in step.
func (r *run) stageIn(ctx context.Context) (ir InstanceReport) {
	ir = InstanceReport{Step: v1alpha1.StageInStep, Start: time.Now(), Log: "-"}
	n := r.nodes[0]
	defer func() {
		ir.End = time.Now()
		n.terminate(v1alpha1.StageInStep, 0, ir.Error) // a failed stage-in fails its files' waits
	}()
	for i, src := range r.wf.Spec.Sources {
		objs, err := objstore.ListSource(ctx, src.From, src.Type == v1alpha1.FileTypeDirectory, r.opts.Credentials)
		if err != nil {
			ir.ExitCode, ir.Error = 1, fmt.Sprintf("spec.sources[%d]: %v", i, err)
			r.log.Error(err, "stage-in failed", "source", i)
			return ir
		}
		base, err := pathpattern.Clean(src.Path)
		if err != nil {
			ir.ExitCode, ir.Error = 1, fmt.Sprintf("spec.sources[%d].path: %v", i, err)
			return ir
		}
		if src.Type == v1alpha1.FileTypeDirectory {
			if err := r.stageDir(n, base); err != nil {
				ir.ExitCode, ir.Error = 1, err.Error()
				return ir
			}
		}
		for _, o := range objs {
			dest := base
			if o.Rel != "" {
				dest = path.Join(base, o.Rel)
			}
			k, err := r.stageFile(ctx, n, dest, o)
			ir.BytesOut += k
			if err != nil {
				ir.ExitCode, ir.Error = 1, fmt.Sprintf("spec.sources[%d] into %s: %v", i, dest, err)
				r.log.Error(err, "stage-in failed", "source", i, "path", dest)
				return ir
			}
		}
	}
	return ir
}

// stageDir creates a staged directory (and its parents) on node n.
func (r *run) stageDir(n *node, p string) error {
	if err := n.Store.MkdirAll(p); err != nil {
		return err
	}
	_ = n.Semantics().Create(p, true)
	return nil
}

// stager is what the stage-in tells of the files it writes: the writer's events, through
// store.Files, and each file's close.
type stager interface {
	store.Events
	Close(p string) error
}

// stageFile downloads one object into p on node n, reporting every chunk as written.
func (r *run) stageFile(ctx context.Context, n *node, p string, o objstore.SourceObject) (int64, error) {
	var sem stager = n.Semantics()
	files := n.Store.Files(sem)
	if parent := pathpattern.Parent(p); parent != "." {
		if err := n.Store.MkdirAll(parent); err != nil {
			return 0, err
		}
		// announce the directories (to the transport too, so other nodes make them)
		for d := parent; d != "."; d = pathpattern.Parent(d) {
			_ = sem.Create(d, true)
		}
	}
	f, err := files.Create(p)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	rc, err := o.Open(ctx)
	if err != nil {
		return 0, err
	}
	defer rc.Close()
	buf := make([]byte, 1<<20)
	var off int64
	for {
		k, rerr := io.ReadFull(rc, buf)
		if k > 0 {
			// Reserve, write, tell the engine and the transport.
			if _, err := files.WriteAt(ctx, p, int(f.Fd()), buf[:k], off); err != nil {
				return off, err
			}
			off += int64(k)
		}
		if errors.Is(rerr, io.EOF) || errors.Is(rerr, io.ErrUnexpectedEOF) {
			break
		}
		if rerr != nil {
			return off, rerr
		}
	}
	if off != o.Size {
		return off, fmt.Errorf("read %d bytes of %d", off, o.Size)
	}
	return off, sem.Close(p)
}
