//go:build unix

package main

import (
	"os/signal"
	"syscall"

	"golang.org/x/sys/unix"
)

// inForeground reports whether distlock's stdin is a terminal whose
// foreground process group is distlock's: COMMAND then gets the
// foreground, so that it may read the terminal and the terminal's ^C
// reaches it (and only it) directly.
func inForeground() bool {
	pgrp, err := unix.IoctlGetInt(0, unix.TIOCGPGRP)
	return err == nil && pgrp == syscall.Getpgrp()
}

// takeForeground makes distlock's process group the terminal's foreground
// again once COMMAND has exited. SIGTTOU, which the kernel sends a
// background process that does so, is ignored from then on.
func takeForeground() {
	signal.Ignore(syscall.SIGTTOU)
	_ = unix.IoctlSetPointerInt(0, unix.TIOCSPGRP, syscall.Getpgrp())
}
