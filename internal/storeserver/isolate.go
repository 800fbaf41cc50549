package storeserver

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"

	"golang.org/x/sys/unix"
)

// Each store server child runs in a mount namespace of its own (CLONE_NEWNS), which the
// plugin turns, before the child reads its configuration, into a root of its own that
// holds only what it serves (isolate): a small read-only tmpfs with
//
//	/wf     the workflow's directory (Config.Dir: data/ and state/), read-write
//	/disk   the workflow's disk tier directory (Config.DiskDir), read-write
//	/proc   a procfs that shows only the processes the child may reach (hidepid=invisible,
//	        subset=pid): itself, and no other store server, which are not dumpable
//	/etc/resolv.conf, /etc/hosts, /etc/nsswitch.conf  read-only, where the plugin has
//	        them: the NATS server is a Service name
//	/etc/ssl/certs, /etc/pki/tls/certs, ...  read-only, where the plugin has them: the
//	        system's roots, which a tls:// NATS URL is verified against besides the
//	        installation's CA
//
// The plugin's root, with every workflow's directory on the node, the kubelet's pod
// directories and the plugin's sockets, is unmounted from that namespace; the child
// holds no descriptor of it. So one store server reaches no other workflow's files even
// though all run as the sidecars' user: its ".." ends at its root, and the kernel has
// nothing else to show it.
const (
	rootWorkflow = "/wf"
	rootDisk     = "/disk"
)

// hostPaths are the files and directories of the plugin's root a store server reads: its
// name lookups', and the system's certificate roots where Go's crypto/x509 looks for them
// on Linux.
var hostPaths = []string{"/etc/resolv.conf", "/etc/hosts", "/etc/nsswitch.conf",
	"/etc/ssl/certs", "/etc/pki/tls/certs", "/etc/ssl/ca-bundle.pem", "/etc/pki/tls/cacert.pem",
	"/etc/pki/ca-trust/extracted/pem", "/etc/ssl/cert.pem"}

// isolate makes the mount namespace of the child pid (started with CLONE_NEWNS, stopped
// reading its standard input) a root of its own holding the directories open as wf and
// disk in the plugin (see above), its mount point rootDir (an empty directory of the
// plugin's). It runs on an OS thread of its own that enters the child's namespace and is
// discarded after, so the plugin's other threads stay where they are: the process's
// main thread never runs it (the plugin's main goroutine keeps it, see cmd/sluice), since
// Go parks rather than ends a main thread whose goroutine exited locked. The errors name
// the step that failed.
func isolate(pid int, rootDir string, wf, disk *os.File) error {
	done := make(chan error, 1)
	go func() {
		// Never unlocked: the thread, changed for good, ends with the goroutine.
		runtime.LockOSThread()
		done <- enterAndIsolate(pid, rootDir, wf, disk)
	}()
	return <-done
}

// enterAndIsolate is isolate on the calling, locked, thread.
func enterAndIsolate(pid int, rootDir string, wf, disk *os.File) error {
	// A thread sharing its filesystem attributes with others cannot enter a mount
	// namespace (setns(2)); Go's threads share them.
	if err := unix.Unshare(unix.CLONE_FS); err != nil {
		return fmt.Errorf("unsharing the thread's filesystem attributes: %w", err)
	}
	ns, err := os.Open(filepath.Join("/proc", strconv.Itoa(pid), "ns", "mnt"))
	if err != nil {
		return fmt.Errorf("the store server process's mount namespace: %w", err)
	}
	defer ns.Close()
	// Detached copies of the plugin's directories (a bind mount's source must be in the
	// caller's namespace; a detached tree may be attached in any).
	var trees []int
	defer func() {
		for _, fd := range trees {
			unix.Close(fd)
		}
	}()
	for _, d := range []*os.File{wf, disk} {
		fd, err := unix.OpenTree(int(d.Fd()), "", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_EMPTY_PATH)
		if err != nil {
			return fmt.Errorf("copying the mount of %s: %w", d.Name(), err)
		}
		trees = append(trees, fd)
	}
	if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("entering the store server process's mount namespace: %w", err)
	}
	// Nothing done here may reach the plugin's namespace.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making the namespace's mounts private: %w", err)
	}
	const nosuid = unix.MS_NOSUID | unix.MS_NODEV
	if err := unix.Mount("sluice-store-server", rootDir, "tmpfs", nosuid|unix.MS_NOEXEC, "mode=0755,size=64k,nr_inodes=64"); err != nil {
		return fmt.Errorf("mounting the store server's root at %s: %w", rootDir, err)
	}
	// at makes the mount point rel (a file or a directory) in the root, attaches there
	// the tree attach gives, and gives the mount flags.
	at := func(rel string, file bool, flags uintptr, attach func(dst string) error) error {
		dst := filepath.Join(rootDir, rel)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		if file {
			f, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
			if err != nil {
				return err
			}
			f.Close()
		} else if err := os.Mkdir(dst, 0o755); err != nil {
			return err
		}
		if err := attach(dst); err != nil {
			return fmt.Errorf("mounting %s: %w", rel, err)
		}
		// A copy of a shared mount joins its peer group: keep the plugin's later mounts
		// out of the child's root.
		if err := unix.Mount("", dst, "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			return fmt.Errorf("making %s private: %w", rel, err)
		}
		// A bind mount takes its flags from a remount.
		if err := unix.Mount("", dst, "", unix.MS_REMOUNT|unix.MS_BIND|flags, ""); err != nil {
			return fmt.Errorf("remounting %s: %w", rel, err)
		}
		return nil
	}
	for i, rel := range []string{rootWorkflow, rootDisk} {
		tree := trees[i]
		if err := at(rel, false, nosuid|unix.MS_NOEXEC, func(dst string) error {
			return unix.MoveMount(tree, "", unix.AT_FDCWD, dst, unix.MOVE_MOUNT_F_EMPTY_PATH)
		}); err != nil {
			return err
		}
	}
	for _, p := range hostPaths {
		st, err := os.Stat(p)
		if err != nil || !(st.Mode().IsRegular() || st.IsDir()) {
			continue
		}
		if err := at(p, !st.IsDir(), nosuid|unix.MS_NOEXEC|unix.MS_RDONLY, func(dst string) error {
			return unix.Mount(p, dst, "", unix.MS_BIND|unix.MS_REC, "")
		}); err != nil {
			return err
		}
	}
	proc := filepath.Join(rootDir, "proc")
	if err := os.Mkdir(proc, 0o555); err != nil {
		return err
	}
	if err := unix.Mount("proc", proc, "proc", nosuid|unix.MS_NOEXEC, "hidepid=invisible,subset=pid"); err != nil {
		return fmt.Errorf("mounting the store server's /proc: %w", err)
	}
	if err := unix.Mount("", rootDir, "", unix.MS_REMOUNT|unix.MS_RDONLY|nosuid|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("making the store server's root read-only: %w", err)
	}
	// pivot_root(".", ".") moves the namespace's root, and with it the child's root and
	// working directory, to rootDir; the old root, stacked on it, then goes.
	if err := unix.Chdir(rootDir); err != nil {
		return err
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root to the store server's root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("unmounting the plugin's root from the store server's namespace: %w", err)
	}
	return nil
}

// errNotIsolated is RunChild's error in a process whose root is not the one isolate
// makes.
var errNotIsolated = errors.New("the store server process is not in the root its plugin makes for it")

// ErrRootNotNamespaceRoot is CheckIsolation's error in a process whose root is not the
// root of its mount namespace: a plain chroot(2), where a thread entering a mount
// namespace (setns(2), as isolate does in the child's) lands at the namespace's root, and
// the paths of the process's root are not there. A container runtime enters its root with
// pivot_root(2), which makes it the namespace's root.
var ErrRootNotNamespaceRoot = errors.New("this process's root is not the root of its mount namespace " +
	"(a plain chroot, not entered with pivot_root as a container is): a store server's root cannot be made in its mount namespace")

// CheckIsolation returns nil where the plugin can give each store server a root of its
// own (isolate); otherwise an error naming what is missing: the right to enter a mount
// namespace (CAP_SYS_ADMIN and CAP_SYS_CHROOT; setns(2)), or a root that is its mount
// namespace's (ErrRootNotNamespaceRoot). It enters this process's own mount namespace on
// an OS thread of its own, which is discarded after, and compares the root the thread
// has there with the process's.
func CheckIsolation() error {
	done := make(chan error, 1)
	go func() {
		// Never unlocked: the thread, whose root may have changed, ends with the goroutine.
		runtime.LockOSThread()
		done <- checkRoot()
	}()
	return <-done
}

// checkRoot is CheckIsolation on the calling, locked, thread.
func checkRoot() error {
	if err := unix.Unshare(unix.CLONE_FS); err != nil {
		return fmt.Errorf("unsharing a thread's filesystem attributes (isolating store servers needs it): %w", err)
	}
	var before, after unix.Stat_t
	if err := unix.Stat("/", &before); err != nil {
		return fmt.Errorf("this process's root: %w", err)
	}
	ns, err := os.Open("/proc/thread-self/ns/mnt")
	if err != nil {
		return fmt.Errorf("this process's mount namespace (isolating store servers needs /proc): %w", err)
	}
	defer ns.Close()
	if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("entering a mount namespace (setns(2); isolating store servers needs CAP_SYS_ADMIN and CAP_SYS_CHROOT, and no seccomp filter refusing setns): %w", err)
	}
	if err := unix.Stat("/", &after); err != nil {
		return fmt.Errorf("the root of this process's mount namespace: %w", err)
	}
	if before.Dev != after.Dev || before.Ino != after.Ino {
		return ErrRootNotNamespaceRoot
	}
	return nil
}
