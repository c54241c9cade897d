package main

import (
	"context"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/backend/memory"
)

func init() {
	openers["memory"] = func(context.Context, addrs) (store, error) {
		return &memoryStore{s: memory.New()}, nil
	}
}

// memoryStore is one in-process store shared by all instances, as one
// server is shared by several processes.
type memoryStore struct{ s *memory.Store }

func (m *memoryStore) resource(_ context.Context, notify bool) (backend.RemoteResource, func() error, error) {
	if !notify {
		return spinOnly{m.s}, func() error { return nil }, nil
	}
	return m.s, func() error { return nil }, nil
}

func (m *memoryStore) commands(context.Context) (map[string]uint64, error) { return nil, nil }

func (m *memoryStore) close() error { return nil }
