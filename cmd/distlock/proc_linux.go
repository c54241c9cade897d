package main

import "syscall"

// procAttr returns how COMMAND is started: in a process group of its own,
// in the terminal's foreground when fg (Ctty is distlock's stdin), and
// killed by the kernel if distlock dies (Pdeathsig: the thread that starts
// it must live until it exits; runCommand locks one).
func procAttr(fg bool) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Foreground: fg, Ctty: 0, Pdeathsig: syscall.SIGKILL}
}
