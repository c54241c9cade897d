// Package proxy is a userspace TCP proxy on 127.0.0.1 for fault injection
// where netem is not available: it delays the bytes of either direction,
// or stalls a direction (holds its bytes, keeping the connections open,
// as a congested or partitioned path does) until told to let them go.
package proxy
