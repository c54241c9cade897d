package etcd

import "strings"

// encodeKey maps a user key to one path segment: bytes outside
// [A-Za-z0-9-._~] become %XX (upper-case hex), like a URL path segment. The
// result never contains '/', and the mapping is invertible, so the prefix
// encodeKey(k)+"/" of one key is never a prefix of another key's: "a" and
// "a/" get "a/" and "a%2F/", a NUL byte becomes %00.
func encodeKey(key string) string {
	n := 0
	for i := 0; i < len(key); i++ {
		if !unreserved(key[i]) {
			n++
		}
	}
	if n == 0 {
		return key
	}
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	b.Grow(len(key) + 2*n)
	for i := 0; i < len(key); i++ {
		c := key[i]
		if unreserved(c) {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hex[c>>4])
		b.WriteByte(hex[c&15])
	}
	return b.String()
}

func unreserved(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
		c == '-' || c == '.' || c == '_' || c == '~'
}
