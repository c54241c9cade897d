//go:build unix && !linux

package main

import "syscall"

// procAttr returns how COMMAND is started: in a process group of its own,
// in the terminal's foreground when fg (Ctty is distlock's stdin). There
// is no parent-death signal here: if distlock is killed, COMMAND runs on.
func procAttr(fg bool) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Foreground: fg, Ctty: 0}
}
