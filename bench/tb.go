package main

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
)

// serverTB is the testing.TB that internal/testserver's starters get in
// this program, so that the benchmark runs its servers exactly as the tests
// do (same flags, same readiness checks, same cleanup by PID). Fatal and
// Skip unwind the starter with a panic that [startWith] turns into an
// error; cleanups run, newest first, when the program ends.
type serverTB struct {
	testing.TB // nil: a method the starters do not use panics

	name string

	mu       sync.Mutex
	cleanups []func()
	failed   bool
	ctx      context.Context
	cancel   context.CancelFunc
}

// tbStop is what Fatal and Skip panic with.
type tbStop struct {
	skip bool
	msg  string
}

func newServerTB(name string) *serverTB {
	ctx, cancel := context.WithCancel(context.Background())
	return &serverTB{name: name, ctx: ctx, cancel: cancel}
}

func (t *serverTB) Helper()      {}
func (t *serverTB) Name() string { return t.name }

func (t *serverTB) Context() context.Context { return t.ctx }

func (t *serverTB) Cleanup(f func()) {
	t.mu.Lock()
	t.cleanups = append(t.cleanups, f)
	t.mu.Unlock()
}

func (t *serverTB) TempDir() string {
	dir, err := os.MkdirTemp("", "distlock-bench-")
	if err != nil {
		t.Fatalf("TempDir: %v", err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

func (t *serverTB) Failed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.failed
}

func (t *serverTB) Log(args ...any) { fmt.Fprintln(os.Stderr, args...) }

func (t *serverTB) Logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
}

func (t *serverTB) Error(args ...any) {
	t.fail()
	t.Log(args...)
}

func (t *serverTB) Errorf(format string, args ...any) {
	t.fail()
	t.Logf(format, args...)
}

func (t *serverTB) Fatal(args ...any) {
	t.fail()
	panic(tbStop{msg: fmt.Sprint(args...)})
}

func (t *serverTB) Fatalf(format string, args ...any) {
	t.fail()
	panic(tbStop{msg: fmt.Sprintf(format, args...)})
}

func (t *serverTB) Skip(args ...any) { panic(tbStop{skip: true, msg: fmt.Sprint(args...)}) }

func (t *serverTB) Skipf(format string, args ...any) {
	panic(tbStop{skip: true, msg: fmt.Sprintf(format, args...)})
}

func (t *serverTB) SkipNow() { panic(tbStop{skip: true, msg: "skipped"}) }
func (t *serverTB) FailNow() { t.fail(); panic(tbStop{msg: "failed"}) }

func (t *serverTB) fail() {
	t.mu.Lock()
	t.failed = true
	t.mu.Unlock()
}

// close runs the cleanups, newest first.
func (t *serverTB) close() {
	t.cancel()
	t.mu.Lock()
	fs := t.cleanups
	t.cleanups = nil
	t.mu.Unlock()
	for i := len(fs) - 1; i >= 0; i-- {
		fs[i]()
	}
}

// startWith runs start (a testserver starter) on t and turns a Fatal or
// Skip inside it into an error.
func startWith[S any](t *serverTB, start func(testing.TB) S) (s S, err error) {
	defer func() {
		if r := recover(); r != nil {
			stop, ok := r.(tbStop)
			if !ok {
				panic(r)
			}
			if stop.skip {
				err = fmt.Errorf("unavailable: %s", stop.msg)
			} else {
				err = fmt.Errorf("failed: %s", stop.msg)
			}
		}
	}()
	return start(t), nil
}
