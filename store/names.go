package store

import (
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MaxNameBytes bounds the length of a bin or parameter name, in bytes.
const MaxNameBytes = 255

// CheckName returns nil if name can name a bin or a parameter set, and an
// error matching ErrName that says why not otherwise. A name is 1 to
// MaxNameBytes bytes of UTF-8 without '/', '\', NUL or other control
// characters, and is not "." or "..". Names are never used as paths (values
// are stored under numbers), but the rules keep them printable and leave
// '/' free for prefixes to mean something one day.
func CheckName(name string) error {
	switch {
	case name == "":
		return errorf(ErrName, "a name is empty")
	case len(name) > MaxNameBytes:
		return errorf(ErrName, "a name of %d bytes (%s...); at most %d", len(name), quoteShort(name), MaxNameBytes)
	case !utf8.ValidString(name):
		return errorf(ErrName, "%s is not UTF-8", quoteShort(name))
	case name == "." || name == "..":
		return errorf(ErrName, "%q is not a name", name)
	}
	for i, r := range name {
		switch {
		case r == '/' || r == '\\':
			return errorf(ErrName, "%s holds %q at byte %d", quoteShort(name), r, i)
		case r == 0 || unicode.IsControl(r):
			return errorf(ErrName, "%s holds the control character %U at byte %d", quoteShort(name), r, i)
		}
	}
	return nil
}

// quoteShort quotes s, cut to 40 bytes, for an error message.
func quoteShort(s string) string {
	if len(s) > 40 {
		cut := 40
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		return strconv.Quote(s[:cut]) + "..."
	}
	return strconv.Quote(s)
}

// checkPrefix checks a watch prefix: "" (everything) or the beginning of a
// name, by the same rules as a name except that it may be empty.
func checkPrefix(p string) error {
	if p == "" {
		return nil
	}
	if err := CheckName(p); err != nil && !(p == "." || p == "..") {
		return err
	}
	return nil
}

// hasPrefix reports whether name matches the watch prefix p.
func hasPrefix(name, p string) bool { return strings.HasPrefix(name, p) }
