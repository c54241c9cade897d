package zookeeper

import (
	"fmt"
	"strings"
)

// MaxKeyLen is the longest key, in bytes, that a [Resource] accepts. An
// encoded key is at most three times as long (12 KiB), which keeps every
// request and every watch re-registration far below ZooKeeper's default
// jute.maxbuffer of 1 MiB.
const MaxKeyLen = 4096

const hexDigits = "0123456789ABCDEF"

// keySafe reports whether c stands for itself in an encoded key. Everything
// else, '%' included, is written as %XX.
func keySafe(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("-_.:@=+,~", c) >= 0
}

// encodeKey maps key to one legal znode name. The mapping is injective:
// '%' is always escaped, so every name decodes back to exactly one key.
// The names "." and "..", illegal in ZooKeeper, get their first dot escaped.
func encodeKey(key string) string {
	if encodedKeyLen(key) == len(key) {
		return key
	}
	var b strings.Builder
	writeEncodedKey(&b, key)
	return b.String()
}

// escaped reports whether byte i of key is escaped in its name.
func escaped(key string, i int) bool {
	return !keySafe(key[i]) || i == 0 && (key == "." || key == "..")
}

// encodedKeyLen is len(encodeKey(key)), with no allocation.
func encodedKeyLen(key string) int {
	n := len(key)
	for i := 0; i < len(key); i++ {
		if escaped(key, i) {
			n += 2
		}
	}
	return n
}

// writeEncodedKey writes encodeKey(key) to b.
func writeEncodedKey(b *strings.Builder, key string) {
	b.Grow(encodedKeyLen(key))
	for i := 0; i < len(key); i++ {
		c := key[i]
		if !escaped(key, i) {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hexDigits[c>>4])
		b.WriteByte(hexDigits[c&15])
	}
}

// cutEncodedKey returns what follows encodeKey(key) in s, and whether s
// starts with it, with no allocation.
func cutEncodedKey(s, key string) (string, bool) {
	dots := key == "." || key == ".."
	for i := 0; i < len(key); i++ {
		c := key[i]
		if keySafe(c) && (i > 0 || !dots) {
			if s == "" || s[0] != c {
				return "", false
			}
			s = s[1:]
			continue
		}
		if len(s) < 3 || s[0] != '%' || s[1] != hexDigits[c>>4] || s[2] != hexDigits[c&15] {
			return "", false
		}
		s = s[3:]
	}
	return s, true
}

// validName reports why name is not a legal znode name (one path segment),
// following org.apache.zookeeper.common.PathUtils.
func validName(name string) error {
	if name == "" || name == "." || name == ".." {
		return fmt.Errorf("%q is not a legal znode name", name)
	}
	for _, r := range name {
		switch {
		case r == '/', r == 0,
			r > 0 && r < 0x20, r >= 0x7f && r <= 0x9f,
			r >= 0xd800 && r <= 0xf8ff, r >= 0xfff0 && r <= 0xffff,
			r == 0xfffd: // also what invalid UTF-8 decodes to
			return fmt.Errorf("znode name %q has the illegal character %U", name, r)
		}
	}
	return nil
}

// validRoot checks the root option: an absolute path of legal names, not
// "/" itself and not under the server's reserved /zookeeper.
func validRoot(root string) error {
	if root == "" || root[0] != '/' || root == "/" {
		return fmt.Errorf("root %q must be an absolute path below /", root)
	}
	segs := strings.Split(root[1:], "/")
	if segs[0] == "zookeeper" {
		return fmt.Errorf("root %q is under the server's reserved /zookeeper", root)
	}
	for _, s := range segs {
		if err := validName(s); err != nil {
			return fmt.Errorf("root %q: %w", root, err)
		}
	}
	return nil
}
