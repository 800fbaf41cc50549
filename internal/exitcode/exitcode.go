// Package exitcode carries a command's process exit status through cobra's error return.
package exitcode

import (
	"errors"
	"fmt"
	"os"
)

// The exit statuses of the commands.
const (
	// Failure is the status of a command that failed (1).
	Failure = 1
	// Usage is the status of a command used wrongly: a missing or extra argument, an
	// unknown flag or command, a bad flag value (2).
	Usage = 2
)

// Error is a failed command's error with the exit status its process ends with (2 for a
// bad argument or flag, by the commands' convention; 1 for a failure). Err may be nil
// when the command has already printed what went wrong.
type Error struct {
	// Code is the process exit status.
	Code int
	// Err is what went wrong, or nil when it was printed already.
	Err error
}

// Error is Err's message, or "" when Err is nil.
func (e *Error) Error() string {
	if e.Err == nil {
		return ""
	}
	return e.Err.Error()
}

// Unwrap returns Err.
func (e *Error) Unwrap() error { return e.Err }

// Of returns the exit status for err: the Code of the first *Error in its chain, else 1.
func Of(err error) int {
	var ee *Error
	if errors.As(err, &ee) {
		return ee.Code
	}
	return 1
}

// Exit ends the process for a command's error: nothing when err is nil; else err's
// message, if any, on standard error and the exit status Of(err).
func Exit(err error) {
	if err == nil {
		return
	}
	if msg := err.Error(); msg != "" {
		fmt.Fprintln(os.Stderr, msg)
	}
	os.Exit(Of(err))
}
