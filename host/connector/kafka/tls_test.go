package kafka

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
)

// TestTLS: a TLS-only broker is reached with tls.ca_file naming its CA; without the CA the
// handshake fails and Check says so instead of hanging.
func TestTLS(t *testing.T) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kfake"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	c := newCluster(t, kfake.SeedTopics(1, "t"), kfake.TLS(&tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}))
	c.RequestTimeout = Duration(2 * time.Second)
	good := c
	good.TLS = &TLSConfig{Enabled: true, CAFile: ca}
	if err := Check(context.Background(), good, "t"); err != nil {
		t.Fatalf("with the CA: %v", err)
	}
	bad := c
	bad.TLS = &TLSConfig{Enabled: true}
	if err := Check(context.Background(), bad, "t"); !errors.Is(err, ErrAuthentication) || IsRetryable(err) {
		t.Fatalf("unknown CA: %v, want a permanent ErrAuthentication", err)
	}
	plain := c
	plain.TLS = nil
	if err := Check(context.Background(), plain, "t"); err == nil {
		t.Fatal("plaintext to a TLS broker succeeded")
	}
	missing := c
	missing.TLS = &TLSConfig{Enabled: true, CAFile: filepath.Join(t.TempDir(), "none.pem")}
	if err := Check(context.Background(), missing, "t"); err == nil {
		t.Fatal("a missing CA file was accepted")
	}
}
