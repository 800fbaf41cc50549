package handoff

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"testing"
	"time"
)

// A sidecar stopped while its plugin does not answer yet must not retry for the whole
// attach wait: Attach returns with ctx's error once ctx is done.
func TestAttachReturnsWhenContextIsDone(t *testing.T) {
	for _, tc := range []struct {
		name   string
		listen bool // a socket that accepts and never answers; else no socket at all
	}{{"no socket", false}, {"silent plugin", true}} {
		t.Run(tc.name, func(t *testing.T) {
			sock := filepath.Join(t.TempDir(), SocketName)
			if tc.listen {
				l, err := net.Listen("unix", sock)
				if err != nil {
					t.Fatal(err)
				}
				defer l.Close()
				go func() {
					for {
						c, err := l.Accept()
						if err != nil {
							return
						}
						defer c.Close() // held open, unanswered, until the listener closes
					}
				}()
			}
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(100*time.Millisecond, cancel)
			start := time.Now()
			_, err := Attach(ctx, sock, 2*time.Minute)
			if took := time.Since(start); took > 5*time.Second {
				t.Fatalf("Attach returned after %v, want soon after its context was cancelled", took)
			}
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("Attach: %v, want an error wrapping context.Canceled", err)
			}
		})
	}
}
