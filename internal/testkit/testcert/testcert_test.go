package testcert

import (
	"crypto/tls"
	"crypto/x509"
	"testing"
)

func TestNew(t *testing.T) {
	cert, pool := New(t)
	_, other := New(t)
	opts := func(p *x509.CertPool, name string) x509.VerifyOptions {
		return x509.VerifyOptions{Roots: p, DNSName: name}
	}
	for _, name := range []string{"127.0.0.1", "localhost"} {
		if _, err := cert.Leaf.Verify(opts(pool, name)); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := cert.Leaf.Verify(opts(pool, "example.com")); err == nil {
		t.Error("verified for example.com")
	}
	if _, err := cert.Leaf.Verify(opts(other, "127.0.0.1")); err == nil {
		t.Error("another call's pool trusts the certificate")
	}

	certFile, keyFile := WriteFiles(t, cert, t.TempDir())
	loaded, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := loaded.Leaf.Verify(opts(pool, "127.0.0.1")); err != nil {
		t.Errorf("the written certificate: %v", err)
	}
}
