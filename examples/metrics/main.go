// Command metrics exports distlock's metrics to Prometheus through the
// OpenTelemetry Prometheus exporter: it runs a small contended workload on
// the in-process store, serves /metrics on a loopback port, scrapes it once
// and prints the distlock series.
//
//	go run ./examples/metrics
package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend/memory"
	"github.com/distlock/distlock/hotspot"
	"github.com/distlock/distlock/metrics"
)

func main() {
	if err := run(context.Background(), os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "metrics:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, out io.Writer) error {
	// OpenTelemetry -> Prometheus registry.
	reg := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutTargetInfo(), otelprom.WithoutScopeInfo())
	if err != nil {
		return err
	}
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	defer provider.Shutdown(context.WithoutCancel(ctx))

	met := metrics.New(
		metrics.WithMeterProvider(provider),
		metrics.WithAttributes(attribute.String("backend", "memory")))
	if err := met.Err(); err != nil {
		return err
	}
	d, err := distlock.New(memory.New(), distlock.WithHandlers(met, hotspot.New("orders")))
	if err != nil {
		return err
	}
	defer d.Close()

	// A small contended workload: 4 workers x 10 locks of one key, and one
	// attempt that finds the key held.
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 10 {
				err := d.Do(ctx, "orders", time.Second, func(context.Context, *distlock.Lock) error {
					time.Sleep(2 * time.Millisecond) // the work the lock protects
					return nil
				})
				if err != nil {
					fmt.Fprintln(os.Stderr, "metrics: Do:", err)
				}
			}
		})
	}
	wg.Wait()
	lk, err := d.TryLock(ctx, "orders", 0)
	if err != nil {
		return err
	}
	if _, err := d.TryLock(ctx, "orders", 0); !errors.Is(err, distlock.ErrNotAcquired) {
		return fmt.Errorf("second TryLock: %v; want ErrNotAcquired", err)
	}
	if err := lk.Unlock(ctx); err != nil {
		return err
	}

	// Serve /metrics on a loopback port and scrape it once.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	defer srv.Close()

	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+ln.Addr().String()+"/metrics", nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("scrape: %s", resp.Status)
	}
	s := met.Stats()
	fmt.Fprintf(out, "# Stats(): acquired %d, not acquired %d, failed %d, released %d, remote attempts %d\n",
		s.Acquired, s.NotAcquired, s.Failed, s.Released, s.RemoteAttempts)
	fmt.Fprintf(out, "# scraped http://%s/metrics:\n", ln.Addr())
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.Contains(line, "distlock_") {
			fmt.Fprintln(out, line)
		}
	}
	return sc.Err()
}
