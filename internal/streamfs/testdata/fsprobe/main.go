// Command fsprobe performs single POSIX calls for the streaming filesystem's contract
// tests and prints what they returned, so a test can assert exactly what a program saw.
//
//	fsprobe pread FILE OFFSET LEN        prints the bytes read (or "errno NAME")
//	fsprobe pwrite FILE OFFSET DATA      writes DATA at OFFSET (O_WRONLY|O_CREAT), closes
//	fsprobe open-nonblock FILE           opens O_RDONLY|O_NONBLOCK, prints "ok" or "errno NAME"
//	fsprobe size FILE                    prints stat's size
//	fsprobe readdir1 DIR                 prints the names of one getdents call
//	fsprobe rename2 OLD NEW FLAGS        renameat2 with FLAGS noreplace|exchange, prints "ok"
//	fsprobe setxattr FILE NAME VALUE     lsetxattr, prints "ok"
//	fsprobe getxattr FILE NAME           prints the value of lgetxattr
//	fsprobe listxattr FILE               prints llistxattr's names, one a line
package main

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: fsprobe pread|pwrite|open-nonblock|size FILE ...")
		os.Exit(2)
	}
	op, file := os.Args[1], os.Args[2]
	switch op {
	case "pread":
		off, _ := strconv.ParseInt(os.Args[3], 10, 64)
		n, _ := strconv.Atoi(os.Args[4])
		fd, err := syscall.Open(file, syscall.O_RDONLY, 0)
		if err != nil {
			fail(err)
		}
		buf := make([]byte, n)
		k, err := syscall.Pread(fd, buf, off)
		if err != nil {
			fail(err)
		}
		os.Stdout.Write(buf[:k])
	case "pwrite":
		off, _ := strconv.ParseInt(os.Args[3], 10, 64)
		fd, err := syscall.Open(file, syscall.O_WRONLY|syscall.O_CREAT, 0o644)
		if err != nil {
			fail(err)
		}
		if _, err := syscall.Pwrite(fd, []byte(os.Args[4]), off); err != nil {
			fail(err)
		}
		if err := syscall.Close(fd); err != nil {
			fail(err)
		}
	case "open-nonblock":
		fd, err := syscall.Open(file, syscall.O_RDONLY|syscall.O_NONBLOCK, 0)
		if err != nil {
			fail(err)
		}
		syscall.Close(fd)
		fmt.Print("ok")
	case "readdir1":
		// one getdents call: what a listing shows before it is complete
		fd, err := syscall.Open(file, syscall.O_RDONLY|syscall.O_DIRECTORY, 0)
		if err != nil {
			fail(err)
		}
		buf := make([]byte, 64*1024)
		n, err := syscall.ReadDirent(fd, buf)
		if err != nil {
			fail(err)
		}
		var names []string
		_, _, names = syscall.ParseDirent(buf[:n], -1, names)
		for _, name := range names {
			fmt.Println(name)
		}
	case "size":
		var st syscall.Stat_t
		if err := syscall.Stat(file, &st); err != nil {
			fail(err)
		}
		fmt.Print(st.Size)
	case "rename2":
		flags := map[string]uint{"noreplace": unix.RENAME_NOREPLACE, "exchange": unix.RENAME_EXCHANGE}[os.Args[4]]
		if err := unix.Renameat2(unix.AT_FDCWD, file, unix.AT_FDCWD, os.Args[3], flags); err != nil {
			fail(err)
		}
		fmt.Print("ok")
	case "setxattr":
		if err := unix.Lsetxattr(file, os.Args[3], []byte(os.Args[4]), 0); err != nil {
			fail(err)
		}
		fmt.Print("ok")
	case "getxattr":
		buf := make([]byte, 4096)
		n, err := unix.Lgetxattr(file, os.Args[3], buf)
		if err != nil {
			fail(err)
		}
		os.Stdout.Write(buf[:n])
	case "listxattr":
		buf := make([]byte, 64*1024)
		n, err := unix.Llistxattr(file, buf)
		if err != nil {
			fail(err)
		}
		for _, name := range strings.Split(string(buf[:n]), "\x00") {
			if name != "" {
				fmt.Println(name)
			}
		}
	default:
		fmt.Fprintln(os.Stderr, "unknown op", op)
		os.Exit(2)
	}
}

func fail(err error) {
	var en syscall.Errno
	if errors.As(err, &en) {
		fmt.Printf("errno %d %s", int(en), en.Error())
	} else {
		fmt.Print(err)
	}
	os.Exit(1)
}
