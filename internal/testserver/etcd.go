package testserver

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

var etcdKind = kind{
	name:    "etcd",
	envVar:  "DISTLOCK_TEST_ETCD",
	binary:  "etcd (built from internal/testserver/cmd/etcdmember with the go command)",
	install: "nothing: the etcd server is a Go dependency of the helper",
}

// EtcdServer is a one-member etcd for one test, in a process of its own
// (see [EtcdCluster]). Stop, Kill, Pause, Resume and Restart control it;
// Restart starts it again on the same endpoint with the same data. They
// skip the test for an external server (fail it when CI is set).
type EtcdServer struct {
	// Endpoints are the client URLs, e.g. "http://127.0.0.1:2379".
	Endpoints []string

	node
}

// Etcd starts a one-member etcd for t in a temp dir and stops it when t
// ends. DISTLOCK_TEST_ETCD=http://host:port[,...] makes it use a running
// server instead.
func Etcd(t testing.TB) *EtcdServer {
	t.Helper()
	src, env := etcdKind.choose(t, true)
	if src == sourceEnv {
		return &EtcdServer{Endpoints: splitList(env), node: node{t: t, envVar: etcdKind.envVar}}
	}
	m := startEtcdMembers(t, 1)[0]
	return &EtcdServer{Endpoints: []string{m.Endpoint}, node: m.node}
}

// etcdHTTP speaks to etcd's HTTP endpoints (health, and the gRPC gateway's
// JSON). No keep-alive: no connection, and no goroutine, outlives a call.
var etcdHTTP = &http.Client{
	Timeout:   2 * time.Second,
	Transport: &http.Transport{DisableKeepAlives: true},
}

// etcdMemberReady succeeds when the member at ep answers and knows a
// leader: etcd's /health says so.
func etcdMemberReady(ep string) error {
	resp, err := etcdHTTP.Get(ep + "/health")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var h struct {
		Health string `json:"health"`
		Reason string `json:"reason"`
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &h) != nil || h.Health != "true" {
		return fmt.Errorf("etcd %s: not healthy: %s %s", ep, resp.Status, bytes.TrimSpace(body))
	}
	return nil
}

// etcdStatus is the part of etcd's Maintenance.Status answer testserver
// reads, from the gRPC gateway's JSON.
type etcdStatus struct {
	Header struct {
		MemberID jsonUint64 `json:"member_id"`
	} `json:"header"`
	Leader jsonUint64 `json:"leader"`
}

// jsonUint64 is a uint64 that the gateway writes as a string, as proto3's
// JSON mapping does; a plain number is accepted too.
type jsonUint64 uint64

func (u *jsonUint64) UnmarshalJSON(b []byte) error {
	n, err := strconv.ParseUint(strings.Trim(string(b), `"`), 10, 64)
	*u = jsonUint64(n)
	return err
}

// etcdLeader returns the index in endpoints of the member that is leader.
func etcdLeader(ctx context.Context, endpoints []string) (int, error) {
	var lastErr error
	for i, ep := range endpoints {
		st, err := etcdMemberStatus(ctx, ep)
		if err != nil {
			lastErr = err
			continue
		}
		if st.Leader != 0 && st.Leader == st.Header.MemberID {
			return i, nil
		}
	}
	if lastErr == nil {
		lastErr = fmt.Errorf("no member is leader")
	}
	return -1, fmt.Errorf("etcd: no leader among %v: %w", endpoints, lastErr)
}

func etcdMemberStatus(ctx context.Context, ep string) (etcdStatus, error) {
	var st etcdStatus
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, ep+"/v3/maintenance/status", strings.NewReader("{}"))
	if err != nil {
		return st, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := etcdHTTP.Do(req)
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return st, err
	}
	if resp.StatusCode != http.StatusOK {
		return st, fmt.Errorf("etcd %s: status: %s %s", ep, resp.Status, bytes.TrimSpace(body))
	}
	if err := json.Unmarshal(body, &st); err != nil {
		return st, fmt.Errorf("etcd %s: status: %w", ep, err)
	}
	return st, nil
}
