package redlock

import (
	"errors"

	"github.com/distlock/distlock/backend"
)

var _ backend.KindChecker = (*Resource)(nil)

// CheckKind implements [backend.KindChecker]: Redlock holds mutexes only.
// A semaphore cannot be bounded by majorities: two majorities of N nodes
// share a node, but each node only knows the permits it granted, so two
// rounds can each count fewer than the limit on their own majority and
// together admit more. A read/write lock has the same flaw (a writer's
// majority and a reader's may overlap on a node that counted only one).
func (r *Resource) CheckKind(k backend.Kind) error {
	if k == backend.KindMutex {
		return nil
	}
	return errUnsupportedKind
}

var errUnsupportedKind = errors.New("redlock holds mutexes only: majorities of independent nodes cannot bound a semaphore or order readers and writers (see the redlock package doc)")
