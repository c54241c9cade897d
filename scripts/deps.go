//go:build ignore

// deps.go measures what an application gets from distlock's modules: for
// each store, a fresh application that imports only the facade and that
// store, its build list (go list -m all) and its go.sum, as if the
// modules were published as they are in this working tree.
//
//	go run scripts/deps.go            # the table for the README
//	go run scripts/deps.go -v         # and each build list
//	go run scripts/deps.go -check     # and fail past the budget (make test)
//	go run scripts/deps.go -keep      # and keep the applications to look at
//	go run scripts/deps.go -warm      # and fill the module cache for offline runs
//
// The budget: an application using only the root module (facade, memory
// store, hotspot, accesslog) has no module but distlock in its build list;
// one using the Redis store has at most 20 modules and 45 lines of go.sum.
//
// How: every library module of the workspace is packed as a module zip
// into a temporary file proxy, at the placeholder version the modules
// require each other at (v0.0.0-00010101000000-000000000000); third-party
// modules come from the local module cache, served as a second file proxy,
// and the GOPROXY in effect is asked only for what the cache lacks (with
// GOPROXY=off, nothing is fetched). Each application runs go mod
// tidy with GOWORK=off, GOFLAGS=-mod=mod and a temporary GOMODCACHE, so
// neither the workspace nor the local module cache stands in for what a
// user would download, and the cache is left untouched. The checksum
// database is off: the packed modules are in none.
package main

import (
	"archive/zip"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
)

const version = "v0.0.0-00010101000000-000000000000"

// apps are the applications measured: a name and the packages imported.
var apps = []struct {
	name    string
	imports []string
	// maxMods and maxSum are the budget -check enforces; 0: none.
	maxMods, maxSum int
}{
	{"root only (memory, hotspot, accesslog)", []string{"", "/backend/memory", "/hotspot", "/accesslog"}, 2, 2},
	{"redis", []string{"", "/redis"}, 20, 45},
	{"redlock", []string{"", "/redlock"}, 0, 0},
	{"etcd", []string{"", "/etcd"}, 0, 0},
	{"zookeeper", []string{"", "/zookeeper"}, 0, 0},
	{"sqldb (PostgreSQL and MySQL)", []string{"", "/sqldb"}, 0, 0},
	{"metrics", []string{"", "/metrics"}, 0, 0},
	{"tracing", []string{"", "/tracing"}, 0, 0},
	{"gocron", []string{"", "/gocron"}, 0, 0},
}

const root = "github.com/distlock/distlock"

// published are the modules a user can depend on (testsuite and
// internal/testserver: the stores' tests use them); the others (examples,
// safety, bench) are never required by them and not packed.
var published = []string{"", "/testsuite", "/internal/testserver", "/internal/redisscript",
	"/redis", "/redlock", "/etcd", "/zookeeper", "/sqldb", "/metrics", "/tracing", "/gocron"}

func main() {
	verbose := flag.Bool("v", false, "print each application's build list")
	check := flag.Bool("check", false, "fail if an application's build list or go.sum exceeds its budget")
	keep := flag.Bool("keep", false, "keep the applications and the proxy in a temp dir, and print its name")
	warm := flag.Bool("warm", false, "download the applications' third-party modules into the local module cache")
	flag.Parse()
	if err := run(*verbose, *check, *keep, *warm); err != nil {
		fmt.Fprintf(os.Stderr, "deps: %v\n", err)
		os.Exit(1)
	}
}

func run(verbose, check, keep, warm bool) error {
	repo, err := goOut("", nil, "list", "-m", "-f", "{{.Dir}}", root)
	if err != nil {
		return err
	}
	realCache, err := goOut("", nil, "env", "GOMODCACHE")
	if err != nil {
		return err
	}
	upstream, err := goOut("", nil, "env", "GOPROXY")
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "distlock-deps-")
	if err != nil {
		return err
	}
	cache := filepath.Join(tmp, "modcache")
	if keep {
		fmt.Fprintf(os.Stderr, "deps: applications in %s/app*\n", tmp)
	}
	defer func() {
		if keep {
			return
		}
		// The module cache is read-only; go clean knows how to remove it.
		// GOMODCACHE points at the temporary one, never the user's.
		cmd := exec.Command("go", "clean", "-modcache")
		cmd.Env = append(os.Environ(), "GOMODCACHE="+cache)
		_ = cmd.Run()
		os.RemoveAll(tmp)
	}()
	proxy := filepath.Join(tmp, "proxy")
	for _, m := range published {
		if err := pack(proxy, root+m, filepath.Join(repo, filepath.FromSlash(strings.TrimPrefix(m, "/")))); err != nil {
			return err
		}
	}
	env := []string{
		"GOWORK=off",
		"GOFLAGS=-mod=mod",
		"GOMODCACHE=" + cache,
		"GOPROXY=file://" + proxy + ",file://" + filepath.Join(realCache, "cache", "download") + "," + upstream,
		"GOSUMDB=off",
		"GONOSUMDB=", "GOPRIVATE=", "GONOPROXY=",
	}
	fmt.Println("| application imports | modules in build list | lines of go.sum |")
	fmt.Println("|---|---:|---:|")
	var lists, over []string
	for i, a := range apps {
		dir := filepath.Join(tmp, fmt.Sprintf("app%d", i))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		var src bytes.Buffer
		src.WriteString("package main\n\nimport (\n")
		for _, p := range a.imports {
			fmt.Fprintf(&src, "\t_ %q\n", root+p)
		}
		src.WriteString(")\n\nfunc main() {}\n")
		if err := os.WriteFile(filepath.Join(dir, "main.go"), src.Bytes(), 0o644); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module example.com/app\n\ngo 1.26.0\n"), 0o644); err != nil {
			return err
		}
		// The application asks for the packed version of what it imports.
		req := []string{"mod", "edit"}
		seen := map[string]bool{}
		for _, p := range a.imports {
			mod := moduleOf(p)
			if !seen[mod] {
				seen[mod] = true
				req = append(req, "-require="+mod+"@"+version)
			}
		}
		if _, err := goOut(dir, env, req...); err != nil {
			return err
		}
		if _, err := goOut(dir, env, "mod", "tidy"); err != nil {
			return err
		}
		// Loading every package checks the packed zips hold them.
		if _, err := goOut(dir, env, "list", "-deps", "./..."); err != nil {
			return err
		}
		all, err := goOut(dir, env, "list", "-m", "all")
		if err != nil {
			return err
		}
		sum, err := os.ReadFile(filepath.Join(dir, "go.sum"))
		if err != nil && !os.IsNotExist(err) {
			return err
		}
		if warm {
			if err := warmCache(dir, repo); err != nil {
				return err
			}
		}
		mods := strings.Split(all, "\n")
		sumLines := bytes.Count(sum, []byte("\n"))
		fmt.Printf("| %s | %d | %d |\n", a.name, len(mods), sumLines)
		if a.maxMods > 0 && (len(mods) > a.maxMods || sumLines > a.maxSum) {
			over = append(over, fmt.Sprintf("%s: %d modules and %d lines of go.sum; the budget is %d and %d",
				a.name, len(mods), sumLines, a.maxMods, a.maxSum))
		}
		if verbose {
			lists = append(lists, fmt.Sprintf("%s:\n\t%s", a.name, strings.Join(mods[1:], "\n\t")))
		}
	}
	for _, l := range lists {
		fmt.Printf("\n%s\n", l)
	}
	if check && len(over) > 0 {
		return fmt.Errorf("over budget:\n\t%s", strings.Join(over, "\n\t"))
	}
	return nil
}

// warmCache downloads what the application in dir needs from outside
// distlock into the local module cache, through the GOPROXY in effect:
// what go mod tidy reads (the dependencies' tests included), go mod
// download fetches and go list -m all lists, for a copy of its go.mod
// whose replaces point distlock's modules at repo.
func warmCache(dir, repo string) error {
	for _, f := range []string{"go.mod", "go.sum"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil && !os.IsNotExist(err) {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, "warm."+strings.TrimPrefix(f, "go.")), b, 0o644); err != nil {
			return err
		}
	}
	env := []string{"GOWORK=off", "GOFLAGS=-mod=mod"}
	edit := []string{"mod", "edit", "-modfile=warm.mod"}
	for _, m := range published {
		edit = append(edit, "-replace="+root+m+"="+filepath.Join(repo, filepath.FromSlash(strings.TrimPrefix(m, "/"))))
	}
	for _, args := range [][]string{edit, {"mod", "tidy", "-modfile=warm.mod"}, {"mod", "download", "-modfile=warm.mod"}, {"list", "-modfile=warm.mod", "-m", "all"}} {
		if _, err := goOut(dir, env, args...); err != nil {
			return err
		}
	}
	return nil
}

// moduleOf returns the module that holds the package root+p.
func moduleOf(p string) string {
	best := ""
	for _, m := range published {
		if (p == m || strings.HasPrefix(p, m+"/")) && len(m) >= len(best) {
			best = m
		}
	}
	return root + best
}

// pack writes module path's dir into the file proxy at version, as the go
// command would download it: the .info, the go.mod and a zip of the files
// under dir, without nested modules, VCS directories and build outputs
// that .gitignore names (untracked files are left out with them).
func pack(proxy, path, dir string) error {
	files, err := moduleFiles(dir)
	if err != nil {
		return err
	}
	at := filepath.Join(proxy, filepath.FromSlash(path), "@v")
	if err := os.MkdirAll(at, 0o755); err != nil {
		return err
	}
	info, _ := json.Marshal(map[string]string{"Version": version, "Time": "0001-01-01T00:00:00Z"})
	if err := os.WriteFile(filepath.Join(at, version+".info"), info, 0o644); err != nil {
		return err
	}
	mod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(at, version+".mod"), mod, 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(at, "list"), nil, 0o644); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(at, version+".zip"))
	if err != nil {
		return err
	}
	defer f.Close()
	zw := zip.NewWriter(f)
	for _, rel := range files {
		w, err := zw.Create(path + "@" + version + "/" + rel)
		if err != nil {
			return err
		}
		r, err := os.Open(filepath.Join(dir, filepath.FromSlash(rel)))
		if err != nil {
			return err
		}
		_, err = io.Copy(w, r)
		r.Close()
		if err != nil {
			return err
		}
	}
	if err := zw.Close(); err != nil {
		return err
	}
	return f.Close()
}

// moduleFiles lists the files of the module rooted at dir, slash-separated
// and relative to it: git's tracked and untracked-but-not-ignored files,
// outside nested modules.
func moduleFiles(dir string) ([]string, error) {
	cmd := exec.Command("git", "ls-files", "--cached", "--others", "--exclude-standard", "-z", ".")
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("git ls-files in %s: %w", dir, err)
	}
	var files []string
	nested := map[string]bool{}
	for _, rel := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		if rel == "" {
			continue
		}
		fi, err := os.Lstat(filepath.Join(dir, rel))
		if err != nil {
			if os.IsNotExist(err) {
				continue // deleted in the working tree
			}
			return nil, err
		}
		if !fi.Mode().IsRegular() || inNested(dir, rel, nested) {
			continue
		}
		files = append(files, rel)
	}
	sort.Strings(files)
	return files, nil
}

// inNested reports whether rel lies under a directory below dir that holds
// a go.mod of its own.
func inNested(dir, rel string, memo map[string]bool) bool {
	for d := filepath.Dir(rel); d != "."; d = filepath.Dir(d) {
		v, ok := memo[d]
		if !ok {
			_, err := os.Stat(filepath.Join(dir, d, "go.mod"))
			v = err == nil
			memo[d] = v
		}
		if v {
			return true
		}
	}
	return false
}

// goOut runs the go command in dir with extra environment and returns its
// trimmed standard output.
func goOut(dir string, env []string, args ...string) (string, error) {
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go %s in %s: %v\n%s", strings.Join(args, " "), dir, err, stderr.Bytes())
	}
	return strings.TrimSpace(string(out)), nil
}
