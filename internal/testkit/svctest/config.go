package svctest

import (
	"errors"
	"strings"
	"testing"
)

// WantConfigError reports through t a config's answer to a test case
// (Validate's, or Set's) that is not what the case wants: no error when
// want is "", else one matching class (the package's ErrConfig) that
// begins with prefix ("capacity=0: " for Set, naming the key and the
// value) and says want. It reports whether the answer was as wanted.
func WantConfigError(t testing.TB, what string, err error, want, prefix string, class error) bool {
	t.Helper()
	switch {
	case want == "" && err != nil:
		t.Errorf("%s: %v", what, err)
	case want != "" && (err == nil || !strings.HasPrefix(err.Error(), prefix) || !strings.Contains(err.Error(), want) || !errors.Is(err, class)):
		t.Errorf("%s: %v; want an error matching %v that begins %q and says %q", what, err, class, prefix, want)
	default:
		return true
	}
	return false
}
