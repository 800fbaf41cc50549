// Package streamfs is the streaming filesystem: a FUSE filesystem (go-fuse) that serves a
// node store to one step instance (its "pod view") and makes open(), read() and readdir()
// wait exactly as the workflow's commit and firing rules say. Beyond the rules it behaves
// as a local file system (posix.go): the kernel checks permissions against the owners and
// modes a view reports (default_permissions), with hard links, special files and user
// xattrs where the rules allow them.
//
// Every view of a node serves the same store directory: a consumer reads the very bytes
// its producer wrote, nothing is copied between views. Which files exist, how much of them
// may be read and when they commit is answered by a Semantics (the semantics engine of the
// node, or a transport that extends it across nodes).
//
// Close counting: a close is counted when the kernel releases a file handle opened for
// writing (FUSE RELEASE), i.e. once per open() whatever dup() or fork() did with the
// descriptor, not at every FLUSH. A rename onto a governed name counts as one close.
package streamfs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/moby/sys/mountinfo"

	"github.com/go-logr/logr"
	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/sluice-io/sluice/internal/capability"
	"github.com/sluice-io/sluice/internal/filestate"
	"github.com/sluice-io/sluice/internal/inflight"
	"github.com/sluice-io/sluice/internal/pathpattern"
	"github.com/sluice-io/sluice/internal/semantics"
	"github.com/sluice-io/sluice/internal/store"
	"github.com/sluice-io/sluice/internal/takeover"
)

// Options configure a view.
type Options struct {
	// Step and Instance identify the step instance the view serves; the step decides which
	// paths the view may write (its outputs) and where it waits (everything else governed).
	Step     string
	Instance int // 0-based
	// WaitTimeout bounds each wait on one file (open, read, readdir, stat); 0 means 1h.
	WaitTimeout time.Duration
	// CommittedTimeout is the kernel attribute and entry cache lifetime of committed
	// (immutable) files; 0 means 1h.
	CommittedTimeout time.Duration
	// Log receives one line per failed wait, naming the file, its rule and what the reader
	// waited for.
	Log logr.Logger
	// EntryBudget bounds the regular files the kernel keeps a node of in this view
	// (entries.go): past it, the least recently looked up are forgotten. 0 means 8192;
	// a negative value, no bound.
	EntryBudget int
	// RequestLog, when set, receives every FUSE request and reply in go-fuse's debug
	// format, a line each ("rx 12: LOOKUP n1 ..."): very verbose and slow, for tests that
	// count the requests a program makes (RequestCounts).
	RequestLog io.Writer

	// Device, when set, is an already mounted /dev/fuse descriptor to serve instead of
	// mounting (the CSI node plugin mounts and hands it over); the mountpoint argument of
	// Mount then only names the view. The mount belongs to whoever mounted it: Unmount
	// stops serving and leaves it in place.
	Device *os.File
	// Init is the INIT request of Device when an earlier server answered it already (a
	// restarted sidecar). Nil means Device is fresh: its INIT is read from it and given
	// to SaveInit, to keep for the servers after this one, before it is answered.
	Init []byte
	// SaveInit keeps a fresh Device's INIT request (see Init).
	SaveInit func(init []byte) error
	// Passthrough says whether the kernel may serve I/O from the store file itself
	// (PassthroughMode); the zero value is PassthroughAuto.
	Passthrough PassthroughMode

	// NodeLog, with Device, is a file where the view records the path of each placeholder
	// node it gives the kernel (a name not visible yet, whose node ID is not a store
	// inode), and where a later server of the same mount finds them: a reader parked in
	// open() of such a name across a restart is then answered by the new server. It must
	// survive the sidecar (the node store's state directory does). Empty: not recorded.
	NodeLog string
}

// PassthroughMode says when a view lets the kernel serve a file's I/O from the store file
// itself, without the server (FUSE passthrough, Linux >= 6.9, FUSE_DEV_IOC_BACKING_OPEN,
// which needs CAP_SYS_ADMIN): reads of committed files, and reads and writes of files no
// rule governs (docs/semantics.md, "The fast path").
type PassthroughMode string

const (
	// PassthroughAuto uses passthrough where the kernel offers it and the process may
	// register backing files, and serves every request otherwise. The default.
	PassthroughAuto PassthroughMode = "auto"
	// PassthroughOn is PassthroughAuto that fails Mount where passthrough is not
	// available, instead of falling back.
	PassthroughOn PassthroughMode = "on"
	// PassthroughOff serves every read and write in the server: the view does not
	// negotiate FUSE_PASSTHROUGH with the kernel at all.
	PassthroughOff PassthroughMode = "off"
)

// ParsePassthroughMode parses a --passthrough flag value: "auto" (or ""), "on" or "off".
// Any other value is an error naming it.
func ParsePassthroughMode(s string) (PassthroughMode, error) {
	switch m := PassthroughMode(s); m {
	case "":
		return PassthroughAuto, nil
	case PassthroughAuto, PassthroughOn, PassthroughOff:
		return m, nil
	}
	return "", fmt.Errorf("passthrough mode %q: want auto, on or off", s)
}

// String returns the mode's flag value; the zero value is "auto".
func (m PassthroughMode) String() string {
	if m == "" {
		return string(PassthroughAuto)
	}
	return string(m)
}

// Set parses a flag value into m (ParsePassthroughMode), so that a *PassthroughMode is a
// command-line flag value (pflag.Value, flag.Value).
func (m *PassthroughMode) Set(s string) error {
	v, err := ParsePassthroughMode(s)
	if err != nil {
		return err
	}
	*m = v
	return nil
}

// Type names the flag value's type in help text (pflag.Value).
func (*PassthroughMode) Type() string { return "auto|on|off" }

// View is one mounted pod view of a node store.
type View struct {
	store *store.Store
	sem   filestate.Semantics
	fetch filestate.Fetcher // nil: every byte is written on this node
	// files is how the view changes the store (store.Files): every write, truncation,
	// rename and removal of a named file, told to sem; anon is the same for O_TMPFILE
	// files without a name (tmpfile), which no rule sees.
	files *store.Files
	anon  *store.Files
	rules *semantics.RuleSet
	opts  Options

	ctx    context.Context // cancelled when the view shuts down: every wait ends
	cancel context.CancelFunc
	server *fuse.Server
	root   *node
	mnt    string

	bytesRead, bytesWritten atomic.Int64
	noInodes                atomic.Int64 // names refused for a tier out of inodes (makeErrno)
	bytesPassedThrough      atomic.Int64 // see Stats.BytesWrittenPassthrough
	bytesOpenedPassthrough  atomic.Int64 // see Stats.BytesOpenedPassthrough
	firstInput              atomic.Int64 // unix nanos
	blocked, blockedNanos   atomic.Int64
	placeholders            *takeover.NodeLog           // node IDs of names not visible yet (Options.NodeLog)
	pages                   *pageReads                  // recognises page-cache READs (see pageReads)
	dirs                    dirTimes                    // governed directories' times as first shown (consumers)
	entries                 *kernelEntries              // the regular files the kernel holds nodes of (entries.go)
	notifier                atomic.Pointer[fuse.Server] // server, for notifications from request handlers' goroutines

	writers inflight.Count // open write handles
	names   openNames      // the names of the open handles, which renames carry along

	bmu         sync.Mutex
	blockedCh   chan struct{} // closed and replaced when the number of blocked requests changes
	waits       map[*Wait]*Wait
	created     map[string]bool   // files this view created and has not renamed or removed
	inputs      map[uint64]string // Generations of the governed files its consumers opened, and their paths
	passthrough atomic.Bool       // see Passthrough; set once the server runs
	waitHist    WaitHistogram
	failedWaits []FailedWait // the most recent, at most maxFailedWaits
	refused     []Refusal    // the most recent, at most maxFailedWaits
}

// Mount mounts a view of st at mountpoint. mountpoint may also be "/dev/fd/N" to serve an
// already mounted /dev/fuse descriptor (the CSI driver hands the sidecar one). The caller
// must call Unmount.
func Mount(mountpoint string, st *store.Store, sem filestate.Semantics, opts Options) (*View, error) {
	if opts.WaitTimeout <= 0 {
		opts.WaitTimeout = time.Hour
	}
	if opts.CommittedTimeout <= 0 {
		opts.CommittedTimeout = time.Hour
	}
	if opts.Log.GetSink() == nil {
		opts.Log = logr.Discard()
	}
	if _, err := ParsePassthroughMode(string(opts.Passthrough)); err != nil {
		return nil, fmt.Errorf("mounting view of step %s[%d]: %w", opts.Step, opts.Instance, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	v := &View{store: st, sem: sem, rules: sem.Rules(), opts: opts, ctx: ctx, cancel: cancel, mnt: mountpoint, waits: map[*Wait]*Wait{}, created: map[string]bool{}, inputs: map[uint64]string{}}
	v.fetch, _ = sem.(filestate.Fetcher)
	v.files, v.anon = st.Files(sem), st.Files(nil)
	v.root = &node{v: v}
	v.entries = newKernelEntries(opts.EntryBudget)
	fsOpts := &fs.Options{
		MountOptions: fuse.MountOptions{
			FsName:       "sluice",
			Name:         "sluice",
			DirectMount:  true,
			AllowOther:   true,
			MaxWrite:     1 << 20,
			MaxReadAhead: 1 << 20,
			// Reads answer with bytes already in memory (ReadResultData): splice has
			// nothing to move, and go-fuse would still grow a pipe per read, failing and
			// logging for every read over 1 MiB minus the header.
			DisableSplice: true,
			Debug:         opts.RequestLog != nil,
			// A consumer's handle of a file not committed at its open uses direct I/O
			// (node.Open); the kernel maps such a handle with MAP_SHARED only when this
			// is negotiated (Linux >= 6.6; ENODEV otherwise). Its pages are then read
			// through the page cache: refused before the commit, served after it
			// (handle.Read), so an input read to its commit can be mapped.
			ExtraCapabilities: fuse.CAP_DIRECT_IO_ALLOW_MMAP,
		},
		// Timeouts are set per reply: long for committed files, zero for the rest.
		NullPermissions: true,
		// Node IDs are the store's inode numbers: the same in every life of the server, so
		// that a restarted sidecar (Options.Device) never hands the kernel an ID it already
		// holds for another file.
		ExternalNodeID: true,
	}
	if opts.Passthrough == PassthroughOff {
		fsOpts.MountOptions.DisabledCapabilities |= fuse.CAP_PASSTHROUGH
	}
	if opts.RequestLog != nil {
		fsOpts.MountOptions.Logger = log.New(opts.RequestLog, "", 0)
	}
	if owners := st.Owners(); owners != store.OwnersNone {
		// The kernel checks every access against the owner and mode a view reports, as
		// on a local file system; the server no longer has to look at the caller.
		fsOpts.MountOptions.Options = append(fsOpts.MountOptions.Options, "default_permissions")
	} else if opts.Device == nil {
		opts.Log.Info("node store keeps no owners: the view is mounted without default_permissions, every step may access every file", "dir", st.Dir())
	}
	var server *fuse.Server
	var err error
	if opts.Device != nil {
		if v.placeholders, err = takeover.OpenNodeLog(opts.NodeLog, opts.Log); err != nil {
			cancel()
			return nil, err
		}
		server, err = serveDevice(v, fsOpts, opts)
	} else {
		v.pages = &pageReads{RawFileSystem: fs.NewNodeFS(v.root, fsOpts), backings: newBackings()}
		// fs.Mount, with the bridge wrapped.
		if server, err = fuse.NewServer(v.pages, mountpoint, &fsOpts.MountOptions); err == nil {
			go server.Serve()
			err = server.WaitMount()
		}
	}
	if err != nil {
		cancel()
		return nil, fmt.Errorf("mounting view of step %s[%d] at %s: %w", opts.Step, opts.Instance, mountpoint, err)
	}
	v.server = server
	v.notifier.Store(server)
	// A kept backing registration of a file the store unlinks would hold its pages
	// (backing.go): let it go first.
	st.OnUnlink(func(ino uint64) {
		if v.ctx.Err() == nil {
			v.pages.backings.forget(server, ino)
		}
	})
	offered := server.KernelSettings().Flags64()&fuse.CAP_PASSTHROUGH != 0
	admin, _ := capability.Effective(capability.SysAdmin)
	v.passthrough.Store(offered && admin && opts.Passthrough != PassthroughOff)
	if opts.Passthrough == PassthroughOn && !v.passthrough.Load() {
		_ = v.Unmount()
		return nil, fmt.Errorf("mounting view of step %s[%d] at %s: FUSE passthrough is required (passthrough mode on) but not available: kernel offers it %v (Linux >= 6.9), CAP_SYS_ADMIN %v", opts.Step, opts.Instance, mountpoint, offered, admin)
	}
	if err := closeOnExecFUSE(); err != nil {
		_ = v.Unmount()
		return nil, err
	}
	return v, nil
}

// DetachStale lazily unmounts every FUSE mount under dir, such as the views a killed
// runner left behind (their connections are dead: every access fails with ENOTCONN). It
// returns the mount points it detached.
func DetachStale(dir string) ([]string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	infos, err := mountinfo.GetMounts(mountinfo.PrefixFilter(abs))
	if err != nil {
		return nil, fmt.Errorf("reading mount table: %w", err)
	}
	var detached []string
	for _, m := range infos {
		if !strings.HasPrefix(m.FSType, "fuse") {
			continue
		}
		if err := syscall.Unmount(m.Mountpoint, syscall.MNT_DETACH); err != nil {
			return detached, fmt.Errorf("detaching stale mount %s: %w", m.Mountpoint, err)
		}
		detached = append(detached, m.Mountpoint)
	}
	return detached, nil
}

// closeOnExecFUSE marks every /dev/fuse descriptor of this process close-on-exec. go-fuse
// opens the device without O_CLOEXEC; a descriptor inherited by a workflow's process would
// keep the connection alive after this process dies, leaving readers hung instead of
// getting ENOTCONN. A descriptor closed between the listing and the mark (another view
// of the process unmounting) is skipped; one whose number was reused meanwhile is marked
// too, which only keeps it from children that were not handed it.
func closeOnExecFUSE() error {
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return fmt.Errorf("listing descriptors: %w", err)
	}
	for _, e := range fds {
		target, err := os.Readlink("/proc/self/fd/" + e.Name())
		if err != nil || target != "/dev/fuse" {
			continue
		}
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFD, unix.FD_CLOEXEC); err != nil {
			if errors.Is(err, unix.EBADF) {
				continue // closed meanwhile: another view of this process unmounted
			}
			return fmt.Errorf("setting close-on-exec on /dev/fuse descriptor %d: %w", fd, err)
		}
	}
	return nil
}

// Mountpoint returns where the view is mounted.
func (v *View) Mountpoint() string { return v.mnt }

// WaitWritersClosed blocks until no file handle opened for writing through the view is
// open, so that every close of an exited process has been counted, or ctx is done.
func (v *View) WaitWritersClosed(ctx context.Context) error {
	if err := v.writers.Wait(ctx); err != nil {
		return fmt.Errorf("%d write handles still open in view %s[%d]: %w", v.writers.N(), v.opts.Step, v.opts.Instance, err)
	}
	return nil
}

// serveDevice starts serving a handed-over /dev/fuse descriptor (Options.Device), taking
// over from an earlier server of the mount when there was one (package takeover).
func serveDevice(v *View, fsOpts *fs.Options, opts Options) (*fuse.Server, error) {
	v.pages = &pageReads{RawFileSystem: fs.NewNodeFS(v.root, fsOpts), backings: newBackings()}
	server, err := takeover.NewServer(v.pages, opts.Device, fsOpts.MountOptions, takeover.Options{
		Init: opts.Init, SaveInit: opts.SaveInit, Files: v.store, Log: opts.Log.WithName("resume"),
	})
	if err != nil {
		return nil, err
	}
	go server.Serve()
	return server, nil
}

// Unmount ends every wait in progress (readers get EIO) and unmounts the view. It retries
// a busy unmount for up to a few seconds, then detaches lazily so that no reader is left
// hung on a dead mount. A view serving a handed-over descriptor (Options.Device) only
// stops answering waits: its mount is its owner's to remove, and the server ends when it
// is.
func (v *View) Unmount() error {
	v.cancel()
	if v.opts.Device != nil {
		v.placeholders.Close()
		return nil
	}
	var err error
	for i := 0; i < 20; i++ {
		if err = v.server.Unmount(); err == nil {
			v.server.Wait()
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	if lerr := syscall.Unmount(v.mnt, syscall.MNT_DETACH); lerr != nil {
		return fmt.Errorf("unmounting %s: %w (lazy unmount: %w)", v.mnt, err, lerr)
	}
	return nil
}

// producer reports whether this view's step writes the governed path p.
func (v *View) producer(p string) bool { return v.rules.MayWrite(v.opts.Step, p) }

// refuseUndeclared records that this view's step may not change the governed file p
// (View.producer is false): it does not declare it as an output.
func (v *View) refuseUndeclared(p string) {
	res := v.rules.Resolve(p)
	if res.Rule == nil {
		return
	}
	v.refuse("change of "+res.Describe(), fmt.Sprintf("only steps %s declare it as an output; step %s may only read it",
		strings.Join(res.Rule.Producers, ", "), v.opts.Step))
}

// Passthrough reports whether the kernel reads committed files from the store itself,
// without the server: Options.Passthrough is not PassthroughOff, the kernel offered FUSE
// passthrough at INIT (FUSE_PASSTHROUGH, Linux >= 6.9) and this process may register
// backing files (FUSE_DEV_IOC_BACKING_OPEN needs CAP_SYS_ADMIN: `sluice run` as root has
// it, an unprivileged sidecar does not and serves every read itself).
func (v *View) Passthrough() bool { return v.passthrough.Load() }

// Invalidate drops what the kernel caches of the volume path p in this view (its
// directory entry, attributes and pages), because the file behind the name changed without
// a request of this view: it was withdrawn (semantics.Engine.Withdraw), and a retry may
// make it again under a reused store inode number, which is its node ID. A committed
// file's entry and attributes are otherwise cached for CommittedTimeout. Call it outside
// FUSE request handling.
//
// It returns at once and tells the kernel in the background: the kernel takes the lock
// of the name's directory to drop the entry, and a listing of that directory or a lookup
// in it may hold that lock while it waits, in this server, for what the caller has yet
// to do (a withdrawal's observer runs before the failed instance's termination, which
// ends that wait, is applied): a caller that waited for the kernel would never return.
func (v *View) Invalidate(p string) { go v.invalidate(p) }

// invalidate is Invalidate's work, which may wait for the kernel's lock of the name's
// directory.
func (v *View) invalidate(p string) {
	dir := v.root.EmbeddedInode()
	parts := strings.Split(p, "/")
	for _, name := range parts[:len(parts)-1] {
		if dir = dir.GetChild(name); dir == nil {
			return // never looked up in this view: nothing cached
		}
	}
	name := parts[len(parts)-1]
	if child := dir.GetChild(name); child != nil {
		_ = child.NotifyContent(0, 0)
		if srv := v.notifier.Load(); srv != nil {
			v.pages.backings.forget(srv, child.StableAttr().Ino)
		}
	}
	_ = dir.NotifyEntry(name)
}

// makeErrno is toErrno for the error of an operation of step's that makes a name (create,
// mkdir, mknod, symlink, O_TMPFILE): when the store's tier is out of inodes, which the
// kernel answers with a bare ENOSPC, the view logs it naming the tier and the path, the
// first time and then at every power of two of such refusals (a program that creates in
// a loop does not flood the log).
func (v *View) makeErrno(op, p string, err error) syscall.Errno {
	var inodes *store.InodesError
	if errors.As(err, &inodes) {
		if n := v.noInodes.Add(1); n&(n-1) == 0 {
			v.opts.Log.Error(nil, op+" refused: the node store's tier is out of inodes (ENOSPC)", "path", pathpattern.Printable(p),
				"step", v.opts.Step, "instance", v.opts.Instance, "tier", inodes.Tier, "dir", inodes.Dir, "inodes", inodes.Files, "refusals", n)
		}
	}
	return toErrno(err)
}

// toErrno turns an error from the OS into an errno.
func toErrno(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	var en syscall.Errno
	if errors.As(err, &en) {
		return en
	}
	if errors.Is(err, store.ErrNoSpace) {
		return syscall.ENOSPC
	}
	if errors.Is(err, os.ErrNotExist) {
		return syscall.ENOENT
	}
	if errors.Is(err, pathpattern.ErrBadUTF8) {
		return syscall.EILSEQ
	}
	if errors.Is(err, os.ErrClosed) {
		// the node store was closed under a view still serving (a lazily detached mount
		// whose node stopped): an I/O error, not the ENOSYS go-fuse makes of it
		return syscall.EIO
	}
	return fs.ToErrno(err)
}
