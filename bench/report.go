package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// report collects the tables and the ratios of one run.
type report struct {
	cfg      config
	start    time.Time
	load0    string
	sections []*section
	notes    []string
	bars     []bar // the chart's
	versions []string

	// results kept for the targets table
	cyc  map[string][]*cycleResult // "uncontended/redis" -> rows
	hand map[string][]*handoffResult
	cont map[string][]*contendedResult
}

type section struct {
	workload string
	b        strings.Builder
}

// bar is one ratio in the chart: peer vs its store's reference, in one
// workload, higher is better (a ratio of requests is reference / peer).
type bar struct {
	group string // "uncontended", ...
	label string // "redis: distlock vs floor"
	ratio float64
}

func newReport(cfg config) *report {
	return &report{cfg: cfg, start: time.Now(), load0: loadAvg(),
		cyc: map[string][]*cycleResult{}, hand: map[string][]*handoffResult{}, cont: map[string][]*contendedResult{}}
}

func (r *report) section(w, title string) *section {
	s := &section{workload: w}
	fmt.Fprintf(&s.b, "### %s\n\n", title)
	r.sections = append(r.sections, s)
	return s
}

func (r *report) missing(p *peer, err error) {
	r.notes = append(r.notes, fmt.Sprintf("%s/%s left out: %v", p.store, p.name, oneLine(err.Error())))
}

func oneLine(s string) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if len(s) > 300 {
		s = s[:300] + "..."
	}
	return s
}

func f0(x float64) string {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return "-"
	}
	return fmt.Sprintf("%.0f", x)
}

func f1(x float64) string {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return "-"
	}
	return fmt.Sprintf("%.1f", x)
}

func f2(x float64) string {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return "-"
	}
	return fmt.Sprintf("%.2f", x)
}

func per(n int64, d int) float64 {
	if d == 0 {
		return math.NaN()
	}
	return float64(n) / float64(d)
}

// spread is the lowest and highest of the rounds' ratios.
func spread(xs []float64) string {
	if len(xs) == 0 {
		return "-"
	}
	return f2(slices.Min(xs)) + "-" + f2(slices.Max(xs))
}

// cycles adds the table of the uncontended or parallel workload of one store.
func (r *report) cycles(w, store string, rs []*cycleResult, pinned string) {
	ref := rs[0].p.name
	r.cyc[w+"/"+store] = rs
	if w == "uncontended" {
		s := r.section(w, fmt.Sprintf("Uncontended: %s (%s)", store, pinned))
		fmt.Fprintf(&s.b, "One goroutine, lock + unlock of one key, %d rounds of %v per peer, alternating. Ratio: the median over rounds of cycles/s against %s in the same round; the range shows how much the rounds disagreed (the machine is shared). Cycles/s is the median over rounds. CPU per cycle: time on a CPU, user and kernel, of this program (the client, every thread) and of the store's server processes, from /proc/*/task/*/schedstat over all rounds; pinned, the two add up to about the wall time of a cycle, so they show which side a difference comes from.\n\n", r.cfg.rounds, r.cfg.slice, ref)
		srvCol := store == "redis"
		hdr := "| peer | cycles/s | vs " + ref + " | rounds' range | p50 us | p99 us | client CPU us/cycle | server CPU us/cycle | allocs/cycle | B/cycle | round trips/cycle |"
		sep := "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
		if srvCol {
			hdr += " server cmds/cycle |"
			sep += "---:|"
		}
		fmt.Fprintf(&s.b, "%s\n%s\n", hdr, sep)
		for _, c := range rs {
			if c.err != nil {
				fmt.Fprintf(&s.b, "| %s | error: %s |\n", c.p.name, oneLine(c.err.Error()))
				continue
			}
			row := fmt.Sprintf("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |", c.p.name, f0(c.rate()), f2(c.ratio()), spread(c.ratios),
				f1(us(quantile(c.lat, 0.5))), f1(us(quantile(c.lat, 0.99))),
				f2(per(int64(c.clientCPU/time.Nanosecond), c.cycles)/1e3), f2(per(int64(c.serverCPU/time.Nanosecond), c.cycles)/1e3),
				f1(per(int64(c.mallocs), c.cycles)), f0(per(int64(c.bytes), c.cycles)), f2(per(c.c.rt, c.cycles)))
			if srvCol {
				row += " " + f2(per(c.c.cmds, c.cycles)) + " |"
			}
			fmt.Fprintln(&s.b, row)
			if c.p.name != ref {
				r.bars = append(r.bars, bar{group: "uncontended cycles/s", label: store + ": " + c.p.name + " / " + ref, ratio: c.ratio()})
			}
		}
		r.peerNotes(s, rs)
		return
	}
	s := r.section(w, fmt.Sprintf("Parallel: %s (%d goroutines, distinct keys, %s)", store, r.cfg.parallel, pinned))
	fmt.Fprintf(&s.b, "%d rounds of %v per peer, alternating; one instance per peer shared by the goroutines.\n\n", r.cfg.rounds, r.cfg.slice)
	fmt.Fprintf(&s.b, "| peer | cycles/s | vs %s | rounds' range | round trips/cycle |\n|---|---:|---:|---:|---:|\n", ref)
	for _, c := range rs {
		if c.err != nil {
			fmt.Fprintf(&s.b, "| %s | error: %s |\n", c.p.name, oneLine(c.err.Error()))
			continue
		}
		fmt.Fprintf(&s.b, "| %s | %s | %s | %s | %s |\n", c.p.name, f0(c.rate()), f2(c.ratio()), spread(c.ratios), f2(per(c.c.rt, c.cycles)))
		if c.p.name != ref {
			r.bars = append(r.bars, bar{group: "parallel cycles/s", label: store + ": " + c.p.name + " / " + ref, ratio: c.ratio()})
		}
	}
	fmt.Fprintln(&s.b)
}

// peerNotes lists how each peer is configured.
func (r *report) peerNotes(s *section, rs []*cycleResult) {
	fmt.Fprintln(&s.b)
	for _, c := range rs {
		fmt.Fprintf(&s.b, "- %s: %s\n", c.p.name, c.p.note)
	}
	fmt.Fprintln(&s.b)
}

// write prints the report and writes the files asked for. A run of
// some workloads, stores or peers only (-workload scale, -store redis)
// whose -out file exists updates that file: its tables replace the
// same tables there (each says which run it comes from) and the rest of
// the file, the targets at its top included, stays as it was; -svg is not
// written then (the chart needs every workload).
func (r *report) write(stdout io.Writer) error {
	var b strings.Builder
	r.header(&b)
	r.targets(&b)
	for _, s := range r.ordered() {
		b.WriteString(s.b.String())
	}
	if len(r.notes) > 0 {
		b.WriteString("### Left out\n\n")
		for _, n := range r.notes {
			fmt.Fprintf(&b, "- %s\n", n)
		}
		b.WriteString("\n")
	}
	if _, err := io.WriteString(stdout, b.String()); err != nil {
		return err
	}
	if r.cfg.out != "" {
		out := b.String()
		if old, err := os.ReadFile(r.cfg.out); err == nil && r.cfg.partial() {
			out = mergeSections(string(old), r.ordered(), r.provenance())
			fmt.Fprintf(os.Stderr, "bench: %s: updated this run's tables only\n", r.cfg.out)
		}
		if err := os.WriteFile(r.cfg.out, []byte(out), 0o644); err != nil {
			return err
		}
	}
	if r.cfg.svg != "" {
		if r.cfg.partial() {
			fmt.Fprintf(os.Stderr, "bench: %s not written: the chart needs a run of every workload\n", r.cfg.svg)
			return nil
		}
		if err := os.WriteFile(r.cfg.svg, []byte(chart(r.bars)), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// ordered returns the sections in workload order.
func (r *report) ordered() []*section {
	var out []*section
	for _, w := range allWorkloads {
		for _, s := range r.sections {
			if s.workload == w {
				out = append(out, s)
			}
		}
	}
	return out
}

// partial reports whether the run leaves out workloads, stores or peers.
func (c config) partial() bool {
	return len(c.workloads) < len(allWorkloads) || len(c.stores) > 0 || len(c.peers) > 0
}

// provenance says where a table merged into an older file comes from.
func (r *report) provenance() string {
	return fmt.Sprintf("_This table: `cd bench && go run . %s` on %s, distlock %s, load average %s._",
		strings.Join(os.Args[1:], " "), r.start.UTC().Format("2006-01-02 15:04 UTC"), gitRev(), loadAvg())
}

// mergeSections replaces, in old (a RESULTS.md), the tables fresh has
// anew, matched by sectionID, and keeps the rest. A fresh table old lacks
// goes after old's last table of the same workload (else before "Left
// out", else at the end). Each fresh table gets the provenance line under
// its heading.
func mergeSections(old string, fresh []*section, provenance string) string {
	text := func(s *section) string {
		head, rest, _ := strings.Cut(s.b.String(), "\n\n")
		return head + "\n\n" + provenance + "\n\n" + rest
	}
	byID := map[string]*section{}
	for _, s := range fresh {
		byID[sectionID(s.b.String())] = s
	}
	pre, chunks := splitSections(old)
	used := map[string]bool{}
	var b strings.Builder
	b.WriteString(pre)
	// addNew writes the fresh tables of workload w old lacks.
	addNew := func(w string) {
		for _, s := range fresh {
			if id := sectionID(s.b.String()); !used[id] && (w == "" || s.workload == w) {
				used[id] = true
				b.WriteString(text(s))
			}
		}
	}
	for i, c := range chunks {
		id := sectionID(c)
		if id == "left out" {
			addNew("")
		}
		if s, ok := byID[id]; ok && !used[id] {
			used[id] = true
			b.WriteString(text(s))
		} else if !ok {
			b.WriteString(c)
		}
		if w := workloadOf(id); w != "" && (i+1 == len(chunks) || workloadOf(sectionID(chunks[i+1])) != w) {
			addNew(w)
		}
	}
	addNew("")
	return b.String()
}

// splitSections cuts a RESULTS.md into what comes before its first "### "
// heading and the sections that start with one.
func splitSections(s string) (pre string, chunks []string) {
	i := strings.Index(s, "\n### ")
	if i < 0 {
		return s, nil
	}
	pre, s = s[:i+1], s[i+1:]
	for s != "" {
		j := strings.Index(s, "\n### ")
		if j < 0 {
			chunks = append(chunks, s)
			break
		}
		chunks = append(chunks, s[:j+1])
		s = s[j+1:]
	}
	return pre, chunks
}

// sectionID names the table a section holds from its heading: workload
// and store, for the parallel workload its goroutines
// ("parallel/redis/64"), and for the scale workload which table, with the
// number of locks held ("scale/redis/held/10000", "scale/redis/hotkey");
// "left out" for the list of peers left out.
func sectionID(sec string) string {
	head, _, _ := strings.Cut(strings.TrimPrefix(sec, "### "), "\n")
	kind, rest, ok := strings.Cut(head, ": ")
	if !ok {
		return strings.ToLower(head)
	}
	store, _, _ := strings.Cut(rest, ",")
	store, _, _ = strings.Cut(store, " ")
	id := strings.ToLower(kind) + "/" + store
	if kind == "Parallel" {
		if _, n, ok := strings.Cut(rest, "("); ok {
			n, _, _ = strings.Cut(n, " ")
			id += "/" + n
		}
	}
	if kind == "Scale" {
		switch {
		case strings.Contains(rest, "locks held"):
			n, _, _ := strings.Cut(strings.TrimSpace(strings.TrimPrefix(rest, store+",")), " ")
			id += "/held/" + n
		case strings.Contains(rest, "on one key"):
			id += "/hotkey"
		}
	}
	return id
}

// workloadOf is the workload of a section ID, "" for other sections.
func workloadOf(id string) string {
	w, _, ok := strings.Cut(id, "/")
	if !ok {
		return ""
	}
	return w
}

func (r *report) header(b *strings.Builder) {
	fmt.Fprintf(b, "# distlock benchmarks against its peers\n\n")
	fmt.Fprintf(b, "Generated by `cd bench && go run . %s` on %s, in %v.\n\n",
		strings.Join(os.Args[1:], " "), r.start.UTC().Format("2006-01-02 15:04 UTC"), time.Since(r.start).Round(time.Second))
	fmt.Fprintf(b, "- Machine: %s, %d CPUs, %s; Go %s.\n", cpuModel(), runtime.NumCPU(), kernel(), runtime.Version())
	fmt.Fprintf(b, "- Load average (1, 5, 15 min) at start: %s; at end: %s. The machine was shared with other work: read the ratios (peers alternate round by round, so load hits all alike), not the absolute numbers.\n", r.load0, loadAvg())
	fmt.Fprintf(b, "- Libraries: %s.\n", strings.Join(moduleVersions(), ", "))
	if len(r.versions) > 0 {
		fmt.Fprintf(b, "- Servers: %s.\n", strings.Join(r.versions, ", "))
	}
	fmt.Fprintln(b)
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], ", ")
}

func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return runtime.GOARCH
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return runtime.GOARCH
}

func kernel() string {
	b, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		return runtime.GOOS
	}
	return "Linux " + strings.TrimSpace(string(b))
}

// moduleVersions lists the versions of the libraries measured.
func moduleVersions() []string {
	want := []string{"github.com/redis/go-redis/v9", "github.com/bsm/redislock", "github.com/go-redsync/redsync/v4",
		"go.etcd.io/etcd/client/v3", "go.etcd.io/etcd/server/v3", "github.com/go-zookeeper/zk", "github.com/jackc/pgx/v5"}
	out := []string{"distlock " + gitRev()}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return out
	}
	for _, w := range want {
		for _, d := range bi.Deps {
			if d.Path == w {
				out = append(out, d.Path+" "+d.Version)
			}
		}
	}
	return out
}

// gitRev is the checkout's commit, "+dirty" when it has changes.
func gitRev() string {
	out, err := exec.Command("git", "describe", "--always", "--dirty").Output()
	if err != nil {
		return "(this checkout)"
	}
	return "`" + strings.TrimSpace(string(out)) + "`"
}

// serverVersions asks the servers that run.
func (r *report) serverVersions(ctx context.Context, s *servers) {
	s.mu.Lock()
	var redisAddr, zkAddr string
	if len(s.redis) > 0 {
		redisAddr = s.redis[0].Addr
	}
	if s.zk != nil {
		zkAddr = s.zk.Addr
	}
	hasEtcd := s.etcd != nil
	s.mu.Unlock()
	if redisAddr != "" {
		c := goredis.NewClient(&goredis.Options{Addr: redisAddr})
		if info, err := c.Info(ctx, "server").Result(); err == nil {
			for line := range strings.SplitSeq(info, "\n") {
				if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
					r.versions = append(r.versions, "Redis "+v)
				}
			}
		}
		c.Close()
	}
	if hasEtcd {
		r.versions = append(r.versions, "etcd (embedded server module, one member in its own process)")
	}
	if zkAddr != "" {
		if out, err := fourLetter(zkAddr, "srvr"); err == nil {
			for line := range strings.SplitSeq(out, "\n") {
				if v, ok := strings.CutPrefix(line, "Zookeeper version: "); ok {
					v, _, _ = strings.Cut(v, ",")
					v, _, _ = strings.Cut(v, "-")
					r.versions = append(r.versions, "ZooKeeper "+v)
				}
			}
		}
	}
}

// contended adds the contended tables of one store.
func (r *report) contended(store string, rs []*contendedResult) {
	if len(rs) == 0 {
		return
	}
	r.cont[store] = rs
	s := r.section("contended", fmt.Sprintf("Contended: %s", store))
	fmt.Fprintf(&s.b, "The seed workload: %d instances (each with its own clients, as a process) x %d goroutines, every goroutine trying the same key again and again, holding it, releasing it; %d round(s), peers alternating. Round trips per success count every request the clients sent (failed attempts and releases included)",
		r.cfg.instances, r.cfg.workers, r.cfg.contendedRounds)
	if store == "redis" {
		fmt.Fprintf(&s.b, "; server cmds also count the commands run inside scripts")
	}
	fmt.Fprintf(&s.b, ". Overlaps (two holders at once) must be 0.\n\n")
	srvCol := store == "redis"
	var v variant
	for _, c := range rs {
		if c.v != v {
			v = c.v
			fmt.Fprintf(&s.b, "\n%s, %d attempts per goroutine:\n\n", v.name, v.attempts)
			hdr := "| peer | successes | timeouts | errors | overlaps | round trips/success |"
			sep := "|---|---:|---:|---:|---:|---:|"
			if srvCol {
				hdr += " server cmds/success |"
				sep += "---:|"
			}
			fmt.Fprintf(&s.b, "%s wall |\n%s---:|\n", hdr, sep)
		}
		errs := fmt.Sprint(c.failures)
		if c.err != nil {
			errs += " (" + oneLine(c.err.Error()) + ")"
		}
		row := fmt.Sprintf("| %s | %d/%d | %d | %s | %d | %s |", c.p.label(), c.successes, c.attempts, c.timeouts, errs, c.overlaps, f2(per(c.c.rt, c.successes)))
		if srvCol {
			row += " " + f2(per(c.c.cmds, c.successes)) + " |"
		}
		fmt.Fprintf(&s.b, "%s %v |\n", row, c.wall.Round(10*time.Millisecond))
	}
	fmt.Fprintln(&s.b)
	for _, c := range rs {
		if c.v == rs[0].v {
			fmt.Fprintf(&s.b, "- %s: %s\n", c.p.label(), c.p.note)
		}
	}
	fmt.Fprintln(&s.b)
	// The chart shows store load per success against the reference
	// (reference / peer: longer is fewer requests).
	ref := rs[0]
	for _, c := range rs {
		if c.p.ref {
			ref = c
			continue
		}
		if c.v != ref.v {
			continue
		}
		a, b := per(ref.c.rt, ref.successes), per(c.c.rt, c.successes)
		r.bars = append(r.bars, bar{group: "contended, " + c.v.name + ": reference's requests per success / peer's", label: store + ": " + c.p.label() + " / " + ref.p.name, ratio: a / b})
	}
}

// handoff adds the handoff table of one store.
func (r *report) handoff(store string, rs []*handoffResult) {
	r.hand[store] = rs
	s := r.section("handoff", fmt.Sprintf("Handoff: %s", store))
	fmt.Fprintf(&s.b, "A holder releases at t0 while a waiter (another instance) blocks in its lock call; t1 is when the waiter's call returns holding the lock. The release comes %v plus a random [0, %v) after the waiter has made its first attempt (for etcd and ZooKeeper: once its key is queued), so that it falls at any phase of a retry timer. Up to %d repetitions per peer over %d alternating rounds, at most %v per peer.\n\n",
		r.cfg.settle, r.cfg.jitter, r.cfg.handoffs, r.cfg.rounds, r.cfg.handoffBudget)
	ref := rs[0]
	fmt.Fprintf(&s.b, "| peer | n | p50 ms | p99 ms | p50 vs %s |\n|---|---:|---:|---:|---:|\n", ref.p.name)
	for _, h := range rs {
		p50 := ms(quantile(h.lat, 0.5))
		row := fmt.Sprintf("| %s | %d | %s | %s | %s |", h.p.name, len(h.lat), f2(p50), f2(ms(quantile(h.lat, 0.99))), f2(p50/ms(quantile(ref.lat, 0.5))))
		if h.err != nil {
			row += " error: " + oneLine(h.err.Error()) + " |"
		}
		fmt.Fprintln(&s.b, row)
		if h != ref && len(h.lat) > 0 && len(ref.lat) > 0 {
			r.bars = append(r.bars, bar{group: "handoff: reference's p50 / peer's p50", label: store + ": " + h.p.name + " / " + ref.p.name, ratio: ms(quantile(ref.lat, 0.5)) / p50})
		}
	}
	fmt.Fprintln(&s.b)
}

// election adds the election handoff table of one store: resign to the
// waiting candidate's election, against the store's native election or
// hand-rolled loop where there is one.
func (r *report) election(store string, rs []*handoffResult) {
	s := r.section(wlElection, fmt.Sprintf("Election handoff: %s", store))
	fmt.Fprintf(&s.b, "A leader resigns at t0 while a candidate (another instance) blocks in its campaign; t1 is when the candidate's campaign returns elected. The resignation comes %v plus a random [0, %v) after the candidate has made its first attempt (for etcd and ZooKeeper: once its key is queued). Up to %d repetitions per peer over %d alternating rounds, at most %v per peer. distlock's campaign is its mutex's acquisition (see the handoff table above).\n\n",
		r.cfg.settle, r.cfg.jitter, r.cfg.handoffs, r.cfg.rounds, r.cfg.handoffBudget)
	ref := rs[0]
	for _, h := range rs {
		if h.p.name != "distlock" {
			ref = h
			break
		}
	}
	for _, h := range r.hand[store] {
		if h.p.name == "distlock" && len(h.lat) > 0 {
			fmt.Fprintf(&s.b, "The same run's mutex handoff (the Handoff table): distlock p50 %s ms, p99 %s ms.\n\n", f2(ms(quantile(h.lat, 0.5))), f2(ms(quantile(h.lat, 0.99))))
		}
	}
	fmt.Fprintf(&s.b, "| peer | n | p50 ms | p99 ms | p50 vs %s |\n|---|---:|---:|---:|---:|\n", ref.p.name)
	for _, h := range rs {
		p50 := ms(quantile(h.lat, 0.5))
		row := fmt.Sprintf("| %s | %d | %s | %s | %s |", h.p.name, len(h.lat), f2(p50), f2(ms(quantile(h.lat, 0.99))), f2(p50/ms(quantile(ref.lat, 0.5))))
		if h.err != nil {
			row += " error: " + oneLine(h.err.Error()) + " |"
		}
		fmt.Fprintln(&s.b, row)
		if h != ref && len(h.lat) > 0 && len(ref.lat) > 0 {
			r.bars = append(r.bars, bar{group: "election handoff: reference's p50 / peer's p50", label: store + ": " + h.p.name + " / " + ref.p.name, ratio: ms(quantile(ref.lat, 0.5)) / p50})
		}
	}
	fmt.Fprintln(&s.b)
}

// held adds the "many locks held" table of one store, with the scale
// targets for it.
func (r *report) held(store string, rs []heldResult) {
	if len(rs) == 0 {
		return
	}
	s := r.section("scale", fmt.Sprintf("Scale: %s, %d locks held at once by one process", store, r.cfg.scaleLocks))
	interval := r.cfg.scaleTTL / 3
	fmt.Fprintf(&s.b, "One instance acquires %d distinct keys (%d goroutines), holds them all for %v while the requests to the store are counted, then releases them. Peers that keep locks alive do so with TTL %v (distlock's WithAutoRenew: a renewal every TTL/3 = %v); the others get a TTL that outlasts the hold. Heap: live heap after GC, less the heap before, per lock, with the library's handle of each lock (kept by the benchmark as a caller would). Requests while held: %s Per 500 per renewal: requests while held, per %v, per 500 locks (target: at most 1 on Redis and SQL). Lost: locks found gone at release.",
		r.cfg.scaleLocks, scaleHoldWorkers, r.cfg.scaleWindow, r.cfg.scaleTTL, interval, countNote[store], interval)
	if r.cfg.scaleRounds > 1 {
		fmt.Fprintf(&s.b, " %d rounds, the peers' order alternating round by round; each row is the peer's round of median acquire time, and \"vs\" the median over rounds of its acquire time over the reference's in the same round, with the rounds' range.", r.cfg.scaleRounds)
	}
	fmt.Fprintf(&s.b, "\n\n")
	ref := rs[0]
	for _, h := range rs {
		if h.p.name == nativePeer[store] {
			ref = h
		}
	}
	fmt.Fprintf(&s.b, "| peer | acquire all | vs %s | locks/s | heap B/lock | requests/s while held | per 500 per renewal | second count/s | how locks stay alive | lost | release all |\n|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|\n", ref.p.name)
	for _, h := range rs {
		renewal := h.p.renewal
		if renewal == "" {
			renewal = "none: each lock lives its TTL"
		}
		x500 := "-"
		if h.p.renewal != "" {
			x500 = f2(requestsPer500(h, interval))
		}
		vs := f2(acquireRatio(h, ref))
		if len(h.ratios) > 0 {
			vs += " (" + spread(h.ratios) + ")"
		}
		row := fmt.Sprintf("| %s | %v | %s | %s | %s | %s | %s | %s | %s | %d | %v |", h.p.name, h.acquire.Round(10*time.Millisecond),
			vs, f0(float64(h.n)/h.acquire.Seconds()),
			f0(h.bytesPerLock), f1(h.perSec(h.requests)), x500, f1(h.perSec(h.other)), renewal, h.lost, h.release.Round(10*time.Millisecond))
		if h.err != nil {
			row += " error: " + oneLine(h.err.Error()) + " |"
		}
		fmt.Fprintln(&s.b, row)
	}
	if ts := heldTargets(r.cfg, store, rs); len(ts) > 0 {
		fmt.Fprintf(&s.b, "\nThe scale targets, distlock in this run:\n\n")
		for _, t := range ts {
			mark := ""
			switch {
			case !t.known:
			case t.ok:
				mark = " ✓"
			default:
				mark = " ✗"
			}
			fmt.Fprintf(&s.b, "- %s: %s%s\n", t.what, t.got, mark)
		}
	}
	fmt.Fprintln(&s.b)
}

// countNote says, per store, how the scale workload counts the requests
// to the store while the locks are held, and what the server count is.
var countNote = map[string]string{
	"memory":    "calls into the store (a batch renewal is one), counted in process; second count: the same.",
	"redis":     "commands and pipelines the clients sent (a go-redis hook: the server cannot tell requests from the commands run inside scripts); second count: the server's, calls in INFO commandstats, the commands inside scripts included.",
	"etcd":      "gRPC messages the server received (grpc_server_msg_received_total on /metrics: unary calls, and watch and lease keep-alive stream messages); second count: the same.",
	"zookeeper": "packets the server received (zk_packets_received in mntr, session pings included); second count: the same.",
	"postgres":  "statements the server executed (pg_stat_statements, which the bench enables on the server it starts; on another server, the statements the clients sent); second count: the statements the clients sent (a pgx tracer).",
}

// hotKey adds the "many goroutines on one key" table of one store.
func (r *report) hotKey(store string, rs []contendedResult) {
	s := r.section("scale", fmt.Sprintf("Scale: %s, %d goroutines on one key", store, r.cfg.scaleGoroutines))
	if len(rs) == 0 {
		fmt.Fprintf(&s.b, "Not run: no hotspot variant of distlock on this store in this build.\n\n")
		return
	}
	fmt.Fprintf(&s.b, "%d goroutines spread over %d instances, each locking the key once (wait 60s, hold 1ms). With the hotspot handler only one goroutine per instance reaches the store at a time, so requests per success stay near the number of instances.\n\n",
		r.cfg.scaleGoroutines, r.cfg.instances)
	fmt.Fprintf(&s.b, "| peer | successes | timeouts | errors | overlaps | round trips/success | server cmds/success | wall |\n|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, c := range rs {
		errs := fmt.Sprint(c.failures)
		if c.err != nil {
			errs += " (" + oneLine(c.err.Error()) + ")"
		}
		fmt.Fprintf(&s.b, "| %s | %d/%d | %d | %s | %d | %s | %s | %v |\n", c.p.label(), c.successes, c.attempts, c.timeouts, errs, c.overlaps,
			f2(per(c.c.rt, c.successes)), f2(per(c.c.cmds, c.successes)), c.wall.Round(10*time.Millisecond))
	}
	fmt.Fprintln(&s.b)
}
